"""Message expiry through the unmodified azure-servicebus client, over a real socket.

The emulator runs on the real clock: the messages get a one-second time to
live and the test waits until the broker says they expired.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def wait_until_expired(store: LocalBackend, entity: str, message_id: str) -> None:
    """Wait (polling the broker file) until ``message_id`` no longer shows in a peek."""
    deadline = time.monotonic() + 20
    while any(m.message_id == message_id for m in store.peek(entity, max_messages=10)):
        assert time.monotonic() < deadline, "the message never expired"
        time.sleep(0.1)


def test_expired_messages_are_not_delivered(emulator: Emulator, store: LocalBackend) -> None:
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("old", message_id="ttl-1", time_to_live=timedelta(seconds=1)),
                    ServiceBusMessage("keep", message_id="ttl-2"),
                ],
                timeout=10,
            )
        wait_until_expired(store, "orders", "ttl-1")
        with sb.get_queue_receiver("orders") as receiver:
            assert [m.message_id for m in receiver.peek_messages(max_message_count=5)] == ["ttl-2"]
            got = receiver.receive_messages(max_message_count=5, max_wait_time=2)
            assert [m.message_id for m in got] == ["ttl-2"]
            receiver.complete_message(got[0])
    assert store.peek("orders", sub_queue="dead_letter") == []


def test_expired_messages_are_dead_lettered_when_the_entity_says_so(
    emulator: Emulator, store: LocalBackend
) -> None:
    store.create_entity(
        EntityProfile(
            "expiring",
            default_message_time_to_live=timedelta(seconds=1),
            dead_lettering_on_message_expiration=True,
        )
    )

    async def run() -> tuple[list[str | None], list[str | None]]:
        async with AsyncServiceBusClient.from_connection_string(emulator.connection_string) as sb:
            async with sb.get_queue_sender("expiring") as sender:
                await sender.send_messages(ServiceBusMessage("x", message_id="e-1"), timeout=10)
            await asyncio.to_thread(wait_until_expired, store, "expiring", "e-1")
            async with sb.get_queue_receiver("expiring") as receiver:
                live = await receiver.receive_messages(max_message_count=1, max_wait_time=2)
            async with sb.get_queue_receiver(
                "expiring", sub_queue=ServiceBusSubQueue.DEAD_LETTER
            ) as dlq:
                (dead,) = await dlq.receive_messages(max_message_count=1, max_wait_time=5)
                await dlq.complete_message(dead)
                return [m.message_id for m in live], [dead.message_id, dead.dead_letter_reason]

    assert asyncio.run(run()) == ([], ["e-1", "TTLExpiredException"])
