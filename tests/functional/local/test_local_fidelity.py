"""What local:// receivers read of a message as Service Bus reports it: the time to live an
entity's default gives, the message state, and the transfer dead-letter subqueue."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendonce import Message, ValidationError
from sendonce.backends.local import LockLostError

HOUR = timedelta(hours=1)


def test_a_message_without_a_time_to_live_takes_the_entitys_default(broker, make_entity, clock):
    make_entity("hourly", default_message_time_to_live=HOUR)
    broker.send(
        "hourly",
        [
            Message("n", message_id="none"),
            Message("o", message_id="own", time_to_live=timedelta(minutes=1)),
            Message("l", message_id="long", time_to_live=timedelta(days=2)),
        ],
        timeout=5,
    )
    peeked = {m.message_id: m for m in broker.peek("hourly", max_messages=3)}
    received = {m.message_id: m for m in broker.receive("hourly", max_messages=3)}
    for messages in (peeked, received):
        none, own, long = messages["none"], messages["own"], messages["long"]
        assert none.time_to_live == HOUR
        assert none.expires_at == clock.now + HOUR == none.enqueued_time + HOUR
        assert (own.time_to_live, own.expires_at) == (
            timedelta(minutes=1),
            clock.now + own.time_to_live,
        )
        assert (long.time_to_live, long.expires_at) == (HOUR, clock.now + HOUR)


def test_without_a_default_a_message_keeps_its_own_time_to_live_or_none(broker, make_entity, clock):
    make_entity()
    broker.send(
        "orders",
        [Message("n", message_id="none"), Message("o", message_id="own", time_to_live=HOUR)],
        timeout=5,
    )
    none, own = broker.peek("orders", max_messages=2)
    assert (none.time_to_live, none.expires_at) == (None, None)
    assert (own.time_to_live, own.expires_at) == (HOUR, clock.now + HOUR)


def test_a_deferred_message_held_by_a_session_takes_the_default_too(broker, make_entity):
    make_entity("sessions", sessions=True, default_message_time_to_live=HOUR)
    broker.send("sessions", [Message("x", message_id="x", session_id="s")], timeout=5)
    with broker.accept_session("sessions", "s") as session:
        (m,) = session.receive(mode="peek_lock")
        session.defer(m.lock_token)
        (again,) = session.receive_deferred([m.sequence_number])
    assert (m.time_to_live, again.time_to_live) == (HOUR, HOUR)
    assert again.state == "deferred"


def test_a_scheduled_messages_time_to_live_counts_from_its_scheduled_time(
    broker, make_entity, clock
):
    make_entity("hourly", default_message_time_to_live=HOUR)
    at = clock.now + timedelta(minutes=30)
    broker.schedule("hourly", [Message("s", message_id="s")], at, timeout=5)
    (peeked,) = broker.peek("hourly")
    assert peeked.expires_at == at + HOUR


def test_peek_reports_deferred_and_scheduled_states(broker, make_entity, clock):
    make_entity()
    broker.send(
        "orders", [Message("d", message_id="deferred"), Message("a", message_id="a")], timeout=5
    )
    broker.schedule(
        "orders",
        [Message("s", message_id="scheduled")],
        clock.now + timedelta(minutes=5),
        timeout=5,
    )
    (first,) = broker.receive("orders", mode="peek_lock")
    assert first.state == "active"
    broker.defer("orders", first.lock_token)
    states = {m.message_id: m.state for m in broker.peek("orders", max_messages=5)}
    assert states == {"deferred": "deferred", "a": "active", "scheduled": "scheduled"}
    (deferred,) = broker.receive_deferred("orders", [first.sequence_number])
    assert deferred.state == "deferred"
    broker.dead_letter("orders", deferred.lock_token, reason="r")
    (dead,) = broker.peek("orders", sub_queue="dead_letter")
    assert dead.state == "active"  # dead-lettering ends the deferral
    clock.advance(minutes=5)
    states = {m.message_id: m.state for m in broker.peek("orders", max_messages=5)}
    assert states == {"a": "active", "scheduled": "active"}  # due now


@pytest.mark.parametrize("subscription", [None, "audit"])
def test_the_transfer_dead_letter_subqueue_exists_and_is_empty(broker, make_entity, subscription):
    if subscription is None:
        make_entity("work")
    else:
        make_entity("work", kind="topic")
        broker.create_subscription("work", "audit")
    broker.send("work", [Message("x", message_id="x")], timeout=5)
    (m,) = broker.receive("work", subscription=subscription, mode="peek_lock")
    broker.dead_letter("work", m.lock_token, subscription=subscription, reason="r")
    where = {"subscription": subscription, "sub_queue": "transfer_dead_letter"}
    assert broker.peek("work", **where) == []
    assert broker.receive("work", **where) == []
    assert broker.count("work", **where) == 0
    # The dead-lettered message is in the dead-letter subqueue only.
    assert broker.count("work", subscription=subscription, sub_queue="dead_letter") == 1


def test_an_unknown_sub_queue_is_refused_naming_the_field(broker, make_entity):
    make_entity()
    with pytest.raises(ValidationError, match="transfer_dead_letter") as refused:
        broker.peek("orders", sub_queue="transfer")
    assert refused.value.field == "sub_queue"


def test_settlements_apply_properties_to_modify(broker, make_entity):
    make_entity()
    broker.send(
        "orders",
        [Message("x", message_id="x", application_properties={"kept": "yes", "n": 0})],
        timeout=5,
    )
    (first,) = broker.receive("orders", mode="peek_lock")
    broker.abandon("orders", first.lock_token, properties_to_modify={"n": 1, "by": b"\x01"})
    (second,) = broker.receive("orders", mode="peek_lock")
    assert dict(second.application_properties) == {"kept": "yes", "n": 1, "by": b"\x01"}
    assert set(second.modified_properties) == {"n", "by"}
    broker.defer("orders", second.lock_token, properties_to_modify={"deferred": True})
    (deferred,) = broker.receive_deferred("orders", [second.sequence_number])
    assert deferred.application_properties["deferred"] is True
    broker.dead_letter(
        "orders", deferred.lock_token, reason="r", properties_to_modify={"n": 2.5, "kept": None}
    )
    (dead,) = broker.receive("orders", sub_queue="dead_letter")
    assert dict(dead.application_properties) == {
        "kept": None,
        "n": 2.5,
        "by": b"\x01",
        "deferred": True,
    }
    assert dead.dead_letter_reason == "r"


def test_a_session_settlement_applies_properties_to_modify(broker, make_entity):
    make_entity("sessions", sessions=True)
    broker.send("sessions", [Message("x", message_id="x", session_id="s")], timeout=5)
    with broker.accept_session("sessions", "s") as session:
        (m,) = session.receive(mode="peek_lock")
        session.abandon(m, properties_to_modify={"attempt": 1})
        (m,) = session.receive(mode="peek_lock")
        assert m.application_properties == {"attempt": 1}
        session.dead_letter(m, properties_to_modify={"attempt": 2})
    (dead,) = broker.peek("sessions", sub_queue="dead_letter")
    assert dead.application_properties == {"attempt": 2}


@pytest.mark.parametrize(
    "bad",
    [["n", 1], {"": 1}, {1: "one"}, {"when": object()}, {"nested": {"a": 1}}],
)
def test_bad_properties_to_modify_are_refused_and_nothing_changes(broker, make_entity, bad):
    make_entity()
    broker.send("orders", [Message("x", message_id="x")], timeout=5)
    (m,) = broker.receive("orders", mode="peek_lock")
    with pytest.raises(ValidationError) as refused:
        broker.abandon("orders", m.lock_token, properties_to_modify=bad)
    assert refused.value.field == "properties_to_modify"
    broker.complete("orders", m.lock_token)  # still locked: the abandon did nothing
    assert broker.peek("orders") == []


def test_properties_to_modify_after_the_lock_is_lost_change_nothing(broker, make_entity, clock):
    make_entity()
    broker.send("orders", [Message("x", message_id="x")], timeout=5)
    (m,) = broker.receive("orders", mode="peek_lock", lock_duration=timedelta(seconds=5))
    clock.advance(seconds=6)
    with pytest.raises(LockLostError):
        broker.abandon("orders", m.lock_token, properties_to_modify={"n": 1})
    (again,) = broker.peek("orders")
    assert again.application_properties is None
