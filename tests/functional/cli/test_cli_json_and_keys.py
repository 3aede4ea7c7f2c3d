"""Issue 34 findings 7 and 8 on the command line: ``--json`` lists exactly what it refused,
reads ``--from`` the same way with or without ``--json``, and every ``--json`` output has one
shape (``status`` ... ``exit_status``); exit codes and hints an operator's script can trust."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_cli_ledger_doubt import intents, records

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.cli import main


def run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin, catch_exceptions=False)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    with LocalBackend(tmp_path / "broker.db") as broker:
        broker.create_entity(EntityProfile("audit", duplicate_detection=False))
        broker.create_entity(EntityProfile("orders"))
    return tmp_path


def test_refusing_1000_keys_lists_exactly_those_keys_with_the_advice_apart(here: Path) -> None:
    (here / "unknown.txt").write_text("".join(f"nope-{n:04d}\n" for n in range(1000)))
    messages = records(here / "o.jsonl", 3)
    intents("sqlite:l.db", "audit", messages, age=timedelta(hours=1))
    for command in ("confirm", "release"):
        done = run(
            "ledger", command, "l.db", "--entity", "audit", "--from", "unknown.txt", "--json"
        )
        assert done.exit_code == 2
        report = json.loads(done.stdout)
        assert report["status"] == "error" and report["exit_status"] == 2
        assert len(report["errors"]) == 1000
        assert all(e.startswith("key 'nope-") for e in report["errors"])
        assert "(and 999 more, listed in errors)" in report["error"]
        assert report["error"].startswith("1000 key(s) refused: key 'nope-0000'")
        assert report["advice"] and "check the ids" in report["advice"][0]
    # Nothing changed: the three intents are still unconfirmed.
    stats = json.loads(run("ledger", "stats", "l.db", "--json").stdout)["entities"]
    assert stats["audit"]["unconfirmed"] == 3


def test_json_output_does_not_change_how_from_is_read(here: Path) -> None:
    messages = records(here / "o.jsonl", 6)
    intents("sqlite:l.db", "audit", messages, age=timedelta(hours=1))
    (here / "ids.txt").write_text("r000\nr001\n")  # a plain id file, as the text output shows
    done = run("ledger", "confirm", "l.db", "--entity", "audit", "--from", "ids.txt", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["count"] == 2
    (here / "ids.tsv").write_text("r002\t\n")  # an id, a tab, no partition key
    done = run("ledger", "release", "l.db", "--entity", "audit", "--from", "ids.tsv", "--json")
    assert done.exit_code == 0, done.output
    # JSON input is detected without --json, and chosen by --from-format.
    listed = run("ledger", "in-doubt", "l.db", "--entity", "audit", "--all", "--json").stdout
    (here / "doubt.json").write_text(listed)
    done = run("ledger", "release", "l.db", "--entity", "audit", "--from", "doubt.json")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("3 key(s) of 'audit' released")
    (here / "lines.jsonl").write_text('"r000"\n')
    done = run(
        "ledger", "confirm", "l.db", "--entity", "audit", "--from", "lines.jsonl",
        "--from-format", "json", "--json",
    )  # fmt: skip
    assert done.exit_code == 2 and "already confirmed" in json.loads(done.stdout)["errors"][0]


def test_every_stats_json_is_one_line_with_status_and_exit_status(here: Path) -> None:
    messages = records(here / "o.jsonl", 2)
    intents("sqlite:l.db", "audit", messages, age=timedelta(hours=1))
    for args in (("ledger", "stats", "l.db"), ("broker", "stats", "broker.db")):
        done = run(*args, "--json")
        assert done.exit_code == 0, done.output
        assert done.stdout.count("\n") == 1  # one line, as every other --json
        report = json.loads(done.stdout)
        assert list(report) == ["status", "entities", "exit_status"]
        assert (report["status"], report["exit_status"]) == ("ok", 0)
        assert "audit" in report["entities"]
    nope = run("ledger", "stats", "l.db", "--entity", "nope", "--json")
    assert nope.exit_code == 2 and json.loads(nope.stdout)["exit_status"] == 2


def test_in_doubt_and_reconcile_on_a_ledger_with_no_entity_have_nothing_to_do(here: Path) -> None:
    """A publish killed while it validated its input leaves a ledger with no entity: an
    operator's script running the doubt workflow must read "nothing to do" (exit 0)."""
    assert run("ledger", "create", "l.db").exit_code == 0
    done = run("ledger", "in-doubt", "l.db", "--entity", "audit", "--broker", "local:broker.db")
    assert done.exit_code == 0, done.output
    assert "no keys in doubt for 'audit'" in done.stdout
    done = run("ledger", "in-doubt", "l.db", "--entity", "audit", "--json")
    assert done.exit_code == 0 and json.loads(done.stdout)["in_doubt"] == 0
    for extra in ((), ("--apply",)):
        done = run(
            "ledger", "reconcile", "l.db", "--entity", "audit", "--broker", "local:broker.db",
            *extra,
        )  # fmt: skip
        assert done.exit_code == 0, done.output
        assert "nothing to do" in done.stdout
    done = run(
        "ledger", "reconcile", "l.db", "--entity", "audit", "--broker", "local:broker.db", "--json"
    )
    report = json.loads(done.stdout)
    assert (report["status"], report["unconfirmed"], report["exit_status"]) == ("ok", 0, 0)
    # A ledger that holds other entities still refuses a name it does not know (a typo).
    intents("sqlite:l.db", "orders", records(here / "o.jsonl", 1), age=timedelta(hours=1))
    typo = run("ledger", "in-doubt", "l.db", "--entity", "ordres")
    assert typo.exit_code == 2 and "has no entity 'ordres'" in typo.stderr


def test_the_next_hint_names_the_real_ledger_entity_and_broker(here: Path) -> None:
    intents("sqlite:my ledger.db", "audit", records(here / "o.jsonl", 3), age=timedelta(hours=1))
    done = run(
        "ledger", "in-doubt", "my ledger.db", "--entity", "audit", "--broker", "local:broker.db"
    )
    assert done.exit_code == 0, done.output
    assert (
        "`sendonce ledger reconcile 'my ledger.db' --entity audit --broker local:broker.db`"
        in done.stderr
    )
    assert "LEDGER" not in done.stderr and "NAME" not in done.stderr


def test_an_unreachable_service_bus_is_one_error_and_publish_stops(here: Path) -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conn = (
        f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
    records(here / "o.jsonl", 30)
    publish = (
        "publish", "o.jsonl", "--to", conn, "--entity", "orders", "--id", "{id}",
        "--window", "10m", "--attempts", "2", "--chunk-size", "10", "--no-progress",
    )  # fmt: skip
    done = run(*publish)
    assert done.exit_code == 1
    assert done.stderr.count("the broker could not be reached") == 1
    assert "failed: line" not in done.stderr  # not one failure per record
    assert done.stderr.count("was not stored") <= 1  # the sender's one warning, if shown
    assert "the remaining 30 record(s) were not sent" in done.stderr
    assert "SAS_KEY_VALUE" not in done.output
    report = json.loads(run(*publish, "--json").stdout)
    assert (report["status"], report["exit_status"], report["failed"]) == ("stopped", 1, 0)
    assert report["error"].startswith("the broker could not be reached")


def test_every_json_output_is_one_line_status_first_exit_status_last(here: Path) -> None:
    messages = records(here / "o.jsonl", 4)
    intents("sqlite:l.db", "audit", messages, age=timedelta(hours=1))
    commands = [
        ("ledger", "create", "new.db"),
        ("ledger", "stats", "l.db"),
        ("ledger", "in-doubt", "l.db", "--entity", "audit", "--broker", "local:broker.db"),
        ("ledger", "reconcile", "l.db", "--entity", "audit", "--broker", "local:broker.db"),
        ("ledger", "confirm", "l.db", "--entity", "audit", "--id", "r000"),
        ("ledger", "release", "l.db", "--entity", "audit", "--id", "r001"),
        ("ledger", "release", "l.db", "--entity", "audit", "--id", "nope"),  # a refusal
        ("broker", "stats", "broker.db"),
        ("publish", "o.jsonl", "--to", "local:broker.db", "--entity", "orders", "--id", "{id}"),
    ]
    for command in commands:
        done = run(*command, "--json")
        assert done.stdout.count("\n") == 1, (command, done.stdout)
        report = json.loads(done.stdout)
        keys = list(report)
        assert (keys[0], keys[-1]) == ("status", "exit_status"), (command, keys)
        assert report["exit_status"] == done.exit_code, command
