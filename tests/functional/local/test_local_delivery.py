"""Scheduled messages, topics, sessions and peek-lock on a real broker file."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendonce import ConfigurationError, Message
from sendonce.backends import Ack
from sendonce.backends.local import LockLostError


def msg(message_id: str, body: str = "b", **kw: object) -> Message:
    return Message(body, message_id=message_id, **kw)  # type: ignore[arg-type]


# -- scheduled messages ----------------------------------------------------------------


def test_scheduled_then_ordinary_same_id_is_duplicate(broker, make_entity, clock):
    make_entity()
    (ack,) = broker.schedule("orders", [msg("a")], clock.now + timedelta(minutes=1), timeout=5)
    assert ack.outcome == "accepted" and ack.sequence_number is not None
    assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]
    assert broker.message_ids("orders") == ["a"]


def test_ordinary_then_scheduled_same_id_is_duplicate(broker, make_entity, clock):
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    acks = broker.schedule("orders", [msg("a")], clock.now + timedelta(minutes=1), timeout=5)
    # The dropped copy still gets its own sequence number (Azure/azure-service-bus#265).
    assert acks == [Ack("duplicate", 2)]
    assert broker.stats("orders")["scheduled"] == 0


def test_scheduled_message_is_delivered_only_from_its_time(broker, make_entity, clock):
    make_entity()
    broker.schedule("orders", [msg("later")], clock.now + timedelta(minutes=5), timeout=5)
    broker.send("orders", [msg("now")], timeout=5)
    assert broker.count("orders") == 1
    assert [m.message_id for m in broker.receive("orders", max_messages=5)] == ["now"]
    assert broker.receive("orders") == []
    assert broker.message_ids("orders") == ["later"]
    clock.advance(minutes=5)
    (got,) = broker.receive("orders")
    assert got.message_id == "later"
    assert got.scheduled_enqueue_time == clock.now


def test_scheduled_enqueue_time_on_the_message_schedules_it(broker, make_entity, clock):
    make_entity()
    broker.send(
        "orders", [msg("a", scheduled_enqueue_time=clock.now + timedelta(seconds=30))], timeout=5
    )
    assert broker.count("orders") == 0
    clock.advance(seconds=30)
    assert broker.count("orders") == 1


def test_cancel_scheduled_removes_it_but_keeps_the_id(broker, make_entity, clock):
    make_entity()
    acks = broker.schedule(
        "orders", [msg("a"), msg("b")], clock.now + timedelta(minutes=1), timeout=5
    )
    broker.cancel_scheduled("orders", [acks[0].sequence_number or 0])
    assert broker.message_ids("orders") == ["b"]
    assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]


def test_cancel_scheduled_on_a_topic_removes_every_copy(broker, make_entity, clock):
    make_entity("events", kind="topic")
    broker.create_subscription("events", "a")
    broker.create_subscription("events", "b")
    (ack,) = broker.schedule("events", [msg("x")], clock.now + timedelta(minutes=1), timeout=5)
    broker.cancel_scheduled("events", [ack.sequence_number or 0])
    assert broker.message_ids("events") == []


# -- topics ----------------------------------------------------------------------------


def test_topic_dedups_before_fan_out(broker, make_entity):
    make_entity("events", kind="topic")
    broker.create_subscription("events", "billing")
    broker.create_subscription("events", "audit")
    assert broker.subscriptions("events") == ["audit", "billing"]
    broker.send("events", [msg("a"), msg("b")], timeout=5)
    assert broker.send("events", [msg("a")], timeout=5) == [Ack("duplicate")]
    for sub in ("billing", "audit"):
        assert broker.message_ids("events", subscription=sub) == ["a", "b"]
    assert broker.message_ids("events") == ["a", "b"]
    # Taking a copy from one subscription leaves the other's.
    assert len(broker.receive("events", subscription="billing", max_messages=5)) == 2
    assert broker.count("events", subscription="audit") == 2
    assert broker.count("events", subscription="billing") == 0


def test_subscription_gets_messages_from_its_creation_on(broker, make_entity):
    make_entity("events", kind="topic")
    broker.send("events", [msg("before")], timeout=5)
    broker.create_subscription("events", "late")
    broker.send("events", [msg("after")], timeout=5)
    assert broker.message_ids("events", subscription="late") == ["after"]


def test_topic_and_queue_misuse_name_the_field(broker, make_entity):
    make_entity("events", kind="topic")
    make_entity("orders")
    broker.create_subscription("events", "s")
    with pytest.raises(ConfigurationError) as no_sub:
        broker.receive("events")
    assert no_sub.value.field == "subscription"
    with pytest.raises(ConfigurationError) as unknown:
        broker.receive("events", subscription="nope")
    assert unknown.value.field == "subscription"
    with pytest.raises(ConfigurationError) as queue:
        broker.create_subscription("orders", "s")
    assert queue.value.field == "topic"
    with pytest.raises(ConfigurationError):
        broker.create_subscription("events", "s")
    broker.create_subscription("events", "s", exist_ok=True)


# -- sessions --------------------------------------------------------------------------


def test_receive_by_session_returns_that_sessions_messages_in_order(broker, make_entity):
    make_entity(sessions=True)
    sent = [msg(f"m{i}", session_id=f"s{i % 2}") for i in range(6)]
    broker.send("orders", sent, timeout=5)
    got = broker.receive("orders", session_id="s1", max_messages=10)
    assert [m.message_id for m in got] == ["m1", "m3", "m5"]
    assert {m.session_id for m in got} == {"s1"}
    assert [m.message_id for m in broker.peek("orders", session_id="s0", max_messages=10)] == [
        "m0",
        "m2",
        "m4",
    ]


def test_session_stands_in_for_partition_key_on_partitioned_entity(broker, make_entity):
    make_entity(partitioned=True, sessions=True)
    acks = broker.send(
        "orders",
        [msg("a", session_id="s1"), msg("a", session_id="s2"), msg("a", session_id="s1")],
        timeout=5,
    )
    assert [a.outcome for a in acks] == ["accepted", "accepted", "duplicate"]


# -- peek-lock -------------------------------------------------------------------------


def test_peek_lock_complete(broker, make_entity, clock):
    make_entity()
    broker.send("orders", [msg("a"), msg("b")], timeout=5)
    (locked,) = broker.receive("orders", mode="peek_lock")
    assert locked.message_id == "a" and locked.lock_token
    assert locked.locked_until == clock.now + timedelta(seconds=60)
    assert broker.count("orders") == 1
    assert broker.stats("orders")["locked"] == 1
    broker.complete("orders", locked.lock_token)
    assert broker.message_ids("orders") == ["b"]
    with pytest.raises(LockLostError):
        broker.complete("orders", locked.lock_token)


def test_expired_lock_makes_the_message_available_again(broker, make_entity, clock):
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    (first,) = broker.receive("orders", mode="peek_lock", lock_duration=timedelta(seconds=30))
    assert broker.receive("orders", mode="peek_lock") == []
    clock.advance(seconds=29)
    assert broker.count("orders") == 0
    clock.advance(seconds=2)
    assert broker.count("orders") == 1
    with pytest.raises(LockLostError):
        broker.complete("orders", first.lock_token or "")
    (second,) = broker.receive("orders", mode="peek_lock")
    assert second.message_id == "a" and second.delivery_count == 2
    assert second.lock_token != first.lock_token
    broker.complete("orders", second.lock_token or "")
    assert broker.message_ids("orders") == []


def test_abandon_releases_the_lock(broker, make_entity):
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    (locked,) = broker.receive("orders", mode="peek_lock")
    broker.abandon("orders", locked.lock_token or "")
    (again,) = broker.receive("orders")
    assert again.message_id == "a" and again.delivery_count == 2


def test_renew_lock_extends_it(broker, make_entity, clock):
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    (locked,) = broker.receive("orders", mode="peek_lock", lock_duration=timedelta(seconds=10))
    clock.advance(seconds=8)
    until = broker.renew_lock(
        "orders", locked.lock_token or "", lock_duration=timedelta(seconds=10)
    )
    assert until == clock.now + timedelta(seconds=10)
    clock.advance(seconds=8)
    broker.complete("orders", locked.lock_token or "")


def test_receive_and_delete_and_peek(broker, make_entity):
    make_entity()
    broker.send("orders", [msg(f"m{i}") for i in range(5)], timeout=5)
    peeked = broker.peek("orders", max_messages=10)
    assert [m.message_id for m in peeked] == [f"m{i}" for i in range(5)]
    start = peeked[2].sequence_number
    assert [m.message_id for m in broker.peek("orders", from_sequence_number=start)] == ["m2"]
    got = broker.receive("orders", max_messages=2)
    assert [m.message_id for m in got] == ["m0", "m1"]
    assert broker.count("orders") == 3
    assert broker.purge("orders") == 3
    assert broker.count("orders") == 0
    # Purging does not reopen the window.
    assert broker.send("orders", [msg("m4")], timeout=5) == [Ack("duplicate")]
