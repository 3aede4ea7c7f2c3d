"""Deferral through the unmodified azure-servicebus client, over a real socket."""

from __future__ import annotations

import asyncio

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import ServiceBusError

from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def test_defer_then_receive_deferred_and_settle(emulator: Emulator, store: LocalBackend) -> None:
    with ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(
                [ServiceBusMessage(i, message_id=i) for i in ("step-2", "step-1", "step-3")],
                timeout=10,
            )
        with sb.get_queue_receiver("orders") as receiver:
            first, second, third = receiver.receive_messages(max_message_count=3, max_wait_time=5)
            receiver.defer_message(first)
            receiver.defer_message(third)
            receiver.complete_message(second)
            assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
            deferred = receiver.receive_deferred_messages(
                [first.sequence_number, third.sequence_number]
            )
            assert [m.message_id for m in deferred] == ["step-2", "step-3"]
            receiver.complete_message(deferred[0])
            receiver.dead_letter_message(deferred[1], reason="no step 3")
            with pytest.raises(ServiceBusError):
                receiver.receive_deferred_messages([first.sequence_number])
    assert store.peek("orders") == []
    (dead,) = store.peek("orders", sub_queue="dead_letter")
    assert (dead.message_id, dead.dead_letter_reason) == ("step-3", "no step 3")


def test_the_asyncio_client_defers(emulator: Emulator, store: LocalBackend) -> None:
    async def run() -> list[str | None]:
        async with AsyncServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as sb:
            async with sb.get_queue_sender("orders") as sender:
                await sender.send_messages(ServiceBusMessage("x", message_id="d-1"), timeout=10)
            async with sb.get_queue_receiver("orders") as receiver:
                (m,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                await receiver.defer_message(m)
                got = await receiver.receive_deferred_messages([m.sequence_number])
                for g in got:
                    await receiver.complete_message(g)
                return [g.message_id for g in got]

    assert asyncio.run(run()) == ["d-1"]
    assert store.peek("orders") == []


def test_a_deferred_message_is_dead_lettered_after_its_receiver_is_gone(
    emulator: Emulator, store: LocalBackend
) -> None:
    """A new receiver takes the deferred message by sequence number and dead-letters it:
    the settlement goes through ``com.microsoft:update-disposition`` (no link delivered it)."""
    with ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0) as sb:
        with sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("x", message_id="parked"), timeout=10)
        with sb.get_queue_receiver("orders") as first:
            (m,) = first.receive_messages(max_message_count=1, max_wait_time=5)
            seq = m.sequence_number
            first.defer_message(m)
        # the link that received it is closed; another receiver, on another link
        with sb.get_queue_receiver("orders") as second:
            (deferred,) = second.receive_deferred_messages([seq])
            assert deferred.message_id == "parked"
            second.dead_letter_message(
                deferred, reason="Parked too long", error_description="after deferral"
            )
            with pytest.raises(ServiceBusError):
                second.receive_deferred_messages([seq])
        with sb.get_queue_receiver("orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = dlq.receive_messages(max_message_count=1, max_wait_time=5)
            assert (dead.message_id, dead.sequence_number) == ("parked", seq)
            assert dead.dead_letter_reason == "Parked too long"
            assert dead.dead_letter_error_description == "after deferral"
            dlq.complete_message(dead)
    assert store.peek("orders") == [] and store.peek("orders", sub_queue="dead_letter") == []
