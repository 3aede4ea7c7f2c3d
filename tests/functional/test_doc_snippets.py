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
- ``<!-- snippet: artemis -->``: runs against the session's real Artemis broker, its url
  put where the docs write ``amqp://app:secret@127.0.0.1:5672``.
- ``<!-- snippet: postgres -->``: runs against a throwaway PostgreSQL cluster, its url put
  where the docs write ``postgresql://app@localhost/shop``.
- ``<!-- snippet: continues -->`` (or ``<!-- snippet: postgres continues -->``...): the block
  goes on from the one before it (uses its names or its files), as the text around it says.

Every other block also runs **on its own** (issue 34 item 13): in a fresh interpreter and an
empty directory, with only the blocks it says it continues before it, so a reader can copy
any one block and run it.
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
        self.continues = mark == "continues" or (mark != "skip" and why.startswith("continues"))
        if mark == "continues":
            mark = None
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


ARTEMIS_DOC_URL = "amqp://app:secret@127.0.0.1:5672"
POSTGRES_DOC_URL = "postgresql://app@localhost/shop"


def _prepare(
    code: str, workdir: Path, port: int | None, artemis: str | None = None, pg: str | None = None
) -> str:
    code = code.replace("/tmp/", f"{workdir}/").replace("/data/", f"{workdir}/")
    if pg is not None:
        code = code.replace(POSTGRES_DOC_URL, pg).replace(
            POSTGRES_DOC_URL.replace("postgresql://", "postgresql+psycopg://"),
            pg.replace("postgresql://", "postgresql+psycopg://"),
        )
    if artemis is not None:
        code = code.replace(ARTEMIS_DOC_URL, artemis)
    if port is not None:
        code = code.replace("127.0.0.1:5672", f"127.0.0.1:{port}")
    return code


def _reader_environment() -> dict[str, str]:
    """What a reader who followed the docs has: an activated virtual environment (its
    ``bin`` first on ``PATH``, as ``source .venv/bin/activate`` does), and nothing this
    suite would set behind the docs' back (no ``PYSPARK_PYTHON``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = os.path.dirname(venv_bin)
    return env


def _run(
    doc: Path,
    blocks: list[Snippet],
    workdir: Path,
    port: int | None,
    artemis: str | None = None,
    pg: str | None = None,
) -> None:
    import json

    payload = [(b.line, _prepare(b.code, workdir, port, artemis, pg)) for b in blocks]
    if any(b.mark == "spark" for b in blocks):
        payload.insert(0, (0, _SPARK_PRELUDE))
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(doc.relative_to(ROOT))],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=workdir,
        timeout=600,
        env=_reader_environment(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


CASES = [
    pytest.param(
        doc,
        id=str(doc.relative_to(ROOT)),
        marks=[
            getattr(pytest.mark, kind)
            for kind in ("spark", "artemis", "postgres")
            if any(s.mark == kind for s in snippets(doc))
        ]
        # docs/spark.md's snippets start a Spark session and a streaming query in a new
        # process (~35 s); the samples and the Spark suite run the same calls by default.
        + ([pytest.mark.slow] if doc.name == "spark.md" else []),
    )
    for doc in DOCS
    if snippets(doc)
]


@pytest.mark.parametrize("doc", CASES)
def test_every_snippet_of_the_document_runs(
    doc: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    blocks = [s for s in snippets(doc) if s.mark != "skip"]
    for skipped in (s for s in snippets(doc) if s.mark == "skip"):
        assert skipped.why, f"{doc.name}:{skipped.line}: a skipped snippet must say why"
    if not blocks:
        pytest.skip("every snippet needs what this machine cannot give")
    # A Spark block that stands alone (it continues no block and none continues it) runs by
    # itself in test_each_snippet_runs_on_its_own, in a fresh interpreter and directory, as a
    # reader copies it; a second Spark JVM for it here (a minute on a busy machine) would
    # prove nothing more. The page's other blocks run here in order, as before.
    rest = [b for i, b in enumerate(blocks) if not _stands_alone_in_spark(blocks, i)]
    _run_blocks(doc, rest or blocks, tmp_path, request)


def _stands_alone_in_spark(blocks: list[Snippet], index: int) -> bool:
    block, after = blocks[index], blocks[index + 1 : index + 2]
    return block.mark == "spark" and not block.continues and not (after and after[0].continues)


def _run_blocks(
    doc: Path, blocks: list[Snippet], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if any(b.mark == "emulator" for b in blocks):
        pytest.importorskip("proton")
        from sendonce.emulator import Emulator

        with Emulator(tmp_path / "broker.db", port=0) as emulator:
            _run(doc, blocks, tmp_path, emulator.port)
    elif any(b.mark == "artemis" for b in blocks):
        _run(doc, blocks, tmp_path, None, request.getfixturevalue("artemis_broker").url())
    elif any(b.mark == "postgres" for b in blocks):
        url = request.getfixturevalue("postgres_database")("doc_snippets")
        _run(doc, blocks, tmp_path, None, pg=url)
    else:
        _run(doc, blocks, tmp_path, None)


def _chain(blocks: list[Snippet], index: int) -> list[Snippet]:
    """The block at ``index`` with the blocks it continues (each marked ``continues`` goes
    on from the one before it)."""
    start = index
    while start > 0 and blocks[start].continues:
        start -= 1
    return blocks[start : index + 1]


ALONE = [
    pytest.param(
        doc,
        index,
        id=f"{doc.relative_to(ROOT)}:{block.line}",
        marks=[
            getattr(pytest.mark, kind)
            for kind in ("spark", "artemis", "postgres")
            if any(b.mark == kind for b in _chain(snippets(doc), index))
        ]
        + ([pytest.mark.slow] if doc.name == "spark.md" else []),
    )
    for doc in DOCS
    for index, block in enumerate(snippets(doc))
    if block.mark != "skip"
]


@pytest.mark.parametrize(("doc", "index"), ALONE)
def test_each_snippet_runs_on_its_own(
    doc: Path, index: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A reader copies one block: it runs in an empty directory and a fresh interpreter,
    with only the blocks it says it continues (``continues``) before it."""
    chain = _chain(snippets(doc), index)
    assert all(b.mark != "skip" for b in chain), f"{doc.name}: continues a skipped block"
    _run_blocks(doc, chain, tmp_path, request)


@pytest.mark.postgres
def test_the_readme_and_the_outbox_quick_starts_run_one_after_the_other(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A reader runs the README's quick start, then docs/outbox.md's, in one place: each
    page has paths of its own, so the second does not meet the first's broker."""
    readme = [s for s in snippets(ROOT / "README.md") if s.mark is None]
    _run(ROOT / "README.md", readme, tmp_path, None)
    outbox = [s for s in snippets(ROOT / "docs" / "outbox.md") if s.mark != "skip"]
    _run_blocks(ROOT / "docs" / "outbox.md", outbox, tmp_path, request)


def test_the_spark_page_says_how_workers_find_sendonce() -> None:
    """The snippets run in an activated venv (above): the page must ask for one."""
    text = (ROOT / "docs" / "spark.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in text and "PYSPARK_PYTHON" in text


def test_the_local_broker_page_runs_twice_in_one_directory(tmp_path: Path) -> None:
    """A reader runs a page's snippets again: they must not depend on a first run."""
    doc = ROOT / "docs" / "local-broker.md"
    blocks = [s for s in snippets(doc) if s.mark is None]
    _run(doc, blocks, tmp_path, None)
    _run(doc, blocks, tmp_path, None)


_CONSOLE = re.compile(r"^```console[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
_CONSOLE_SKIP = re.compile(r"<!--\s*console:\s*skip\s*\((?P<why>[^)]+)\)\s*-->\s*$")


def console_commands(doc: Path) -> list[tuple[int, str, list[str]]]:
    """Each ``$ sendonce ...`` of the page's console blocks: (line, command, output lines).

    A ``\\`` continues a command on the next line; ``# ...`` comments and optional
    ``[...]`` parts are dropped; ``<!-- console: skip (why) -->`` skips a block.
    """
    text = doc.read_text(encoding="utf-8")
    found: list[tuple[int, str, list[str]]] = []
    for match in _CONSOLE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if _CONSOLE_SKIP.search(before):
            continue
        line = text.count("\n", 0, match.start()) + 1
        pending = ""
        for offset, raw in enumerate(match.group("code").splitlines(), start=1):
            if pending or raw.startswith("$ "):
                pending += " " + (raw[2:] if raw.startswith("$ ") else raw.strip())
                if pending.endswith("\\"):
                    pending = pending[:-1]
                    continue
                command = re.sub(r"\s+#\s.*$|^\s*#.*$", "", pending)
                command = re.sub(r"\s*\[[^\]]*\]", "", command).strip()
                pending = ""
                if command:
                    found.append((line + offset, command, []))
            elif found and raw.strip():
                found[-1][2].append(raw.strip())
    return found


def test_the_cli_page_commands_run_as_written(tmp_path: Path) -> None:
    """docs/cli.md's console examples, in order, in an empty directory holding only the
    ``orders.jsonl`` they publish: each succeeds and prints the lines shown (path-free)."""
    import json
    import shlex

    orders = "".join(json.dumps({"order_id": i, "year": 2017}) + "\n" for i in range(250))
    (tmp_path / "orders.jsonl").write_text(orders)
    commands = console_commands(ROOT / "docs" / "cli.md")
    assert len(commands) >= 15
    for line, command, shown in commands:
        args = shlex.split(command)
        assert args[0] == "sendonce", f"docs/cli.md:{line}: {command}"
        proc = subprocess.run(
            [sys.executable, "-m", "sendonce.cli", *args[1:]],
            input="y\n",
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env=_reader_environment(),
        )
        where = f"docs/cli.md:{line}: {command}\n{proc.stdout}{proc.stderr}"
        assert proc.returncode == 0, where
        for expected in shown:
            if "/" not in expected and not expected.startswith(("publishing", "validating")):
                assert expected in proc.stdout, where


def test_the_snippet_finder_sees_the_documents() -> None:
    counted = {doc.name: len(snippets(doc)) for doc in DOCS}
    assert counted["README.md"] >= 3 and sum(counted.values()) >= 15
