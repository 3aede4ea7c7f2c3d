"""Scheduled messages through the emulator, checked with the Python client, as Service Bus
sequences them: a new sequence number and enqueued time at activation (message sequencing),
a topic that keeps them until due (message browsing), a number returned for a copy dropped
as a duplicate (Azure/azure-service-bus#265), and no cancelling once activated.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import MessageNotFoundError

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]

DELAY = timedelta(seconds=1)


def wait_until(at: datetime) -> None:
    time.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()) + 0.1)


def client(emulator: Emulator) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)


def test_an_activated_message_comes_after_messages_sent_while_it_waited(
    emulator: Emulator,
) -> None:
    at = datetime.now(UTC) + DELAY
    with client(emulator) as sb:
        with sb.get_queue_sender("orders") as sender:
            (scheduled,) = sender.schedule_messages(
                ServiceBusMessage("s", message_id="scheduled", time_to_live=timedelta(minutes=1)),
                at,
            )
            sender.send_messages(ServiceBusMessage("m", message_id="meanwhile"))
        wait_until(at)
        with sb.get_queue_receiver(
            "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
        ) as receiver:
            got = receiver.receive_messages(max_message_count=5, max_wait_time=5)
            while len(got) < 2 and (more := receiver.receive_messages(max_wait_time=2)):
                got += more
    assert [m.message_id for m in got] == ["meanwhile", "scheduled"]
    meanwhile, activated = got
    assert activated.sequence_number > meanwhile.sequence_number > scheduled
    assert activated.enqueued_time_utc is not None and activated.enqueued_time_utc >= at.replace(
        microsecond=at.microsecond // 1000 * 1000
    )
    assert activated.expires_at_utc == activated.enqueued_time_utc + timedelta(minutes=1)


def test_a_topic_keeps_scheduled_messages_until_due(
    emulator: Emulator, store: LocalBackend
) -> None:
    at = datetime.now(UTC) + 3 * DELAY  # room for the links to open before activation
    with client(emulator) as sb:
        with sb.get_topic_sender("events") as sender:
            sender.schedule_messages(ServiceBusMessage("s", message_id="later"), at)
        with sb.get_subscription_receiver("events", "a", max_wait_time=5) as receiver:
            assert receiver.peek_messages(max_message_count=5) == []
        store.create_subscription("events", "joined")  # before activation: it gets the message
        wait_until(at)
        for name in ("a", "b", "joined"):
            with sb.get_subscription_receiver(
                "events",
                name,
                receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                max_wait_time=5,
            ) as receiver:
                got = receiver.receive_messages(max_message_count=5, max_wait_time=5)
                assert [m.message_id for m in got] == ["later"], name


def test_a_scheduled_duplicate_gets_a_number_that_names_no_message(emulator: Emulator) -> None:
    at = datetime.now(UTC) + timedelta(minutes=10)
    with client(emulator) as sb, sb.get_queue_sender("orders") as sender:
        (first,) = sender.schedule_messages(ServiceBusMessage("x", message_id="x"), at)
        (copy,) = sender.schedule_messages(ServiceBusMessage("x", message_id="x"), at)
        assert copy > first > 0
        with pytest.raises(MessageNotFoundError):
            sender.cancel_scheduled_messages(copy)
        sender.cancel_scheduled_messages(first)


def test_an_activated_message_can_no_longer_be_cancelled(
    emulator: Emulator, store: LocalBackend
) -> None:
    at = datetime.now(UTC) + DELAY
    with client(emulator) as sb:
        with sb.get_queue_sender("orders") as sender:
            (seq,) = sender.schedule_messages(ServiceBusMessage("x", message_id="x"), at)
            wait_until(at)
            with pytest.raises(MessageNotFoundError):
                sender.cancel_scheduled_messages(seq)
    assert [m.message_id for m in store.receive("orders")] == ["x"]


def test_a_session_gets_its_activated_message_after_those_sent_while_it_waited(
    emulator: Emulator, store: LocalBackend
) -> None:
    store.create_entity(EntityProfile("carts", sessions=True))
    at = datetime.now(UTC) + DELAY
    with client(emulator) as sb:
        with sb.get_queue_sender("carts") as sender:
            (scheduled,) = sender.schedule_messages(
                ServiceBusMessage("s", message_id="scheduled", session_id="x"), at
            )
            sender.send_messages(ServiceBusMessage("m", message_id="meanwhile", session_id="x"))
        wait_until(at)
        with sb.get_queue_receiver(
            "carts",
            session_id="x",
            receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            max_wait_time=5,
        ) as receiver:
            got = receiver.receive_messages(max_message_count=5, max_wait_time=5)
            while len(got) < 2 and (more := receiver.receive_messages(max_wait_time=2)):
                got += more
    assert [m.message_id for m in got] == ["meanwhile", "scheduled"]
    assert got[1].sequence_number > got[0].sequence_number > scheduled
