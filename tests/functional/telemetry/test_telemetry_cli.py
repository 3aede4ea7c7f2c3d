"""The ``sendonce`` command's OpenTelemetry set-up from the standard variables alone (no
``--otel``), and its root span: one trace per command, every chunk of ``publish`` in it.

Each run is a real ``sendonce`` process (a global OpenTelemetry provider cannot be unset,
so never in the test process); the console exporters print on its stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sendonce import EntityProfile
from sendonce.backends import LocalBackend

OTLP_HTTP = "opentelemetry.exporter.otlp.proto.http"


def sendonce(
    *args: str, cwd: Path, env: dict[str, str] | None = None, blocked: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the command; ``blocked`` names a module made impossible to import (not installed)."""
    prelude = f"import sys; sys.modules[{blocked!r}] = None; " if blocked else ""
    code = prelude + "from sendonce.cli import main; main()"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def printed(text: str) -> list[dict[str, Any]]:
    """Every JSON object the console exporters printed, in order."""
    decoder, objects = json.JSONDecoder(), []
    index = text.find("{")
    while index != -1:
        value, end = decoder.raw_decode(text, index)
        objects.append(value)
        index = text.find("{", end)
    return objects


def spans_of(text: str) -> list[dict[str, Any]]:
    return [o for o in printed(text) if "context" in o and "kind" in o]


def metrics_of(text: str) -> list[str]:
    return [
        m["name"]
        for o in printed(text)
        for rm in o.get("resource_metrics", ())
        for sm in rm["scope_metrics"]
        for m in sm["metrics"]
    ]


@pytest.fixture
def orders(tmp_path: Path) -> Path:
    with LocalBackend(tmp_path / "broker.db") as broker:
        broker.create_entity(EntityProfile("orders"))
    records = tmp_path / "orders.jsonl"
    records.write_text("".join(json.dumps({"order_id": i}) + "\n" for i in range(5)))
    return tmp_path


PUBLISH = ("publish", "orders.jsonl", "--to", "local:broker.db", "--entity", "orders")
PUBLISH += ("--id", "{order_id}", "--no-progress")


def test_traces_to_the_console_by_variable_alone_need_no_otlp_exporter(orders: Path) -> None:
    # OTEL_METRICS_EXPORTER unset follows the traces: the console too, never an OTLP
    # endpoint nobody named (whose exporter is not even installed here).
    done = sendonce(
        *PUBLISH, cwd=orders, env={"OTEL_TRACES_EXPORTER": "console"}, blocked=OTLP_HTTP
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "5 record(s) to 'orders': sent 5, duplicates 0, failed 0\n"
    assert "send_many orders" in {s["name"] for s in spans_of(done.stderr)}
    assert "sendonce.messages" in metrics_of(done.stderr)
    assert "4318" not in done.stderr and "--otel" not in done.stderr


def test_metrics_turned_off_by_their_variable_leave_the_spans(orders: Path) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}
    done = sendonce(*PUBLISH, cwd=orders, env=env, blocked=OTLP_HTTP)
    assert done.returncode == 0, done.stderr
    assert spans_of(done.stderr) and metrics_of(done.stderr) == []


def test_either_variable_alone_sets_both_and_none_turns_one_off(orders: Path) -> None:
    both = sendonce(*PUBLISH, cwd=orders, env={"OTEL_METRICS_EXPORTER": "console"})
    assert both.returncode == 0, both.stderr
    assert spans_of(both.stderr) and "sendonce.messages" in metrics_of(both.stderr)
    env = {"OTEL_METRICS_EXPORTER": "console", "OTEL_TRACES_EXPORTER": "none"}
    metrics_only = sendonce(*PUBLISH, cwd=orders, env=env)
    assert metrics_only.returncode == 0, metrics_only.stderr
    assert spans_of(metrics_only.stderr) == []
    assert "sendonce.messages" in metrics_of(metrics_only.stderr)


def test_a_missing_exporter_asked_for_by_variable_names_the_variable_not_otel(
    orders: Path,
) -> None:
    done = sendonce(*PUBLISH, cwd=orders, env={"OTEL_TRACES_EXPORTER": "otlp"}, blocked=OTLP_HTTP)
    assert done.returncode == 2
    assert "OTEL_TRACES_EXPORTER=otlp" in done.stderr
    assert "pip install opentelemetry-exporter-otlp-proto-http" in done.stderr
    assert "--otel" not in done.stderr and "Traceback" not in done.stderr
    with LocalBackend(orders / "broker.db") as broker:
        assert broker.count("orders") == 0  # refused before anything was sent


def test_the_sdk_disabled_by_its_variable_sets_nothing_up(orders: Path) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}
    done = sendonce(*PUBLISH, cwd=orders, env=env)
    assert done.returncode == 0, done.stderr
    assert printed(done.stderr) == []


def test_exporters_listed_together_and_none_with_another_is_refused(orders: Path) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console,console", "OTEL_METRICS_EXPORTER": "none"}
    done = sendonce(*PUBLISH, cwd=orders, env=env)
    assert done.returncode == 0, done.stderr
    assert len([s for s in spans_of(done.stderr) if s["name"] == "send_many orders"]) == 1
    refused = sendonce(*PUBLISH, cwd=orders, env={"OTEL_TRACES_EXPORTER": "none,console"})
    assert refused.returncode == 2
    assert "OTEL_TRACES_EXPORTER='none,console'" in refused.stderr


def test_publish_is_one_trace_its_root_the_command_and_every_chunk_under_it(
    orders: Path,
) -> None:
    done = sendonce("--otel", "console", *PUBLISH, "--chunk-size", "2", cwd=orders)
    assert done.returncode == 0, done.stderr
    spans = spans_of(done.stderr)
    [root] = [s for s in spans if s["parent_id"] is None]
    assert root["name"] == "sendonce publish" and root["kind"] == "SpanKind.INTERNAL"
    assert root["attributes"]["process.exit.code"] == 0
    assert root["attributes"]["sendonce.command"] == "publish"
    assert root["status"]["status_code"] == "UNSET"
    calls = [s for s in spans if s["name"] == "send_many orders"]
    assert len(calls) == 3  # 5 records, 2 a chunk
    assert all(c["parent_id"] == root["context"]["span_id"] for c in calls)
    assert {s["context"]["trace_id"] for s in spans} == {root["context"]["trace_id"]}
    # No argument is recorded: a connection string would be one.
    assert "broker.db" not in json.dumps(root)


def test_a_failed_command_is_an_error_root_span_with_its_exit_status(orders: Path) -> None:
    done = sendonce(
        "--otel", "console", "broker", "stats", "broker.db", "--entity", "nope", cwd=orders
    )
    assert done.returncode == 2, done.stderr
    [root] = spans_of(done.stderr)
    assert root["name"] == "sendonce broker stats"
    assert root["attributes"]["process.exit.code"] == 2
    assert root["attributes"]["error.type"] == "2"
    assert root["status"]["status_code"] == "ERROR"
