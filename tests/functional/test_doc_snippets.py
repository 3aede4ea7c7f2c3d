"""Every Python snippet of README.md and docs/*.md runs, as written (issue 14, point 5).

The fenced ``python`` blocks of one document run in order in one fresh
interpreter, in an empty temporary directory, like cells of a notebook: a later
block may use names an earlier one defined. Absolute example paths
(``/tmp/...``, ``/data/...``) are moved into the temporary directory, and the
emulator's default address into a real emulator when a block asks for one.

A comment on the line before a fence says how to run the block:

- ``<!-- snippet: skip (why) -->``: not run; only for what this machine cannot
  give (an Azure namespace).
- ``<!-- snippet: emulator -->``: runs with ``sendonce emulator`` serving
  ``broker.db`` of the directory at the address the docs use.
- ``<!-- snippet: spark -->``: needs a local Spark session (run under the Spark lock,
  with ``spark`` and a small ``orders_df``/``df`` defined first).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
_MARK = re.compile(r"<!--\s*snippet:\s*(?P<kind>[a-z]+)\s*(?P<why>.*?)\s*-->\s*$")


class Snippet:
    def __init__(self, doc: Path, line: int, code: str, mark: str | None, why: str) -> None:
        self.doc, self.line, self.code, self.mark, self.why = doc, line, code, mark, why


def snippets(doc: Path) -> list[Snippet]:
    text = doc.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        code = textwrap.dedent(match.group("code"))
        found.append(
            Snippet(
                doc,
                line,
                code,
                mark.group("kind") if mark else None,
                mark.group("why") if mark else "",
            )
        )
    return found


_RUNNER = r"""
import asyncio, ast, json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for line, code in blocks:
    try:
        compiled = compile(code, f"{sys.argv[1]}:{line}", "exec")
        exec(compiled, namespace)
    except BaseException:
        traceback.print_exc()
        print(f"SNIPPET FAILED: {sys.argv[1]} block at line {line}", file=sys.stderr)
        sys.exit(1)
"""

_SPARK_PRELUDE = """
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("doc-snippets")
         .config("spark.ui.enabled", "false").getOrCreate())
orders_df = df = spark.createDataFrame(
    [(12345, 2017, "c-42"), (12346, 2017, "c-7")], "order_id long, year int, customer string"
)
"""


def _prepare(code: str, workdir: Path, port: int | None) -> str:
    code = code.replace("/tmp/", f"{workdir}/").replace("/data/", f"{workdir}/")
    if port is not None:
        code = code.replace("127.0.0.1:5672", f"127.0.0.1:{port}")
    return code


def _run(doc: Path, blocks: list[Snippet], workdir: Path, port: int | None) -> None:
    import json

    payload = [(b.line, _prepare(b.code, workdir, port)) for b in blocks]
    if any(b.mark == "spark" for b in blocks):
        payload.insert(0, (0, _SPARK_PRELUDE))
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(doc.relative_to(ROOT))],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=workdir,
        timeout=600,
        env={
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        },
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


CASES = [
    pytest.param(
        doc,
        id=str(doc.relative_to(ROOT)),
        marks=[pytest.mark.spark] if any(s.mark == "spark" for s in snippets(doc)) else [],
    )
    for doc in DOCS
    if snippets(doc)
]


@pytest.mark.parametrize("doc", CASES)
def test_every_snippet_of_the_document_runs(doc: Path, tmp_path: Path) -> None:
    blocks = [s for s in snippets(doc) if s.mark != "skip"]
    for skipped in (s for s in snippets(doc) if s.mark == "skip"):
        assert skipped.why, f"{doc.name}:{skipped.line}: a skipped snippet must say why"
    if not blocks:
        pytest.skip("every snippet needs what this machine cannot give")
    if any(b.mark == "emulator" for b in blocks):
        pytest.importorskip("proton")
        from sendonce.emulator import Emulator

        with Emulator(tmp_path / "broker.db", port=0) as emulator:
            _run(doc, blocks, tmp_path, emulator.port)
    else:
        _run(doc, blocks, tmp_path, None)


def test_the_snippet_finder_sees_the_documents() -> None:
    counted = {doc.name: len(snippets(doc)) for doc in DOCS}
    assert counted["README.md"] >= 3 and sum(counted.values()) >= 15
