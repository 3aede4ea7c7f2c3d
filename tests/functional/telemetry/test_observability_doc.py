"""docs/observability.md shows what its first example prints: this runs the example as
written (in a fresh interpreter, its broker file moved to a temporary directory) and
compares what the console exporters printed with the trimmed copies the page shows.

The page's blocks that follow the example are marked ``<!-- printed: spans -->`` and
``<!-- printed: messages -->``; each is the JSON this module's :func:`trim_spans` and
:func:`trim_messages` make of the real output.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "observability.md"
_PYTHON = re.compile(r"^```python\n(?P<code>.*?)^```$", re.M | re.S)


def printed_block(text: str, what: str) -> Any:
    """The JSON block marked ``<!-- printed: what -->`` of the page."""
    match = re.search(
        rf"<!-- printed: {what} [^>]*-->\n```json\n(?P<json>.*?)^```$", text, re.M | re.S
    )
    assert match, f"docs/observability.md has no block marked 'printed: {what}'"
    return json.loads(match.group("json"))


def objects(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON objects printed (pretty, several lines each) and the other lines."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    lines: list[str] = []
    index = 0
    while index < len(text):
        if text.startswith("{\n", index):  # the exporters' pretty JSON starts a line with "{"
            value, index = decoder.raw_decode(text, index)
            found.append(value)
            index = text.find("\n", index) + 1 or len(text)
            continue
        end = text.find("\n", index)
        end = len(text) if end == -1 else end
        lines.append(text[index:end])
        index = end + 1
    return found, lines


def trim_spans(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each span as the page shows it: ids, times, links and resource cut, the parent by
    name."""
    names = {s["context"]["span_id"]: s["name"] for s in spans}
    return [
        {
            "name": s["name"],
            "kind": s["kind"].removeprefix("SpanKind."),
            "parent": names.get(s["parent_id"]) if s["parent_id"] else None,
            "status": s["status"]["status_code"],
            "attributes": s["attributes"],
            "events": [e["name"] for e in s["events"]],
        }
        for s in spans
    ]


def metric_points(exports: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    points: dict[str, list[dict[str, Any]]] = {}
    for export in exports:
        for resource in export["resource_metrics"]:
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    points.setdefault(metric["name"], []).extend(metric["data"]["data_points"])
    return points


def trim_messages(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``sendonce.messages`` points: attributes and value (a cumulative sum)."""
    return sorted(
        ({"attributes": p["attributes"], "value": p["value"]} for p in points),
        key=lambda p: json.dumps(p, sort_keys=True),
    )


def test_the_first_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    code = _PYTHON.search(text)
    assert code is not None
    source = code.group("code").replace("/tmp/observability-demo.db", str(tmp_path / "demo.db"))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", source],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found, lines = objects(done.stdout)
    spans = [o for o in found if "context" in o and "kind" in o]
    exports = [o for o in found if "resource_metrics" in o]
    assert len(spans) + len(exports) == len(found)

    assert trim_spans(spans) == printed_block(text, "spans")
    points = metric_points(exports)
    assert trim_messages(points["sendonce.messages"]) == printed_block(text, "messages")
    assert sorted(points) == printed_block(text, "metrics")

    # The two lines the example prints itself: the report, then the received message's
    # properties, the context of the transfer that carried it.
    report, properties = [line for line in lines if line.strip()]
    assert f"`{report}`" in text
    carried = ast.literal_eval(properties)
    transfer = spans[0]["context"]
    assert carried["traceparent"] == carried["Diagnostic-Id"]
    version, trace_id, span_id, _flags = carried["traceparent"].split("-")
    assert (version, f"0x{trace_id}", f"0x{span_id}") == (
        "00",
        transfer["trace_id"],
        transfer["span_id"],
    )
