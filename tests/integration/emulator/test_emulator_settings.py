"""Per-entity and per-subscription settings through the unmodified azure-servicebus client.

Service Bus keeps lock duration, sessions and max delivery count per queue and per
subscription, and resolves entity and subscription names case-insensitively; the
emulator (with no emulator-wide ``lock_duration``) follows each entity's settings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import ServiceBusError

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


@pytest.fixture
def settings_path(tmp_path: Path) -> Path:
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        store.create_entity(EntityProfile("brief", lock_duration=timedelta(seconds=2)))
        store.create_entity(EntityProfile("Orders"))
        store.create_entity(EntityProfile("events", kind="topic"))
        store.create_subscription("events", "strict", max_delivery_count=2)
        store.create_subscription("events", "lenient")
        store.create_subscription("events", "Ordered", sessions=True)
    return path


@pytest.fixture
def emulator(settings_path: Path) -> Iterator[Emulator]:
    with Emulator(settings_path, poll_interval=0.02) as emu:
        yield emu


@pytest.fixture
def sb(emulator: Emulator) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        yield client


def send(sb: ServiceBusClient, entity: str, *messages: ServiceBusMessage) -> None:
    topic = entity.lower() == "events"
    sender = sb.get_topic_sender(entity) if topic else sb.get_queue_sender(entity)
    with sender:
        sender.send_messages(list(messages), timeout=10)


def test_a_queue_s_own_short_lock_expires_and_the_message_is_delivered_again(
    sb: ServiceBusClient,
) -> None:
    send(sb, "brief", ServiceBusMessage("x", message_id="short-lived"))
    send(sb, "Orders", ServiceBusMessage("y", message_id="long-lived"))
    with sb.get_queue_receiver("orders") as receiver:
        (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert held.locked_until_utc is not None
        left = held.locked_until_utc - datetime.now(UTC)
        assert timedelta(seconds=50) < left <= timedelta(minutes=1)  # the default minute
    with sb.get_queue_receiver("brief") as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert first.locked_until_utc is not None
        assert first.locked_until_utc - datetime.now(UTC) <= timedelta(seconds=2)
        time.sleep(2.5)  # the queue's 2 s lock runs out: not settled, delivered again
        (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert (again.message_id, again.delivery_count) == ("short-lived", 1)
        receiver.complete_message(again)


def test_each_subscription_has_its_own_max_delivery_count(sb: ServiceBusClient) -> None:
    send(sb, "events", ServiceBusMessage("x", message_id="poison"))
    for _ in range(2):
        for name in ("strict", "lenient"):
            with sb.get_subscription_receiver("events", name) as receiver:
                (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                receiver.abandon_message(got)
    with sb.get_subscription_receiver("events", "strict") as receiver:  # delivered twice: no more
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
    with sb.get_subscription_receiver(
        "events", "strict", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert (dead.message_id, dead.dead_letter_reason) == ("poison", "MaxDeliveryCountExceeded")
        receiver.complete_message(dead)
    with sb.get_subscription_receiver(
        "events", "lenient", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        (third,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert third.message_id == "poison"


def test_a_sessionful_subscription_of_a_sessionless_topic(sb: ServiceBusClient) -> None:
    send(
        sb,
        "events",
        ServiceBusMessage("a", message_id="loose"),
        ServiceBusMessage("b", message_id="keyed", session_id="s1"),
    )
    # The sessionful subscription takes session receivers only, as Service Bus does.
    with (
        pytest.raises(ServiceBusError),
        sb.get_subscription_receiver("events", "ordered") as receiver,
    ):
        receiver.receive_messages(max_message_count=1, max_wait_time=2)
    with sb.get_subscription_receiver("events", "ORDERED", session_id="s1") as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert got.message_id == "keyed"
        receiver.complete_message(got)
    # Its copy of the message without a session id is dead-lettered.
    with sb.get_subscription_receiver(
        "events", "ordered", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert (dead.message_id, dead.dead_letter_reason) == ("loose", "Session id is null.")
        receiver.complete_message(dead)
    # A subscription without sessions gets both, through a plain receiver.
    with sb.get_subscription_receiver(
        "events", "lenient", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        got_ids: list[str | None] = []
        while len(got_ids) < 2:
            batch = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            assert batch, got_ids
            got_ids += [m.message_id for m in batch]
    assert got_ids == ["loose", "keyed"]


def test_entity_and_subscription_names_ignore_case(
    sb: ServiceBusClient, settings_path: Path
) -> None:
    send(sb, "ORDERS", ServiceBusMessage("x", message_id="upper"))
    send(sb, "orders", ServiceBusMessage("x", message_id="upper"))  # a duplicate: one entity
    send(sb, "EVENTS", ServiceBusMessage("x", message_id="fan"))
    with sb.get_queue_receiver(
        "oRdErS", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        got = receiver.receive_messages(max_message_count=5, max_wait_time=3)
        assert [m.message_id for m in got] == ["upper"]
    with sb.get_subscription_receiver("Events", "LENIENT") as receiver:
        (copy,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.complete_message(copy)
    with LocalBackend(settings_path) as store:
        assert store.count("Orders") == 0
        assert store.count("events", subscription="lenient") == 0
