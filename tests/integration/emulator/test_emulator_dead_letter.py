"""Dead-letter subqueues through the unmodified azure-servicebus client, over a real socket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def client(emu: Emulator) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(emu.connection_string, retry_total=0)


def send(sb: ServiceBusClient, entity: str, *ids: str) -> None:
    with sb.get_queue_sender(entity, keep_alive=None) as sender:
        sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids], timeout=10)


def test_dead_letter_message_and_read_it_back(emulator: Emulator, store: LocalBackend) -> None:
    with client(emulator) as sb:
        send(sb, "orders", "poison", "fine")
        with sb.get_queue_receiver("orders") as receiver:
            first, second = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            receiver.dead_letter_message(
                first, reason="BadFormat", error_description="field x is missing"
            )
            receiver.complete_message(second)
        with sb.get_queue_receiver("orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (peeked,) = dlq.peek_messages(max_message_count=5)
            assert peeked.message_id == "poison"
            (dead,) = dlq.receive_messages(max_message_count=5, max_wait_time=5)
            assert dead.message_id == "poison" and str(dead) == "poison"
            assert dead.dead_letter_reason == "BadFormat"
            assert dead.dead_letter_error_description == "field x is missing"
            assert dead.sequence_number == peeked.sequence_number == 1
            dlq.complete_message(dead)
    assert store.peek("orders", sub_queue="dead_letter") == []
    assert store.peek("orders") == []
    # dead-lettering kept the id in the duplicate-detection history: a resend is dropped
    with client(emulator) as sb:
        send(sb, "orders", "poison")
    assert store.peek("orders") == []


def test_subscription_dead_letter_queue(emulator: Emulator, store: LocalBackend) -> None:
    with client(emulator) as sb:
        with sb.get_topic_sender("events", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("e", message_id="e-1"), timeout=10)
        with sb.get_subscription_receiver("events", "a") as receiver:
            (m,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.dead_letter_message(m, reason="r", error_description="d")
        with sb.get_subscription_receiver(
            "events", "a", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dlq:
            (dead,) = dlq.receive_messages(max_message_count=5, max_wait_time=5)
            assert (dead.message_id, dead.dead_letter_reason) == ("e-1", "r")
            dlq.complete_message(dead)
    (other,) = store.receive("events", subscription="b")
    assert other.message_id == "e-1"


def test_abandoned_too_often_is_dead_lettered(emulator: Emulator, store: LocalBackend) -> None:
    store.create_entity(EntityProfile("fragile", max_delivery_count=2))
    with client(emulator) as sb:
        send(sb, "fragile", "poison")
        with sb.get_queue_receiver("fragile") as receiver:
            for attempt in (1, 2):
                (m,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                assert m.delivery_count == attempt - 1  # Service Bus counts from 0 on the wire
                receiver.abandon_message(m)
            assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
        with sb.get_queue_receiver("fragile", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = dlq.receive_messages(max_message_count=1, max_wait_time=5)
            assert dead.message_id == "poison"
            assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
            assert dead.dead_letter_error_description == (
                "Message could not be consumed after 2 delivery attempts."
            )
            dlq.complete_message(dead)
    assert store.peek("fragile") == [] and store.peek("fragile", sub_queue="dead_letter") == []


@pytest.mark.parametrize("entity", ["queue", "subscription"])
def test_the_abandon_that_reaches_max_delivery_count_dead_letters_at_once(
    emulator: Emulator, store: LocalBackend, entity: str
) -> None:
    """As Service Bus: the abandon itself moves the message, so a peek right after it (no
    receive in between) finds it in the dead-letter subqueue and not in the entity."""
    if entity == "queue":
        store.create_entity(EntityProfile("fragile", max_delivery_count=2))
    else:
        store.create_entity(EntityProfile("signals", kind="topic"))
        store.create_subscription("signals", "fragile", max_delivery_count=2)

    def receiver(sb: ServiceBusClient, **options: Any) -> ServiceBusReceiver:
        if entity == "queue":
            return sb.get_queue_receiver("fragile", **options)
        return sb.get_subscription_receiver("signals", "fragile", **options)

    with client(emulator) as sb:
        address = "fragile" if entity == "queue" else "signals"
        sender = sb.get_queue_sender if entity == "queue" else sb.get_topic_sender
        with sender(address, keep_alive=None) as link:
            link.send_messages(ServiceBusMessage("poison", message_id="poison"), timeout=10)
        with receiver(sb) as main:
            (m,) = main.receive_messages(max_message_count=1, max_wait_time=5)
            main.abandon_message(m)  # delivery 1 of 2: it stays
            # (from sequence number 1: the client would start after the last one received)
            peeked = main.peek_messages(max_message_count=5, sequence_number=1)
            assert [p.message_id for p in peeked] == ["poison"]
            (m,) = main.receive_messages(max_message_count=1, max_wait_time=5)
            main.abandon_message(m)  # delivery 2 of 2: dead-lettered by this abandon
            assert main.peek_messages(max_message_count=5, sequence_number=1) == []
        with receiver(sb, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = dlq.peek_messages(max_message_count=5)
            assert dead.message_id == "poison"
            assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
            assert dead.dead_letter_error_description == (
                "Message could not be consumed after 2 delivery attempts."
            )


def test_the_asyncio_client_dead_letters(emulator: Emulator, store: LocalBackend) -> None:
    async def run() -> tuple[str | None, str | None]:
        async with AsyncServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as sb:
            async with sb.get_queue_sender("orders") as sender:
                await sender.send_messages(ServiceBusMessage("x", message_id="a-1"), timeout=10)
            async with sb.get_queue_receiver("orders") as receiver:
                (m,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                await receiver.dead_letter_message(m, reason="async", error_description="why")
            async with sb.get_queue_receiver(
                "orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER
            ) as dlq:
                (dead,) = await dlq.receive_messages(max_message_count=1, max_wait_time=5)
                await dlq.complete_message(dead)
                return dead.message_id, dead.dead_letter_reason

    assert asyncio.run(run()) == ("a-1", "async")
    assert store.peek("orders", sub_queue="dead_letter") == []


def test_dead_lettering_from_the_dead_letter_queue_leaves_the_message_there(
    emulator: Emulator, store: LocalBackend
) -> None:
    """Service Bus: "you can't dead-letter a message from a DLQ" (it stays, and comes again)."""
    with client(emulator) as sb:
        send(sb, "orders", "stuck")
        with sb.get_queue_receiver("orders") as receiver:
            (m,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.dead_letter_message(m, reason="First", error_description="first try")
        with sb.get_queue_receiver("orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = dlq.receive_messages(max_message_count=1, max_wait_time=5)
            dlq.dead_letter_message(dead, reason="Second")
            (again,) = dlq.receive_messages(max_message_count=1, max_wait_time=5)
            assert again.message_id == "stuck"
            assert again.sequence_number == dead.sequence_number
            assert again.dead_letter_reason == "First"  # the first reason stays
            dlq.complete_message(again)
    assert store.peek("orders", sub_queue="dead_letter") == []
