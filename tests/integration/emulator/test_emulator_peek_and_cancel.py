"""Peek and cancel as Service Bus answers them, checked with the Python client.

Found first with the JavaScript client (tests/crossclient) and confirmed here: a peeked
message's delivery count is the number of deliveries so far (the header was missing on a
never-delivered message, then one short); a session receiver's peek browses its own
session only; cancelling a sequence number that names no scheduled message fails with
"Messages not found".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageNotFoundError

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


def test_a_peeked_message_reports_its_deliveries_so_far(emulator: Emulator) -> None:
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("x", message_id="x"))
        with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
            (fresh,) = receiver.peek_messages(max_message_count=1)
            assert fresh.delivery_count == 0
            (received,) = receiver.receive_messages(max_wait_time=5)
            assert received.delivery_count == 0
            receiver.abandon_message(received)
            (abandoned,) = receiver.peek_messages(
                max_message_count=1, sequence_number=received.sequence_number
            )
            assert abandoned.delivery_count == 1
            (again,) = receiver.receive_messages(max_wait_time=5)
            assert again.delivery_count == 1
            receiver.complete_message(again)


def test_a_session_receiver_peeks_its_own_session(emulator: Emulator, store: LocalBackend) -> None:
    store.create_entity(EntityProfile("carts", sessions=True))
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client:
        with client.get_queue_sender("carts") as sender:
            sender.send_messages(ServiceBusMessage("mine", message_id="a1", session_id="a"))
            sender.send_messages(ServiceBusMessage("other", message_id="b1", session_id="b"))
        with client.get_queue_receiver("carts", session_id="a", max_wait_time=5) as receiver:
            peeked = receiver.peek_messages(max_message_count=10)
            assert [(m.message_id, m.session_id) for m in peeked] == [("a1", "a")]


def test_cancelling_a_sequence_number_that_names_no_scheduled_message_fails(
    emulator: Emulator, store: LocalBackend
) -> None:
    at = datetime.now(UTC) + timedelta(minutes=10)
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client:
        for entity, sender in (
            ("orders", client.get_queue_sender("orders")),
            ("events", client.get_topic_sender("events")),
        ):
            with sender:
                (seq,) = sender.schedule_messages(ServiceBusMessage("x", message_id="x"), at)
                (kept,) = sender.schedule_messages(ServiceBusMessage("y", message_id="y"), at)
                with pytest.raises(MessageNotFoundError, match="not found"):
                    sender.cancel_scheduled_messages([seq, seq + 424242])
                sender.cancel_scheduled_messages(seq)  # nothing was cancelled by the refusal
                with pytest.raises(MessageNotFoundError):
                    sender.cancel_scheduled_messages(seq)  # already cancelled
            # A topic keeps its scheduled messages until due: its own peek shows them.
            assert [m.sequence_number for m in store.peek(entity, max_messages=5)] == [kept]


def test_scheduled_and_deferred_messages_carry_their_state(emulator: Emulator) -> None:
    from azure.servicebus import ServiceBusMessageState

    at = datetime.now(UTC) + timedelta(minutes=10)
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("defer me", message_id="d"))
            sender.schedule_messages(ServiceBusMessage("later", message_id="s"), at)
        with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
            (to_defer,) = receiver.receive_messages(max_wait_time=5)
            assert to_defer.state == ServiceBusMessageState.ACTIVE
            receiver.defer_message(to_defer)
            states = {m.message_id: m.state for m in receiver.peek_messages(max_message_count=5)}
            assert states["s"] == ServiceBusMessageState.SCHEDULED
            (deferred,) = receiver.receive_deferred_messages([to_defer.sequence_number])
            assert deferred.state == ServiceBusMessageState.DEFERRED
            receiver.complete_message(deferred)
