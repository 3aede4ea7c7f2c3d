"""Issue 20 item 2: ``publish --ledger`` and the re-run promise, on real broker and ledger files."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce._sender import IdempotentSender
from sendonce.backends.local import LocalBackend
from sendonce.cli import main

ID = "{order_id}"


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def orders(tmp_path: Path, count: int, name: str = "o.jsonl") -> Path:
    source = tmp_path / name
    source.write_text("".join(json.dumps({"order_id": i}) + "\n" for i in range(count)))
    return source


def stored(db: str, entity: str) -> list[str]:
    with LocalBackend(db) as backend:
        return backend.message_ids(entity)


def publish(db: str, source: Path, entity: str, *extra: str) -> Result:
    return run(
        "publish", str(source), "--to", f"local://{db}", "--entity", entity, "--id", ID,
        "--no-progress", *extra,
    )  # fmt: skip


def test_a_rerun_after_the_window_sends_nothing_again_with_a_ledger(tmp_path):
    """On a 20 s window, a re-run after the window: with --ledger nothing is sent again;
    without it the broker has forgotten, the records go again, and the first run said so."""
    db, ledger = str(tmp_path / "broker.db"), f"sqlite://{tmp_path}/ledger.db"
    for entity in ("kept", "forgotten"):
        created = run("broker", "create", db, "--entity", entity, "--window", "20s")
        assert created.exit_code == 0, created.output
    source = orders(tmp_path, 10)

    first = publish(db, source, "kept", "--ledger", ledger, "--create-ledger", "--json")
    assert first.exit_code == 0, first.output
    with_ledger = json.loads(first.stdout)
    assert with_ledger["sent"] == 10 and with_ledger["rerun_safe_until"] is None
    assert "--ledger is safe" in with_ledger["rerun"]

    plain = publish(db, source, "forgotten", "--json")
    assert plain.exit_code == 0, plain.output
    without = json.loads(plain.stdout)
    until = datetime.fromisoformat(without["rerun_safe_until"])
    assert timedelta(0) < until - datetime.now(UTC) <= timedelta(seconds=20)
    assert "cannot detect" in without["rerun"] and "--ledger" in without["rerun"]

    time.sleep(21)  # the broker's 20 s window of every first send has passed

    again = publish(db, source, "kept", "--ledger", ledger, "--json")
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert (report["sent"], report["duplicates"], report["from_ledger"]) == (0, 10, 10)
    assert len(stored(db, "kept")) == 10

    # Without a ledger the broker forgot: the records are sent again, as the first run warned.
    resent = publish(db, source, "forgotten", "--json")
    assert json.loads(resent.stdout)["sent"] == 10
    assert len(stored(db, "forgotten")) == 20


def test_ctrl_c_without_a_ledger_states_the_limit_of_a_rerun(tmp_path, monkeypatch):
    db = str(tmp_path / "broker.db")
    assert run("broker", "create", db, "--entity", "orders", "--window", "10m").exit_code == 0
    source = orders(tmp_path, 25)
    real = IdempotentSender.send_many
    calls = []

    def interrupted(self, messages, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, messages, **kwargs)

    monkeypatch.setattr(IdempotentSender, "send_many", interrupted)
    result = publish(db, source, "orders", "--chunk-size", "10", "--json")
    assert result.exit_code == 130
    assert "again is safe until" in result.stderr and "UTC" in result.stderr
    assert "cannot detect" in result.stderr and "--ledger" in result.stderr
    report = json.loads(result.stdout)  # --json reports on Ctrl-C too
    assert report["status"] == "interrupted" and report["sent"] == 20
    assert report["unaccounted"] == 5 and report["exit_status"] == 130
    assert report["rerun_safe_until"] is not None


def test_ctrl_c_with_a_ledger_promises_a_safe_rerun_for_good(tmp_path, monkeypatch):
    db, ledger = str(tmp_path / "broker.db"), f"sqlite://{tmp_path}/ledger.db"
    assert run("broker", "create", db, "--entity", "orders").exit_code == 0
    source = orders(tmp_path, 25)
    real = IdempotentSender.send_many
    calls = []

    def interrupted(self, messages, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, messages, **kwargs)

    monkeypatch.setattr(IdempotentSender, "send_many", interrupted)
    result = publish(
        db, source, "orders", "--chunk-size", "10", "--ledger", ledger, "--create-ledger"
    )
    assert result.exit_code == 130
    assert "with the same --ledger is safe" in result.stderr
    assert "until" not in result.stderr
    monkeypatch.setattr(IdempotentSender, "send_many", real)
    again = publish(db, source, "orders", "--ledger", ledger, "--json")
    report = json.loads(again.stdout)
    assert (report["sent"], report["from_ledger"]) == (15, 10)
    assert sorted(stored(db, "orders"), key=int) == [str(i) for i in range(25)]


def test_in_doubt_needs_a_ledger(tmp_path):
    db = str(tmp_path / "broker.db")
    assert run("broker", "create", db, "--entity", "orders").exit_code == 0
    result = publish(db, orders(tmp_path, 1), "orders", "--in-doubt", "resend")
    assert result.exit_code == 2 and "--in-doubt needs --ledger" in result.stderr
    assert stored(db, "orders") == []


@pytest.mark.parametrize(
    ("ledger", "expected"),
    [
        ("mysql://x/y", "--ledger: ledger url 'mysql://x/y' names no known store"),
        ("sqlite://host/x.db", "names a host"),
        ("sqlite:///{tmp}/missing-dir/ledger.db", "missing-dir"),
    ],
)
def test_a_bad_ledger_is_refused_naming_the_option(tmp_path, ledger, expected):
    db = str(tmp_path / "broker.db")
    assert run("broker", "create", db, "--entity", "orders").exit_code == 0
    result = publish(db, orders(tmp_path, 1), "orders", "--ledger", ledger.format(tmp=tmp_path))
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and "--ledger" in result.stderr
    assert "Traceback" not in result.stderr
    assert stored(db, "orders") == []


def test_help_states_the_limit_of_a_rerun():
    text = run("publish", "--help").output
    assert "--ledger" in text and "cannot be detected" in " ".join(text.split())
    assert "again is safe" not in text


# `sendonce ledger`: what a ledger holds, and resolving keys in doubt by hand.


def _abandoned_intents(ledger_url: str, entity: str, ids: list[str], hours_ago: float) -> None:
    """Intents written as a run that died before the broker's ack would leave them."""
    from sendonce import MessageSpec
    from sendonce.ledger import Key, Ledger

    then = datetime.now(UTC) - timedelta(hours=hours_ago)
    with Ledger(ledger_url, clock=lambda: then) as ledger:
        messages = [MessageSpec(ID).to_message({"order_id": int(i)}) for i in ids]
        ledger._prepare(
            entity,
            messages,
            [Key(i, "") for i in ids],
            window=timedelta(minutes=10),
            margin=timedelta(seconds=5),
        )


def test_keys_in_doubt_are_listed_and_resolved_by_hand(tmp_path):
    db, ledger = str(tmp_path / "broker.db"), f"sqlite://{tmp_path}/ledger.db"
    assert run("broker", "create", db, "--entity", "orders").exit_code == 0
    source = orders(tmp_path, 4)  # ids 0..3
    _abandoned_intents(ledger, "orders", ["1", "2"], hours_ago=2)

    stats = json.loads(run("ledger", "stats", ledger, "--json").stdout)["entities"]
    assert stats["orders"]["keys"] == 2 and stats["orders"]["unconfirmed"] == 2
    assert stats["orders"]["oldest_pruned_after"] is not None

    first = publish(db, source, "orders", "--ledger", ledger, "--json")
    assert first.exit_code == 1
    report = json.loads(first.stdout)
    assert report["sent"] == 2 and sorted(report["in_doubt"]) == ["1", "2"]
    assert "sendonce ledger confirm" in first.stderr and "--in-doubt resend" in first.stderr
    assert "Ledger(" not in first.stderr and "in_doubt=" not in first.stderr

    listed = run("ledger", "in-doubt", ledger, "--entity", "orders", "--window", "10m", "--json")
    assert [key["message_id"] for key in json.loads(listed.stdout)["keys"]] == ["1", "2"]

    # The operator looked: '1' is not on the broker, '2' arrived by another way.
    released = run("ledger", "release", ledger, "--entity", "orders", "--id", "1")
    assert released.exit_code == 0, released.output
    confirmed = run("ledger", "confirm", ledger, "--entity", "orders", "--id", "2", "--json")
    assert json.loads(confirmed.stdout)["status"] == "ok"

    again = json.loads(publish(db, source, "orders", "--ledger", ledger, "--json").stdout)
    assert (again["sent"], again["from_ledger"], again["failed"]) == (1, 3, 0)
    assert sorted(stored(db, "orders")) == ["0", "1", "3"]  # '2' was confirmed by hand
    stats = json.loads(run("ledger", "stats", ledger, "--json").stdout)["entities"]
    assert stats["orders"]["unconfirmed"] == 0


def test_resolving_refuses_unknown_and_confirmed_keys_changing_nothing(tmp_path):
    ledger = f"sqlite://{tmp_path}/ledger.db"
    _abandoned_intents(ledger, "orders", ["1"], hours_ago=1)
    result = run("ledger", "release", ledger, "--entity", "orders", "--id", "1", "--id", "nope")
    assert result.exit_code == 2
    assert "key 'nope' of 'orders': the ledger has no such key" in result.stderr
    assert (
        json.loads(run("ledger", "stats", ledger, "--json").stdout)["entities"]["orders"]["keys"]
        == 1
    )
    assert run("ledger", "confirm", ledger, "--entity", "orders", "--id", "1").exit_code == 0
    twice = run("ledger", "confirm", ledger, "--entity", "orders", "--id", "1")
    assert twice.exit_code == 2 and "already confirmed (resolved at" in twice.stderr


def test_ledger_commands_never_create_a_ledger(tmp_path):
    missing = tmp_path / "typo.db"
    commands = (["stats"], ["in-doubt", "--entity", "e"], ["confirm", "--entity", "e", "--id", "1"])
    for args in commands:
        result = run("ledger", args[0], str(missing), *args[1:])
        assert result.exit_code == 2 and "there is no ledger file" in result.stderr
        assert not missing.exists()


@pytest.mark.postgres
def test_ledger_commands_read_and_resolve_a_postgresql_ledger(tmp_path, postgres_database):
    url = postgres_database("cli_ledger")  # a fresh database on the run's cluster
    _abandoned_intents(url, "orders", ["1", "2"], hours_ago=2)
    stats = json.loads(run("ledger", "stats", url, "--json").stdout)["entities"]
    assert (stats["orders"]["keys"], stats["orders"]["unconfirmed"]) == (2, 2)
    listed = run("ledger", "in-doubt", url, "--entity", "orders", "--json")
    assert [key["message_id"] for key in json.loads(listed.stdout)["keys"]] == ["1", "2"]
    assert run("ledger", "confirm", url, "--entity", "orders", "--id", "1").exit_code == 0
    assert run("ledger", "release", url, "--entity", "orders", "--id", "2").exit_code == 0
    stats = json.loads(run("ledger", "stats", url, "--json").stdout)["entities"]
    assert (stats["orders"]["keys"], stats["orders"]["confirmed"]) == (1, 1)


def test_an_unreachable_ledger_is_refused_without_its_password(tmp_path):
    db = str(tmp_path / "broker.db")
    assert run("broker", "create", db, "--entity", "orders").exit_code == 0
    url = "postgresql://u:topsecret@127.0.0.1:1/x?connect_timeout=1&attempts=1"
    result = publish(db, orders(tmp_path, 1), "orders", "--ledger", url, "--json")
    # A ledger that cannot be reached is a transient failure (1), as a broker is: not invalid.
    assert result.exit_code == 1 and json.loads(result.stdout)["status"] == "error"
    stats = run("ledger", "stats", url, "--json")
    assert stats.exit_code == 1
    assert json.loads(stats.stdout)["exit_status"] == 1
    for shown in (result.stdout + result.stderr, stats.stdout + stats.stderr):
        assert "topsecret" not in shown and "Traceback" not in shown
    assert stored(db, "orders") == []


def test_ctrl_c_while_connecting_reports_in_json_that_nothing_was_sent(tmp_path, monkeypatch):
    db = str(tmp_path / "broker.db")
    assert run("broker", "create", db, "--entity", "orders").exit_code == 0

    def interrupted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(IdempotentSender, "__init__", interrupted)
    result = publish(db, orders(tmp_path, 3), "orders", "--json")
    assert result.exit_code == 130
    report = json.loads(result.stdout)
    assert (report["status"], report["sent"], report["stage"]) == ("interrupted", 0, "connecting")
    assert "nothing was sent" in result.stderr
    assert stored(db, "orders") == []


def test_an_entity_the_ledger_does_not_know_is_named_with_those_it_does(tmp_path):
    ledger = f"sqlite://{tmp_path}/ledger.db"
    _abandoned_intents(ledger, "orders", ["1"], hours_ago=1)
    for args in (["stats", ledger, "--entity", "order"], ["in-doubt", ledger, "--entity", "order"]):
        result = run("ledger", *args)
        assert result.exit_code == 2
        assert "the ledger has no entity 'order' (it has 'orders')" in result.stderr
