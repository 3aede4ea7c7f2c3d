"""The unmodified azure-servicebus client against the emulator, over a real socket.

Senders are opened with ``keep_alive=None``: the client's keep-alive thread
sleeps in 1 s steps and makes every close wait up to a second.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
)
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

from sendonce import EntityProfile, Message
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator, FaultAction

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def client(emu: Emulator) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(emu.connection_string, retry_total=0)


def drain(
    sb: ServiceBusClient, queue: str, expected: int, *, subscription: str | None = None
) -> list[ServiceBusReceivedMessage]:
    """Receive in receive-and-delete mode until ``expected`` messages came (or 5 s of nothing)."""
    if subscription is None:
        receiver = sb.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        )
    else:
        receiver = sb.get_subscription_receiver(
            queue, subscription, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        )
    got: list[ServiceBusReceivedMessage] = []
    with receiver:
        while len(got) < expected:
            batch = receiver.receive_messages(
                max_message_count=expected - len(got), max_wait_time=5
            )
            if not batch:
                break
            got.extend(batch)
    return got


def body(message: ServiceBusReceivedMessage) -> bytes:
    return b"".join(message.body)


def test_single_list_and_batch_sends_arrive_in_order(
    emulator: Emulator, store: LocalBackend
) -> None:
    with client(emulator) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage(b"one", message_id="o-1"), timeout=10)
            sender.send_messages(
                [
                    ServiceBusMessage(b"two", message_id="o-2"),
                    ServiceBusMessage("three", message_id="o-3"),
                ],
                timeout=10,
            )
            batch = sender.create_message_batch()
            batch.add_message(ServiceBusMessage(b"four", message_id="o-4"))
            batch.add_message(ServiceBusMessage(b"five", message_id="o-5"))
            sender.send_messages(batch, timeout=10)
        assert store.message_ids("orders") == ["o-1", "o-2", "o-3", "o-4", "o-5"]
        got = drain(sb, "orders", 5)
    assert [m.message_id for m in got] == ["o-1", "o-2", "o-3", "o-4", "o-5"]
    assert [body(m) for m in got] == [b"one", b"two", b"three", b"four", b"five"]
    numbers = [m.sequence_number or 0 for m in got]
    assert numbers == sorted(numbers) and len(set(numbers)) == 5
    assert all(m.enqueued_time_utc is not None for m in got)
    assert store.count("orders") == 0


def test_duplicates_are_accepted_and_dropped_per_inner_message(
    emulator: Emulator, store: LocalBackend
) -> None:
    with client(emulator) as sb, sb.get_queue_sender("orders", keep_alive=None) as sender:
        sender.send_messages(ServiceBusMessage(b"a", message_id="d-1"), timeout=10)
        batch = sender.create_message_batch()
        batch.add_message(ServiceBusMessage(b"a again", message_id="d-1"))  # duplicate
        batch.add_message(ServiceBusMessage(b"b", message_id="d-2"))  # new
        sender.send_messages(batch, timeout=10)
        sender.send_messages(ServiceBusMessage(b"b again", message_id="d-2"), timeout=10)
    assert store.message_ids("orders") == ["d-1", "d-2"]
    assert [m.body for m in store.peek("orders", max_messages=10)] == [b"a", b"b"]


def test_properties_survive_the_round_trip(emulator: Emulator) -> None:
    sent = ServiceBusMessage(
        b'{"order": 1}',
        message_id="p-1",
        partition_key="customer-7",
        subject="order-created",
        content_type="application/json",
        correlation_id="corr-1",
        application_properties={"tenant": "acme", "attempt": 3, "ratio": 0.5, "vip": True},
        time_to_live=timedelta(minutes=5),
    )
    with client(emulator) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(sent, timeout=10)
        (got,) = drain(sb, "orders", 1)
    assert got.message_id == "p-1"
    assert got.partition_key == "customer-7"
    assert got.subject == "order-created"
    assert got.content_type == "application/json"
    assert got.correlation_id == "corr-1"
    assert got.time_to_live == timedelta(minutes=5)
    props = {
        k.decode() if isinstance(k, bytes) else k: v
        for k, v in (got.application_properties or {}).items()
    }
    assert props["attempt"] == 3 and props["ratio"] == 0.5 and props["vip"] is True
    assert props["tenant"] in ("acme", b"acme")
    assert body(got) == b'{"order": 1}'


def test_scheduled_messages_arrive_after_their_time(
    emulator: Emulator, store: LocalBackend
) -> None:
    at = datetime.now(UTC) + timedelta(seconds=1)
    with client(emulator) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            numbers = sender.schedule_messages(
                [
                    ServiceBusMessage(b"s1", message_id="s-1"),
                    ServiceBusMessage(b"s2", message_id="s-2"),
                ],
                at,
                timeout=10,
            )
            assert len(numbers) == 2 and all(isinstance(n, int) for n in numbers)
            assert store.count("orders") == 0  # not visible before its time
            assert store.message_ids("orders") == ["s-1", "s-2"]
            # scheduled ids share the duplicate-detection space with ordinary sends
            sender.send_messages(ServiceBusMessage(b"dup", message_id="s-1"), timeout=10)
        got = drain(sb, "orders", 2)
    assert [m.message_id for m in got] == ["s-1", "s-2"]
    # Activation appends them under new numbers, after the duplicate send's (message sequencing).
    assert [m.sequence_number for m in got] == [max(numbers) + 2, max(numbers) + 3]
    assert got[0].scheduled_enqueue_time_utc is not None


def test_cancel_scheduled_message(emulator: Emulator, store: LocalBackend) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    with client(emulator) as sb, sb.get_queue_sender("orders", keep_alive=None) as sender:
        (n1,) = sender.schedule_messages(ServiceBusMessage(b"x", message_id="c-1"), at, timeout=10)
        (n2,) = sender.schedule_messages(ServiceBusMessage(b"y", message_id="c-2"), at, timeout=10)
        sender.cancel_scheduled_messages(n1, timeout=10)
    assert [m.sequence_number for m in store.peek("orders", max_messages=10)] == [n2]


def test_peek_lock_complete_and_abandon(emulator: Emulator, store: LocalBackend) -> None:
    with client(emulator) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(b"1", message_id="l-1"),
                    ServiceBusMessage(b"2", message_id="l-2"),
                ],
                timeout=10,
            )
        with sb.get_queue_receiver("orders") as receiver:
            first = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            assert [m.message_id for m in first] == ["l-1", "l-2"]
            assert all(m.lock_token and m.locked_until_utc for m in first)
            assert store.count("orders") == 0  # both locked
            receiver.complete_message(first[0])
            receiver.abandon_message(first[1])
            again = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert [m.message_id for m in again] == ["l-2"]
            assert again[0].delivery_count == 1
            receiver.complete_message(again[0])
    assert store.message_ids("orders") == []


def test_peek_messages_through_management(emulator: Emulator) -> None:
    with client(emulator) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage(b"peek", message_id="k-1"), timeout=10)
        with sb.get_queue_receiver("orders") as receiver:
            peeked = receiver.peek_messages(max_message_count=5, timeout=10)
    assert [m.message_id for m in peeked] == ["k-1"]


def test_topic_fans_out_to_subscriptions(emulator: Emulator, store: LocalBackend) -> None:
    with client(emulator) as sb:
        with sb.get_topic_sender("events", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage(b"e", message_id="e-1"), timeout=10)
            sender.send_messages(ServiceBusMessage(b"e", message_id="e-1"), timeout=10)  # dup
        a = drain(sb, "events", 1, subscription="a")
        b = drain(sb, "events", 1, subscription="b")
    assert [m.message_id for m in a] == ["e-1"] and [m.message_id for m in b] == ["e-1"]
    assert store.count("events", subscription="a") == 0


def test_unknown_entity_is_refused(emulator: Emulator) -> None:
    with (
        client(emulator) as sb,
        pytest.raises(ServiceBusError),
        sb.get_queue_sender("nope", keep_alive=None) as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"x", message_id="n-1"), timeout=10)


def test_local_and_emulator_messages_interoperate(emulator: Emulator, store: LocalBackend) -> None:
    store.send("orders", [Message(b"from local", message_id="i-1", subject="s")], timeout=5)
    with client(emulator) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage(b"from client", message_id="i-2"), timeout=10)
        got = drain(sb, "orders", 1)
        assert [(m.message_id, body(m), m.subject) for m in got] == [("i-1", b"from local", "s")]
    (received,) = store.receive("orders")
    assert (received.message_id, received.body) == ("i-2", b"from client")


def test_renew_lock_and_dead_letter(emulator: Emulator, store: LocalBackend) -> None:
    with client(emulator) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage(b"r", message_id="rl-1"), timeout=10)
        with sb.get_queue_receiver("orders") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            before = message.locked_until_utc
            renewed = receiver.renew_message_lock(message, timeout=10)
            assert before is not None and renewed >= before
            receiver.dead_letter_message(message, reason="test")
    # the message leaves the queue for its dead-letter subqueue
    assert store.message_ids("orders") == []
    (dead,) = store.peek("orders", sub_queue="dead_letter")
    assert (dead.message_id, dead.dead_letter_reason) == ("rl-1", "test")


def test_waiting_receiver_gets_a_message_stored_later_through_local(
    emulator: Emulator, broker_path: Path
) -> None:
    def produce() -> None:
        with LocalBackend(broker_path) as producer:
            producer.send("orders", [Message(b"late", message_id="late-1")], timeout=5)

    with client(emulator) as sb, sb.get_queue_receiver("orders") as receiver:
        timer = threading.Timer(0.3, produce)
        timer.start()
        try:
            got = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        finally:
            timer.join()
        assert [m.message_id for m in got] == ["late-1"]
        receiver.complete_message(got[0])


def test_large_messages_and_the_link_size_limit(emulator: Emulator, store: LocalBackend) -> None:
    big = bytes(range(256)) * 800  # 200 KB: several AMQP frames
    with client(emulator) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage(big, message_id="big-1"), timeout=10)
            with pytest.raises(MessageSizeExceededError):  # amqp:link:message-size-exceeded
                sender.send_messages(ServiceBusMessage(big * 2, message_id="big-2"), timeout=10)
        (got,) = drain(sb, "orders", 1)
    assert body(got) == big
    assert store.message_ids("orders") == []


def test_the_clients_own_retries_are_deduplicated(emulator: Emulator, store: LocalBackend) -> None:
    """With its default retries the client resends an in-doubt message by itself."""
    emulator.faults.add(FaultAction.DROP_AFTER_COMMIT)
    sb = ServiceBusClient.from_connection_string(
        emulator.connection_string, retry_backoff_factor=0.01
    )
    with sb, sb.get_queue_sender("orders", keep_alive=None) as sender:
        sender.send_messages(ServiceBusMessage(b"x", message_id="self-1"), timeout=10)
    assert emulator.transfers("orders") == 2
    assert store.message_ids("orders") == ["self-1"]


def test_session_receivers(emulator: Emulator, store: LocalBackend) -> None:
    store.create_entity(EntityProfile("carts", sessions=True))
    with client(emulator) as sb:
        with sb.get_queue_sender("carts", keep_alive=None) as sender:
            for message_id, session in (("a1", "A"), ("b1", "B"), ("a2", "A")):
                message = ServiceBusMessage(message_id, message_id=message_id, session_id=session)
                sender.send_messages(message, timeout=10)
        with sb.get_queue_receiver("carts", session_id="A") as receiver:
            assert receiver.session.session_id == "A"
            got = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            assert [(m.message_id, m.session_id) for m in got] == [("a1", "A"), ("a2", "A")]
            receiver.session.set_state(b"step-2")
            assert receiver.session.get_state() == b"step-2"
            assert receiver.session.renew_lock() > datetime.now(UTC)
            for m in got:
                receiver.complete_message(m)
            # session A is held: a second receiver cannot lock it
            with pytest.raises(ServiceBusError), sb.get_queue_receiver("carts", session_id="A"):
                pass
        with sb.get_queue_receiver("carts", session_id=NEXT_AVAILABLE_SESSION) as receiver:
            assert receiver.session.session_id == "B"
            (b1,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.complete_message(b1)
        # a session entity refuses a plain receiver
        with pytest.raises(ServiceBusError), sb.get_queue_receiver("carts") as plain:
            plain.receive_messages(max_wait_time=1)
    assert store.message_ids("carts") == []


def test_the_asyncio_client_works_too(emulator: Emulator, store: LocalBackend) -> None:
    from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

    async def roundtrip() -> list[str | None]:
        sb = AsyncServiceBusClient.from_connection_string(emulator.connection_string)
        async with sb, sb.get_queue_sender("orders", keep_alive=None) as sender:
            await sender.send_messages(
                [
                    ServiceBusMessage(b"a", message_id="aio-1"),
                    ServiceBusMessage(b"b", message_id="aio-2"),
                ],
                timeout=10,
            )
            async with sb.get_queue_receiver("orders") as receiver:
                got = await receiver.receive_messages(max_message_count=2, max_wait_time=5)
                for m in got:
                    await receiver.complete_message(m)
                return [m.message_id for m in got]

    assert asyncio.run(roundtrip()) == ["aio-1", "aio-2"]
    assert store.message_ids("orders") == []
