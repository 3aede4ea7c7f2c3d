"""Issue 28 item 5: ``sendonce ledger reconcile`` over AMQP, peeking the emulator with the real
azure-servicebus client: it sees what is stored (queue, dead letters, a topic's named
subscriptions), says what a peek cannot tell, and records only what it saw."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce import IdempotentSender, Message
from sendonce.backends.local import LocalBackend
from sendonce.cli import main
from sendonce.emulator import Emulator
from sendonce.ledger import Key, Ledger

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def left_in_doubt(ledger: str, entity: str, ids: list[str]) -> None:
    then = datetime.now(UTC) - timedelta(hours=1)
    messages = [Message(f"body {i}", message_id=i) for i in ids]
    with Ledger(ledger, clock=lambda: then) as opened:
        opened.prepare(
            entity, messages, [Key(i) for i in ids], window=timedelta(0), margin=timedelta(0)
        )


def test_reconcile_peeks_a_queue_and_its_dead_letters_through_the_emulator(
    emulator: Emulator, store: LocalBackend, tmp_path: Path
) -> None:
    with IdempotentSender(store, "orders") as sender:
        sender.send_many([Message(f"body {i}", message_id=i) for i in ("a", "b", "c")])
    (taken, dead) = store.receive("orders", max_messages=2, mode="peek_lock")
    store.complete("orders", taken.lock_token)
    store.dead_letter("orders", dead.lock_token, reason="checked")
    ledger = f"sqlite://{tmp_path / 'ledger.db'}"
    left_in_doubt(ledger, "orders", ["a", "b", "c", "d"])
    url = emulator.connection_string  # type: ignore[attr-defined]
    shown = run("ledger", "reconcile", ledger, "--entity", "orders", "--broker", url, "--json")
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert [k["message_id"] for k in report["held"]] == ["b", "c"]  # c stored, b dead-lettered
    assert [k["message_id"] for k in report["absent"]] == ["a", "d"]  # taken, or never sent
    assert report["remembered"] == [] and report["not_stored"] == []
    assert any("Service Bus shows no remembered ids" in n for n in report["cannot_tell"])
    applied = run("ledger", "reconcile", ledger, "--entity", "orders", "--broker", url, "--apply")
    assert "confirmed 2 key(s), released 0; 2 left unconfirmed" in applied.stdout, applied.output
    assert "a peek shows the messages stored now" in applied.stderr
    assert "SharedAccessKey=" not in applied.stdout + applied.stderr


def test_reconcile_peeks_the_named_subscriptions_of_a_topic(
    emulator: Emulator, store: LocalBackend, tmp_path: Path
) -> None:
    with IdempotentSender(store, "events") as sender:
        sender.send_many([Message("x", message_id="e1"), Message("y", message_id="e2")])
    for message in store.receive(
        "events", subscription="a", max_messages=2, mode="receive_and_delete"
    ):
        assert message.message_id in ("e1", "e2")
    store.receive("events", subscription="b", max_messages=1, mode="receive_and_delete")
    ledger = f"sqlite://{tmp_path / 'ledger.db'}"
    left_in_doubt(ledger, "events", ["e1", "e2"])
    url = emulator.connection_string  # type: ignore[attr-defined]

    def held(*subscriptions: str) -> list[str]:
        named = [w for s in subscriptions for w in ("--subscription", s)]
        result = run("ledger", "reconcile", ledger, "--entity", "events", "--broker", url,
                     *named, "--json")  # fmt: skip
        assert result.exit_code == 0, result.output
        return [k["message_id"] for k in json.loads(result.stdout)["held"]]

    assert held("a", "b") == ["e2"]  # a consumed both, b still holds e2
