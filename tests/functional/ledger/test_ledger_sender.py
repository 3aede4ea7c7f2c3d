"""The ledger with a real sender and a real broker file, on both stores (SQLite, PostgreSQL)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from ledger_helpers import WINDOW, Clock, msg

from sendonce import (
    ConfigurationError,
    EntityProfile,
    IdempotentSender,
    InDoubtError,
    Ledger,
    Message,
    PayloadConflictError,
    PermanentSendError,
    RetryPolicy,
)
from sendonce.backends import LocalBackend
from sendonce.ledger import Key, body_digest
from sendonce.testing import Fault, FaultyBackend


def bodies(broker: LocalBackend, entity: str) -> list[str]:
    got = broker.receive(entity, max_messages=100_000)
    return sorted(m.body if isinstance(m.body, str) else m.body.decode() for m in got)


def test_confirmed_keys_are_not_resent_after_the_window(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)
    with Ledger(ledger_url, clock=clock) as ledger:
        with IdempotentSender(broker, profile, retry=retry, ledger=ledger) as sender:
            assert sender.send_many([msg(i) for i in range(5)]).sent == 5
        clock.now += 2 * WINDOW  # the broker forgot the ids; the ledger did not
        with IdempotentSender(broker, profile, retry=retry, ledger=ledger) as sender:
            report = sender.send_many([msg(i) for i in range(8)])
            single = sender.send(msg(0))
    assert (report.sent, report.duplicates, report.failed) == (3, 5, 0)
    assert sorted(report.from_ledger) == [f"order-{i}" for i in range(5)]
    assert (single.outcome, single.attempts) == ("duplicate", 0)
    assert bodies(broker, "orders") == sorted(f"body {i}" for i in range(8))


def test_a_different_body_under_a_ledgered_key_is_a_conflict(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)
    with Ledger(ledger_url, clock=clock) as ledger:
        IdempotentSender(broker, profile, retry=retry, ledger=ledger).send(msg(1))
        clock.now += 3 * WINDOW
        sender = IdempotentSender(broker, profile, retry=retry, ledger=ledger)
        with pytest.raises(PayloadConflictError) as info:
            sender.send(msg(1, body="other"))
        assert "order-1" in str(info.value)
        report = sender.send_many([msg(1, body="other"), msg(2)])
    assert report.sent == 1
    assert [type(f.error) for f in report.failures] == [PayloadConflictError]
    assert bodies(broker, "orders") == ["body 1", "body 2"]


def _crashed_intent(ledger: Ledger, entity: str, message: Message, at: datetime) -> None:
    """What a producer killed between its send and the confirmation leaves behind."""
    key = Key(message.message_id, "")
    ledger.store.record_intents(
        entity, [key], [body_digest(message)], first_attempt=at, owner="dead"
    )


def test_an_unconfirmed_intent_inside_the_window_is_resent(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)
    with Ledger(ledger_url, clock=clock) as ledger:
        IdempotentSender(broker, profile, retry=retry).send(msg(1))  # it did land
        _crashed_intent(ledger, "orders", msg(1), clock.now)
        _crashed_intent(ledger, "orders", msg(2), clock.now)  # this one did not
        clock.now += WINDOW / 2
        with IdempotentSender(broker, profile, retry=retry, ledger=ledger) as sender:
            report = sender.send_many([msg(1), msg(2)])
        assert report.failed == 0
        clock.now += 3 * WINDOW
        again = IdempotentSender(broker, profile, retry=retry, ledger=ledger).send_many(
            [msg(1), msg(2)]
        )
    assert again.from_ledger == ["order-1", "order-2"]  # confirmed by the resend
    assert bodies(broker, "orders") == ["body 1", "body 2"]


@pytest.mark.parametrize("policy", ["error", "resend"])
def test_an_unconfirmed_intent_past_the_window_is_in_doubt(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy, policy: str
) -> None:
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)
    with Ledger(ledger_url, clock=clock, in_doubt=policy) as ledger:  # type: ignore[arg-type]
        _crashed_intent(ledger, "orders", msg(1), clock.now)
        clock.now += 2 * WINDOW
        with IdempotentSender(broker, profile, retry=retry, ledger=ledger) as sender:
            report = sender.send_many([msg(1), msg(2)])
    if policy == "error":
        assert report.sent == 1
        assert report.in_doubt == ["order-1"]
        error = report.failures[0].error
        assert isinstance(error, InDoubtError)
        assert "window" in str(error)
        assert bodies(broker, "orders") == ["body 2"]
    else:
        assert (report.sent, report.failed) == (2, 0)
        assert bodies(broker, "orders") == ["body 1", "body 2"]


def test_an_entity_without_duplicate_detection_is_accepted_and_never_retried(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    profile = EntityProfile("basic", duplicate_detection=False)
    with pytest.raises(ConfigurationError):
        IdempotentSender(broker, profile, retry=retry)
    faulty = FaultyBackend(broker, [Fault.NONE, Fault.AFTER_COMMIT])
    with Ledger(ledger_url, clock=clock) as ledger:
        with IdempotentSender(faulty, profile, retry=retry, ledger=ledger) as sender:
            assert sender.send(msg(1)).outcome == "sent"
            with pytest.raises(InDoubtError):
                sender.send(msg(2))  # stored, ack lost: a retry would duplicate it
        with IdempotentSender(broker, profile, retry=retry, ledger=ledger) as sender:
            report = sender.send_many([msg(1), msg(2), msg(3)])
    assert (report.sent, report.duplicates) == (1, 1)
    assert report.in_doubt == ["order-2"]
    assert bodies(broker, "basic") == ["body 1", "body 2", "body 3"]


def test_a_refused_send_releases_its_intent(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)
    faulty = FaultyBackend(broker, [Fault.PERMANENT])
    with Ledger(ledger_url, clock=clock) as ledger:
        report = IdempotentSender(faulty, profile, retry=retry, ledger=ledger).send_many([msg(1)])
        assert report.failed == 1 and not report.in_doubt
        assert ledger.store.lookup("orders", [Key("order-1", "")]) == {}
        clock.now += 2 * WINDOW  # nothing was stored, so nothing is in doubt
        again = IdempotentSender(broker, profile, retry=retry, ledger=ledger).send_many([msg(1)])
    assert again.sent == 1
    assert bodies(broker, "orders") == ["body 1"]


def test_partition_keys_are_part_of_the_ledger_key(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    profile = EntityProfile("part", partitioned=True, duplicate_detection_window=WINDOW)
    with Ledger(ledger_url, clock=clock) as ledger:
        sender = IdempotentSender(broker, profile, retry=retry, ledger=ledger)
        sender.send(Message("a", message_id="m", partition_key="a"))
        clock.now += 2 * WINDOW
        report = sender.send_many(
            [
                Message("a", message_id="m", partition_key="a"),
                Message("b", message_id="m", partition_key="b"),
            ]
        )
    assert (report.sent, report.from_ledger) == (1, ["m"])
    assert bodies(broker, "part") == ["a", "b"]


def test_pruning_is_bounded_and_keeps_keys_younger_than_the_retention(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)
    with Ledger(ledger_url, clock=clock, retention=timedelta(days=1)) as ledger:
        sender = IdempotentSender(broker, profile, retry=retry, ledger=ledger)
        sender.send_many([msg(i) for i in range(10)])
        clock.now += timedelta(hours=12)
        sender.send_many([msg(i) for i in range(10, 15)])
        clock.now += timedelta(hours=13)  # the first 10 are 25 h old, the last 5 are 13 h
        assert ledger.prune(limit=4) == 4
        assert ledger.prune(limit=100) == 6
        assert ledger.prune(limit=100) == 0
        keys = [Key(f"order-{i}", "") for i in range(15)]
        assert sorted(ledger.store.lookup("orders", keys)) == keys[10:]


def test_a_sender_opens_and_closes_a_ledger_url(
    broker: LocalBackend, tmp_path: Path, retry: RetryPolicy
) -> None:
    url = f"sqlite://{tmp_path / 'l.db'}"
    profile = EntityProfile("orders")
    with IdempotentSender(broker, profile, retry=retry, ledger=url) as sender:
        assert sender.ledger is not None and sender.ledger.url == url
        sender.send(msg(1))
    with IdempotentSender(broker, profile, retry=retry, ledger=url) as sender:
        assert sender.send_many([msg(1)]).from_ledger == ["order-1"]


def test_a_scheduled_message_is_recorded_and_not_scheduled_again_after_the_window(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)
    refusing = FaultyBackend(broker, [Fault.PERMANENT])
    with Ledger(ledger_url, clock=clock) as ledger:
        with IdempotentSender(refusing, profile, retry=retry, ledger=ledger) as sender:
            with pytest.raises(PermanentSendError):
                sender.schedule(msg(2), clock.now + WINDOW)
        assert ledger.store.lookup("orders", [Key("order-2", "")]) == {}  # released
        with IdempotentSender(broker, profile, retry=retry, ledger=ledger) as sender:
            first = sender.schedule(msg(1), clock.now + WINDOW)
            row = ledger.store.lookup("orders", [Key("order-1", "")])[Key("order-1", "")]
            assert (first.outcome, row.outcome) == ("scheduled", "scheduled")
            clock.now += 2 * WINDOW  # the broker's window has passed; the ledger remembers
            again = sender.schedule(msg(1), clock.now + WINDOW)
            assert again.outcome == "duplicate"
            with pytest.raises(PayloadConflictError):
                sender.schedule(msg(1, "changed"), clock.now + WINDOW)
            assert sender.schedule(msg(2), clock.now + WINDOW).outcome == "scheduled"
        _crashed_intent(ledger, "orders", msg(3), clock.now - 2 * WINDOW)
        with IdempotentSender(broker, profile, retry=retry, ledger=ledger) as sender:
            with pytest.raises(InDoubtError):
                sender.schedule(msg(3), clock.now + WINDOW)
    clock.now += 3 * WINDOW
    assert bodies(broker, "orders") == ["body 1", "body 2"]
