"""Message fidelity through the unmodified azure-servicebus client, over a real socket: the
time to live an entity's default gives, message states in a peek, and the transfer
dead-letter subqueue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageSizeExceededError, MessagingEntityNotFoundError

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]

HOUR = timedelta(hours=1)


def test_a_message_without_a_time_to_live_reports_the_entitys_default(
    emulator: Emulator, store: LocalBackend
) -> None:
    store.create_entity(EntityProfile("hourly", default_message_time_to_live=HOUR))
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("hourly") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("none", message_id="none"),
                    ServiceBusMessage("own", message_id="own", time_to_live=timedelta(minutes=1)),
                    ServiceBusMessage("long", message_id="long", time_to_live=timedelta(days=2)),
                ]
            )
        with sb.get_queue_receiver("hourly") as receiver:
            peeked = {str(m.message_id): m for m in receiver.peek_messages(max_message_count=3)}
        with sb.get_queue_receiver(
            "hourly", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            received = {
                str(m.message_id): m
                for m in receiver.receive_messages(max_message_count=3, max_wait_time=5)
            }
    for messages in (peeked, received):
        none, own, long = messages["none"], messages["own"], messages["long"]
        assert none.time_to_live == HOUR
        assert none.expires_at_utc == none.enqueued_time_utc + HOUR
        assert own.time_to_live == timedelta(minutes=1)
        # Longer than the entity's default: "silently adjusted" to it.
        assert long.time_to_live == HOUR
        assert long.expires_at_utc == long.enqueued_time_utc + HOUR


def test_an_entity_without_a_default_leaves_the_time_to_live_unset(
    emulator: Emulator, store: LocalBackend
) -> None:
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("x", message_id="x"))
        with sb.get_queue_receiver("orders") as receiver:
            (peeked,) = receiver.peek_messages(max_message_count=1)
    assert peeked.time_to_live is None
    assert peeked.expires_at_utc is None


def test_a_peeked_deferred_message_reads_deferred(emulator: Emulator) -> None:
    later = datetime.now(UTC) + timedelta(minutes=10)
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("d", message_id="deferred"),
                    ServiceBusMessage("a", message_id="a"),
                ]
            )
            sender.schedule_messages(ServiceBusMessage("s", message_id="scheduled"), later)
        with sb.get_queue_receiver("orders") as receiver:
            (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert first.state == ServiceBusMessageState.ACTIVE
            receiver.defer_message(first)
        # A new receiver: a receiver's peek starts after the last message it received.
        with sb.get_queue_receiver("orders") as receiver:
            states = {str(m.message_id): m.state for m in receiver.peek_messages(10)}
    assert states == {
        "deferred": ServiceBusMessageState.DEFERRED,
        "a": ServiceBusMessageState.ACTIVE,
        "scheduled": ServiceBusMessageState.SCHEDULED,
    }


@pytest.mark.parametrize("subscription", [None, "a"])
def test_the_transfer_dead_letter_subqueue_exists_and_is_empty(
    emulator: Emulator, store: LocalBackend, subscription: str | None
) -> None:
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        if subscription is None:
            with sb.get_queue_sender("orders") as sender:
                sender.send_messages(ServiceBusMessage("x", message_id="x"))
            receiver = sb.get_queue_receiver(
                "orders", sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER
            )
        else:
            with sb.get_topic_sender("events") as sender:
                sender.send_messages(ServiceBusMessage("x", message_id="x"))
            receiver = sb.get_subscription_receiver(
                "events", subscription, sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER
            )
        with receiver:
            assert receiver.receive_messages(max_message_count=5, max_wait_time=1) == []
            assert receiver.peek_messages(max_message_count=5) == []
    # The message itself is where it was sent, untouched.
    assert [
        m.message_id
        for m in store.peek(
            "orders" if subscription is None else "events", subscription=subscription
        )
    ] == ["x"]


def test_sending_to_the_transfer_dead_letter_subqueue_is_refused(emulator: Emulator) -> None:
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with (
            pytest.raises(MessagingEntityNotFoundError, match="cannot send to a dead-letter"),
            sb.get_queue_sender("orders/$Transfer/$DeadLetterQueue") as sender,
        ):
            sender.send_messages(ServiceBusMessage("x", message_id="x"), timeout=10)


def test_a_property_over_32_kb_is_refused_as_too_large_and_nothing_is_stored(
    emulator: Emulator, store: LocalBackend
) -> None:
    big = ServiceBusMessage(
        "small body", message_id="big", application_properties={"trace": "x" * 40 * 1024}
    )
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("orders") as sender:
            with pytest.raises(MessageSizeExceededError, match="'trace'"):
                sender.send_messages(big, timeout=10)
            # A batch holding it is refused whole, as Service Bus refuses a batch.
            batch = sender.create_message_batch()
            batch.add_message(ServiceBusMessage("ok", message_id="ok"))
            batch.add_message(big)
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(batch, timeout=10)
            sender.send_messages(ServiceBusMessage("after", message_id="after"), timeout=10)
    assert [m.message_id for m in store.peek("orders", max_messages=5)] == ["after"]


def test_properties_over_64_kb_together_are_refused(
    emulator: Emulator, store: LocalBackend
) -> None:
    props = {f"p{i}": "v" * 30_000 for i in range(3)}
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("orders") as sender:
            with pytest.raises(MessageSizeExceededError, match="together"):
                sender.send_messages(
                    ServiceBusMessage("b", message_id="m", application_properties=props),
                    timeout=10,
                )
    assert store.peek("orders") == []


def test_properties_a_settlement_modified_reach_the_client(
    emulator: Emulator, store: LocalBackend
) -> None:
    """A local:// consumer abandons with properties to modify (the Python client cannot send
    them; the JavaScript scenario properties_to_modify.js sends them to the emulator): the
    client reads them over the sender's own, which stay as sent."""
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(
                ServiceBusMessage("x", message_id="x", application_properties={"kept": "yes"})
            )
        (m,) = store.receive("orders", mode="peek_lock")
        store.abandon("orders", m.lock_token, properties_to_modify={"attempt": 1, "kept": "no"})
        with sb.get_queue_receiver("orders") as receiver:
            (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.complete_message(got)
    assert got.application_properties == {b"kept": b"no", b"attempt": 1}


def test_scheduling_a_message_with_a_property_over_32_kb_is_refused(
    emulator: Emulator, store: LocalBackend
) -> None:
    big = ServiceBusMessage("x", message_id="x", application_properties={"t": "x" * 40_000})
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("orders") as sender:
            with pytest.raises(MessageSizeExceededError, match="'t'"):
                sender.schedule_messages(big, datetime.now(UTC) + timedelta(minutes=1))
    assert store.peek("orders") == []
