"""Issue 28 item 5: an operator takes 1,000 keys in doubt to zero with the commands exactly as
docs/ledger.md and docs/cli.md show them.

The situation the docs describe, built for real: a producer publishing 1,000 records to an
entity without duplicate detection, killed after the broker stored 600 of them and before it
recorded any ack, three hours ago (its 1,000 intents are in the ledger, unconfirmed). The
console blocks marked for this test run in order, in that directory, and each must succeed
and print the lines shown (``...`` stands for what varies: times, ages). The run ends with
every record in the broker exactly once and nothing unconfirmed.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from sendonce import EntityProfile, IdempotentSender, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.cli import main
from sendonce.ledger import Key, Ledger
from sendonce.ledger._inspect import count_unconfirmed

ROOT = Path(__file__).resolve().parents[3]
_CONSOLE = re.compile(r"^```console[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
_MARK = "run by tests/functional/cli/test_cli_doubt_workflow.py"


def killed_producer(directory: Path, count: int = 1000, stored: int = 600) -> None:
    """``audit.jsonl``, and what a producer killed mid-publish left: ``stored`` records in the
    broker, an unconfirmed intent for each of the ``count`` records in the ledger."""
    records = [{"id": f"audit-{n:04d}", "n": n} for n in range(count)]
    (directory / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = MessageSpec("{id}")
    messages = [spec.to_message(r) for r in records]
    with LocalBackend(directory / "broker.db") as broker:
        broker.create_entity(EntityProfile("audit", duplicate_detection=False))
        with IdempotentSender(broker, "audit", require_duplicate_detection=False) as sender:
            assert sender.send_many(messages[:stored]).sent == stored
    then = datetime.now(UTC) - timedelta(hours=3)
    with Ledger(f"sqlite://{directory / 'ledger.db'}", clock=lambda: then) as ledger:
        for start in range(0, count, 50):  # transfers of 50, as a sender writes them
            batch = messages[start : start + 50]
            ledger._prepare(
                "audit",
                batch,
                [Key(m.message_id) for m in batch],
                window=timedelta(0),
                margin=timedelta(seconds=5),
            )


def documented_commands(doc: Path) -> list[tuple[int, str, list[str]]]:
    """The ``$ sendonce ...`` lines of the page's blocks marked for this test, with the
    output lines each shows."""
    text = doc.read_text(encoding="utf-8")
    found: list[tuple[int, str, list[str]]] = []
    for match in _CONSOLE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if _MARK not in before:
            continue
        line = text.count("\n", 0, match.start()) + 1
        pending = ""
        for offset, raw in enumerate(match.group("code").splitlines(), start=1):
            if pending or raw.startswith("$ "):
                pending += " " + (raw[2:] if raw.startswith("$ ") else raw.strip())
                if pending.endswith("\\"):
                    pending = pending[:-1]
                    continue
                found.append((line + offset, pending.strip(), []))
                pending = ""
            elif found and raw.strip():
                found[-1][2].append(raw.strip())
    return found


def shows(expected: str, output: str) -> bool:
    """Whether one line of ``output`` is ``expected``, ``...`` standing for anything."""
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return any(re.fullmatch(pattern, line.strip()) for line in output.splitlines())


def run_documented(doc: Path, directory: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.chdir(directory)
    commands = documented_commands(doc)
    for line, command, shown in commands:
        args = shlex.split(command)
        target = None
        if ">" in args:
            target = args[args.index(">") + 1]
            args = args[: args.index(">")]
        assert args[0] == "sendonce", f"{doc.name}:{line}: {command}"
        result = CliRunner().invoke(main, args[1:], catch_exceptions=False)
        where = f"{doc.name}:{line}: {command}\n{result.stdout}{result.stderr}"
        assert result.exit_code == 0, where
        if target is not None:
            (directory / target).write_text(result.stdout)
        for expected in shown:
            assert shows(expected, result.stdout), f"{where}\nnot shown: {expected}"
    return len(commands)


@pytest.mark.parametrize("page", ["ledger.md", "cli.md"])
def test_1000_keys_in_doubt_go_to_zero_with_the_documented_commands(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed_producer(tmp_path)
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}", create=False) as ledger:
        assert count_unconfirmed(ledger.store, "audit") == 1000
    ran = run_documented(ROOT / "docs" / page, tmp_path, monkeypatch)
    assert ran >= 4, f"docs/{page} shows the workflow in at least 4 commands"
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}", create=False) as ledger:
        assert count_unconfirmed(ledger.store, "audit") == 0
    with LocalBackend(tmp_path / "broker.db") as broker:
        ids = broker.message_ids("audit")
    assert sorted(ids) == [f"audit-{n:04d}" for n in range(1000)]  # each exactly once


def test_the_shown_output_matcher_can_fail() -> None:
    assert shows("'a': first attempted ... UTC (... ago)", "'a': first attempted 2026 UTC (3h ago)")
    assert not shows("'a': first attempted ... UTC", "'b': first attempted 2026 UTC")
    assert not shows("confirmed 600 key(s)", "confirmed 599 key(s)")
