"""Scheduled messages at activation, on a real broker file, as Service Bus sequences them.

Service Bus appends a scheduled message at activation "as if it had been enqueued at the
current instant", with a new sequence number (message-sequencing doc); a topic keeps its
scheduled messages until due, so a subscription's peek does not show them and a
subscription created before activation gets them (message-browsing doc). The number the
schedule request returned cancels the message only while it waits.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendonce import EntityProfile, Message
from sendonce.backends import Ack
from sendonce.backends.local import LocalBackend, MessageNotFoundError


def msg(message_id: str, session_id: str | None = None, **kw: object) -> Message:
    return Message(message_id, message_id=message_id, session_id=session_id, **kw)  # type: ignore[arg-type]


def test_an_activated_message_gets_a_new_number_after_messages_sent_while_it_waited(
    broker, make_entity, clock
):
    make_entity()
    at = clock.now + timedelta(seconds=5)
    (scheduled,) = broker.schedule("orders", [msg("later")], at, timeout=5)
    (meanwhile,) = broker.send("orders", [msg("meanwhile")], timeout=5)
    clock.advance(seconds=5)
    (after,) = broker.send("orders", [msg("after")], timeout=5)
    got = broker.receive("orders", max_messages=5)
    assert [m.message_id for m in got] == ["meanwhile", "later", "after"]
    numbers = [m.sequence_number for m in got]
    assert numbers == sorted(numbers)
    assert got[1].sequence_number not in (scheduled.sequence_number, meanwhile.sequence_number)
    assert got[1].sequence_number < (after.sequence_number or 0)
    # Enqueued at activation, so its time to live counts from there.
    assert got[1].enqueued_time == got[1].scheduled_enqueue_time == at


def test_activation_orders_each_session_as_service_bus_does(make_entity, broker, clock):
    make_entity("carts", sessions=True)
    at = clock.now + timedelta(seconds=5)
    broker.schedule("carts", [msg("x-scheduled", "x")], at, timeout=5)
    broker.send("carts", [msg("x-meanwhile", "x"), msg("y-meanwhile", "y")], timeout=5)
    with broker.accept_session("carts", "x") as session:
        assert [m.message_id for m in session.receive(max_messages=5)] == ["x-meanwhile"]
        clock.advance(seconds=5)
        peeked = session.peek(max_messages=5)  # the first one is locked, not settled
        assert [m.message_id for m in peeked] == ["x-meanwhile", "x-scheduled"]
        (activated,) = session.receive(max_messages=5)
    assert activated.message_id == "x-scheduled"
    assert activated.enqueued_time == at


def test_a_session_with_only_a_due_scheduled_message_is_available(make_entity, broker, clock):
    make_entity("carts", sessions=True)
    broker.schedule("carts", [msg("c1", "c")], clock.now + timedelta(seconds=5), timeout=5)
    clock.advance(seconds=5)
    with broker.accept_session("carts", max_wait_time=0) as session:
        assert session.session_id == "c"
        assert [m.message_id for m in session.receive()] == ["c1"]


def test_expiry_counts_from_activation(broker, clock):
    broker.create_entity(EntityProfile("orders", default_message_time_to_live=timedelta(minutes=1)))
    broker.schedule("orders", [msg("later")], clock.now + timedelta(minutes=5), timeout=5)
    clock.advance(minutes=5, seconds=30)
    assert [m.message_id for m in broker.receive("orders")] == ["later"]


def test_a_topic_keeps_scheduled_messages_until_due_then_fans_out(broker, make_entity, clock):
    make_entity("events", kind="topic")
    broker.create_subscription("events", "early")
    at = clock.now + timedelta(seconds=5)
    (ack,) = broker.schedule("events", [msg("later")], at, timeout=5)
    assert broker.peek("events", subscription="early", max_messages=5) == []
    assert broker.message_ids("events", subscription="early") == []
    (waiting,) = broker.peek("events", max_messages=5)  # the topic's own view
    assert (waiting.message_id, waiting.sequence_number) == ("later", ack.sequence_number)
    broker.create_subscription("events", "joined")  # before activation: it gets the message
    clock.advance(seconds=5)
    for sub in ("early", "joined"):
        (got,) = broker.receive("events", subscription=sub, max_messages=5)
        assert got.message_id == "later" and got.sequence_number != ack.sequence_number
        assert got.enqueued_time == at
    broker.create_subscription("events", "late")  # after activation: it does not
    assert broker.receive("events", subscription="late") == []
    assert broker.peek("events") == []


def test_cancel_works_while_waiting_and_no_more_once_activated(broker, make_entity, clock):
    make_entity()
    make_entity("events", kind="topic")
    broker.create_subscription("events", "a")
    at = clock.now + timedelta(seconds=5)
    for entity, sub in (("orders", None), ("events", "a")):
        first, second = broker.schedule(
            entity, [msg(f"{entity}1"), msg(f"{entity}2")], at, timeout=5
        )
        broker.cancel_scheduled(entity, [first.sequence_number or 0])
        clock.advance(seconds=5)
        with pytest.raises(MessageNotFoundError, match=str(second.sequence_number)):
            broker.cancel_scheduled(entity, [second.sequence_number or 0], missing_ok=False)
        broker.cancel_scheduled(entity, [second.sequence_number or 0])  # activated: no effect
        got = broker.receive(entity, subscription=sub, max_messages=5)
        assert [m.message_id for m in got] == [f"{entity}2"]
        clock.advance(seconds=-5)


def test_a_refused_cancel_cancels_nothing(broker, make_entity, clock):
    make_entity()
    (kept,) = broker.schedule("orders", [msg("kept")], clock.now + timedelta(minutes=1), timeout=5)
    with pytest.raises(MessageNotFoundError, match="424242"):
        broker.cancel_scheduled("orders", [kept.sequence_number or 0, 424242], missing_ok=False)
    assert broker.message_ids("orders") == ["kept"]


def test_a_scheduled_duplicate_returns_its_own_number_that_names_no_message(
    broker, make_entity, clock
):
    make_entity()
    at = clock.now + timedelta(minutes=1)
    (first,) = broker.schedule("orders", [msg("a")], at, timeout=5)
    (copy,) = broker.schedule("orders", [msg("a")], at, timeout=5)
    assert first == Ack("accepted", 1) and copy == Ack("duplicate", 2)
    with pytest.raises(MessageNotFoundError):
        broker.cancel_scheduled("orders", [2], missing_ok=False)
    assert broker.message_ids("orders") == ["a"]


def test_a_read_only_handle_shows_due_messages_with_the_numbers_activation_gives(
    db, broker, make_entity, clock
):
    make_entity()
    broker.send("orders", [msg("first")], timeout=5)
    broker.schedule("orders", [msg("s1"), msg("s2")], clock.now + timedelta(seconds=5), timeout=5)
    broker.send("orders", [msg("second")], timeout=5)
    clock.advance(seconds=5)
    with LocalBackend(db, clock=clock, read_only=True) as reader:
        seen = [(m.message_id, m.sequence_number) for m in reader.peek("orders", max_messages=9)]
        assert reader.count("orders") == 4
        assert reader.message_ids("orders") == ["first", "second", "s1", "s2"]
        assert reader.stats("orders")["last_sequence_number"] == 6
    assert seen == [("first", 1), ("second", 4), ("s1", 5), ("s2", 6)]
    got = broker.receive("orders", max_messages=9)
    assert [(m.message_id, m.sequence_number) for m in got] == seen


def test_a_due_message_expired_before_activation_is_not_peeked(broker, clock):
    broker.create_entity(EntityProfile("orders"))
    broker.schedule(
        "orders",
        [msg("short", time_to_live=timedelta(seconds=10))],
        clock.now + timedelta(seconds=5),
        timeout=5,
    )
    clock.advance(seconds=30)
    assert broker.peek("orders") == []
    assert broker.receive("orders") == []


def test_after_cancelling_the_earliest_the_next_still_activates_on_time(broker, make_entity, clock):
    make_entity()
    (first,) = broker.schedule("orders", [msg("a")], clock.now + timedelta(seconds=5), timeout=5)
    broker.schedule("orders", [msg("b")], clock.now + timedelta(seconds=10), timeout=5)
    broker.cancel_scheduled("orders", [first.sequence_number or 0])
    clock.advance(seconds=5)
    assert broker.receive("orders") == [] and broker.count("orders") == 0
    clock.advance(seconds=5)
    assert broker.count("orders") == 1
    assert [m.message_id for m in broker.receive("orders")] == ["b"]
