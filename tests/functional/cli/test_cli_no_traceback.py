"""Issue 23: every command, driven with bad inputs, answers in its own words, never with
a Python traceback (and with exit status 1 or 2, not a crash's)."""

from __future__ import annotations

import traceback
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sendonce.cli import main

# Each case: the command's words, then its arguments; {d} is a fresh directory holding
# broker.db (a broker with queue 'orders' and session queue 'sess'), ledger.db (a ledger),
# text.txt, bad.jsonl (malformed), bin.jsonl (random bytes), empty.jsonl, good.jsonl.
CASES: list[list[str]] = [
    ["nope"],
    ["--log-level", "loud", "broker", "stats", "{d}/broker.db"],
    ["broker", "create"],
    ["broker", "create", "{d}", "--entity", "q"],
    ["broker", "create", "{d}/missing/b.db", "--entity", "q"],
    ["broker", "create", "{d}/text.txt", "--entity", "q"],
    ["broker", "create", "{d}/new.db", "--entity", "q", "--window", "1x"],
    ["broker", "create", "{d}/new.db", "--entity", "q", "--window", "3s"],
    ["broker", "create", "{d}/new.db", "--entity", ""],
    ["broker", "create", "{d}/new.db", "--entity", "x" * 300],
    ["broker", "create", "{d}/new.db", "--entity", "q", "--id-cache-size", "0"],
    ["broker", "create", "{d}/new.db", "--entity", "q", "--subscription", "s"],
    ["broker", "create", "{d}/broker.db", "--entity", "orders"],
    ["broker", "create", "{d}/new.db", "--entity", "q", "--lock-duration", "6m"],
    ["broker", "create-subscription", "{d}/broker.db", "--entity", "orders", "--subscription", "s"],
    ["broker", "create-subscription", "{d}/broker.db", "--entity", "nope", "--subscription", "s"],
    ["broker", "create-subscription", "{d}/missing.db", "--entity", "t", "--subscription", "s"],
    ["broker", "stats", "{d}/missing.db"],
    ["broker", "stats", "{d}/text.txt"],
    ["broker", "stats", "{d}/ledger.db"],
    ["broker", "stats", "{d}/broker.db", "--entity", "nope"],
    ["broker", "peek", "{d}/broker.db", "--entity", "orders", "--max", "0"],
    ["broker", "peek", "{d}/broker.db", "--entity", "orders", "--subscription", "s"],
    ["broker", "peek", "{d}/broker.db", "--entity", "nope", "--dead-letter"],
    ["broker", "receive", "{d}/broker.db", "--entity", "orders", "--session-id", "x"],
    ["broker", "receive", "{d}/broker.db", "--entity", "sess", "--session-id", ""],
    ["broker", "purge", "{d}/broker.db", "--entity", "orders", "--subscription", "s"],
    ["broker", "delete", "{d}/broker.db", "--entity", "nope", "--yes"],
    ["broker", "backup", "{d}/broker.db", "{d}/text.txt"],
    ["broker", "backup", "{d}/broker.db", "{d}/missing/copy.db"],
    ["broker", "backup", "{d}/broker.db", "{d}"],
    ["publish"],
    ["publish", "{d}/good.jsonl", "--to", "nonsense", "--entity", "orders", "--id", "{a}"],
    ["publish", "{d}/good.jsonl", "--to", "Endpoint=sb://x;", "--entity", "e", "--id", "{a}"],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db?x=1",
        "--entity",
        "orders",
        "--id",
        "{a}",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/text.txt",
        "--entity",
        "orders",
        "--id",
        "{a}",
    ],
    ["publish", "{d}", "--to", "local:{d}/broker.db", "--entity", "orders", "--id", "{a}"],
    [
        "publish",
        "{d}/bad.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
    ],
    [
        "publish",
        "{d}/bin.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}{b}",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a",
        "--json",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--body-field",
        "nope",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--chunk-size",
        "0",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--timeout",
        "abc",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--window",
        "8d",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--ledger",
        "{d}/typo.db",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--ledger",
        "sqlite://{d}/broker.db",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--ledger",
        "sqlite://{d}/text.txt",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--encoding",
        "nope",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--format",
        "csv",
        "--delimiter",
        ";;",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--format",
        "csv",
        "--encoding",
        "utf-16",
    ],
    ["publish", "{d}/good.jsonl", "--to", "local:{d}/broker.db", "--entity", "sess", "--id", "{a}"],
    [
        "publish",
        "{d}/empty.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--session-id",
        "{b}",
    ],
    [
        "publish",
        "{d}/good.jsonl",
        "--to",
        "local:{d}/broker.db",
        "--entity",
        "orders",
        "--id",
        "{a}",
        "--partitioned",
    ],
    ["ledger", "stats", "{d}/missing.db"],
    ["ledger", "stats", "{d}/broker.db"],
    ["ledger", "stats", "{d}/text.txt"],
    ["ledger", "stats", "mysql://x/y"],
    ["ledger", "in-doubt", "{d}/ledger.db", "--entity", "orders", "--window", "-1"],
    ["ledger", "in-doubt", "{d}/ledger.db", "--entity", "orders", "--max", "0"],
    ["ledger", "confirm", "{d}/ledger.db", "--entity", "orders", "--id", "nope"],
    ["ledger", "release", "{d}/ledger.db", "--entity", "nope", "--id", "1", "--json"],
    ["ledger", "release", "{d}/ledger.db", "--entity", "orders", "--from", "{d}/missing.txt"],
    [
        "ledger",
        "confirm",
        "{d}/ledger.db",
        "--entity",
        "orders",
        "--from",
        "{d}/bad.jsonl",
        "--json",
    ],
    ["ledger", "create", "{d}/missing/ledger.db"],
    ["ledger", "reconcile", "{d}/ledger.db", "--entity", "orders", "--broker", "local:{d}/no.db"],
    ["ledger", "reconcile", "{d}/ledger.db", "--entity", "orders", "--broker", "{d}/broker.db"],
    ["relay", "--outbox", "mysql://x/y", "--to", "local:{d}/broker.db", "--entity", "orders"],
    ["relay", "--outbox", "postgresql://h/db", "--to", "local:{d}/missing.db", "--entity", "o"],
    ["outbox", "stats", "mysql://x/y"],
    ["outbox", "dead", "sqlite:///{d}/ledger.db", "--json"],
    ["outbox", "requeue", "postgresql://127.0.0.1:1/x", "--entity", "orders"],
    ["outbox", "install", "{d}/text.txt"],
    ["emulator", "--db", "{d}/missing/b.db", "--port", "0"],
    ["emulator", "--db", "{d}/text.txt", "--port", "0"],
    ["emulator", "--db", "{d}/broker.db", "--port", "70000"],
    ["emulator", "--db", "{d}/broker.db", "--host", "example.com"],
    ["demo", "--orders", "0"],
    ["demo", "--workdir", "{d}/text.txt"],
]


def _leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    leaves: set[tuple[str, ...]] = set()
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            leaves |= _leaf_commands(command, (*prefix, name))
        else:
            leaves.add((*prefix, name))
    return leaves


def test_every_command_has_bad_input_cases():
    covered = set()
    for case in CASES:
        words = [w for w in case if not w.startswith("-")]
        covered.add(tuple(words[:2]) if words[0] in ("broker", "ledger", "outbox") else (words[0],))
    assert _leaf_commands(main) - covered == set()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sendonce import EntityProfile
    from sendonce.backends.local import LocalBackend
    from sendonce.ledger import Ledger

    d = tmp_path_factory.mktemp("bad-inputs")
    with LocalBackend(d / "broker.db") as backend:
        backend.create_entity(EntityProfile("orders"))
        backend.create_entity(EntityProfile("sess", sessions=True))
    with Ledger(f"sqlite://{d / 'ledger.db'}"):
        pass
    (d / "text.txt").write_text("not a database\n")
    (d / "bad.jsonl").write_text('{"a": 1\n')
    (d / "bin.jsonl").write_bytes(bytes(range(256)) * 4)
    (d / "empty.jsonl").write_text("")
    (d / "good.jsonl").write_text('{"a": 1, "b": "x"}\n')
    return d


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c)[:60] for c in CASES])
def test_a_bad_input_is_answered_without_a_traceback(workdir: Path, case: list[str]):
    args = [a.replace("{d}", str(workdir)) for a in case]
    result = CliRunner().invoke(main, args, input="n\n")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        shown = "".join(traceback.format_exception(result.exception))
        pytest.fail(f"sendonce {' '.join(args)} raised:\n{shown}")
    # `sendonce emulator` also tells a busy port (3) and an unusable broker file (4) apart.
    refusals = (1, 2, 3, 4) if args[0] == "emulator" else (1, 2)
    assert result.exit_code in refusals, result.output
    assert "Traceback" not in result.stderr
    assert result.stderr.strip(), "a refusal says why"
