"""The backend with the real client over a real socket, against the sendonce emulator.

What the broker stores is read back from the broker file itself, so these tests see
exactly what crossed the wire: ids, keys and every property the conversion carries.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.errors import SendError

pytest.importorskip("proton")

from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

ORDERS = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=5))
EVENTS = EntityProfile("events", kind="topic", duplicate_detection_window=timedelta(minutes=5))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[Emulator, LocalBackend]]:
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        store.create_entity(ORDERS)
        store.create_entity(EVENTS)
        store.create_subscription("events", "audit")
        with Emulator(path, poll_interval=0.02) as emulator:
            yield emulator, store


def test_a_batch_arrives_with_every_property(broker: tuple[Emulator, LocalBackend]) -> None:
    emulator, store = broker
    sent = [
        Message(
            f"body-{i}",
            message_id=f"order-{i}.2026/payment",
            partition_key="c-42",
            subject="payment",
            content_type="text/plain",
            correlation_id=f"corr-{i}",
            application_properties={"tenant": "acme", "n": i},
            time_to_live=timedelta(hours=1),
        )
        for i in range(3)
    ]
    with AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles={"orders": ORDERS}
    ) as backend:
        assert len(backend.send("orders", sent, timeout=10)) == 3
    received = store.receive("orders", max_messages=10)
    assert [r.message_id for r in received] == [m.message_id for m in sent]
    for original, got in zip(sent, received, strict=True):
        assert got.body == original.body_bytes
        assert got.partition_key == "c-42"
        assert got.subject == "payment"
        assert got.content_type == "text/plain"
        assert got.correlation_id == original.correlation_id
        assert dict(got.application_properties or {}) == dict(original.application_properties or {})
        assert got.time_to_live == timedelta(hours=1)


def test_a_resend_with_the_same_ids_is_stored_once(broker: tuple[Emulator, LocalBackend]) -> None:
    emulator, store = broker
    messages = [Message(f"b{i}", message_id=f"m-{i}") for i in range(4)]
    with (
        AzureServiceBusBackend.from_connection_string(emulator.connection_string) as backend,
        IdempotentSender(backend, ORDERS) as sender,
    ):
        assert sender.send_many(messages).sent == 4
        again = sender.send_many(messages)  # a blind resend, as after a restart
        assert again.failed == 0
    assert store.count("orders") == 4


def test_a_topic_send_reaches_its_subscription(broker: tuple[Emulator, LocalBackend]) -> None:
    emulator, store = broker
    with AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, kinds={"events": "topic"}
    ) as backend:
        backend.send("events", [Message("e", message_id="evt-1")], timeout=10)
    (got,) = store.receive("events", subscription="audit")
    assert got.message_id == "evt-1"


def test_schedule_returns_the_brokers_sequence_numbers(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    at = datetime.now(UTC) + timedelta(hours=1)
    with AzureServiceBusBackend.from_connection_string(emulator.connection_string) as backend:
        acks = backend.schedule(
            "orders",
            [Message("s1", message_id="sch-1"), Message("s2", message_id="sch-2")],
            at,
            timeout=10,
        )
    numbers = [a.sequence_number for a in acks]
    assert all(isinstance(n, int) for n in numbers) and len(set(numbers)) == 2
    assert store.count("orders") == 0  # not yet due
    peeked = store.peek("orders", max_messages=10)  # peek shows scheduled messages too
    assert {p.message_id: p.sequence_number for p in peeked} == {
        "sch-1": numbers[0],
        "sch-2": numbers[1],
    }
    for p in peeked:  # AMQP timestamps carry milliseconds
        assert p.scheduled_enqueue_time is not None
        assert abs(p.scheduled_enqueue_time - at) < timedelta(milliseconds=1)


def test_the_sender_is_reused_across_calls(
    broker: tuple[Emulator, LocalBackend], mocker: Any
) -> None:
    emulator, store = broker
    with AzureServiceBusBackend.from_connection_string(emulator.connection_string) as backend:
        opened = mocker.spy(backend._client, "get_queue_sender")
        for i in range(5):
            backend.send("orders", [Message("x", message_id=f"r-{i}")], timeout=10)
        assert opened.call_count == 1  # one caller at a time: one lane is enough
    assert store.count("orders") == 5


def test_explicit_profiles_and_kinds_answer_to_any_spelling_of_the_name(
    broker: tuple[Emulator, LocalBackend], mocker: Any
) -> None:
    """Service Bus names ignore case: ``profiles={"Orders": ...}`` describes ``orders`` too
    (the emulator has no administration API, so nothing else could), and every spelling
    shares the entity's sender links."""
    emulator, store = broker
    orders = EntityProfile("Orders", duplicate_detection_window=timedelta(minutes=5))
    with AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles={"Orders": orders}, kinds={"EVENTS": "topic"}
    ) as backend:
        assert backend.describe("orders") is orders and backend.describe("ORDERS") is orders
        opened = mocker.spy(backend._client, "get_queue_sender")
        with IdempotentSender(backend, "orders") as sender:
            assert sender.send_many([Message("o", message_id=f"o-{i}") for i in range(2)]).sent == 2
        backend.send("ORDERS", [Message("o", message_id="o-2")], timeout=10)
        assert opened.call_count == 1  # one entity: one link, whatever the spelling
        topic = mocker.spy(backend._client, "get_topic_sender")
        backend.send("events", [Message("e", message_id="evt-1")], timeout=10)
        assert topic.call_count == 1  # opened as the topic kinds= says
    assert sorted(store.message_ids("orders")) == ["o-0", "o-1", "o-2"]
    (got,) = store.receive("events", subscription="audit")
    assert got.message_id == "evt-1"


def test_the_aio_backend_finds_an_explicit_profile_under_any_spelling(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    from sendonce import aio
    from sendonce.aio import AzureServiceBusBackend as AsyncBackend

    emulator, store = broker
    orders = EntityProfile("Orders", duplicate_detection_window=timedelta(minutes=5))

    async def run() -> int:
        backend = AsyncBackend.from_connection_string(
            emulator.connection_string, profiles={"Orders": orders}
        )
        async with backend, aio.IdempotentSender(backend, "ORDERS") as sender:
            assert await backend.describe("orders") is orders
            report = await sender.send_many([Message("o", message_id=f"a-{i}") for i in range(2)])
            return report.sent

    import asyncio

    assert asyncio.run(run()) == 2
    assert sorted(store.message_ids("orders")) == ["a-0", "a-1"]


FAULTS = [
    # (fault, mapped error, condition or None when the client gives none, stored by the fault)
    ("DROP_AFTER_COMMIT", "TransientSendError", "amqp:socket-error", 1),
    ("DROP_BEFORE_COMMIT", "TransientSendError", "amqp:socket-error", 0),
    ("DETACH_AFTER_COMMIT", "TransientSendError", None, 1),
    ("WITHHOLD", "TransientSendError", None, 1),
    ("SERVER_BUSY", "TransientSendError", "com.microsoft:server-busy", 0),
    ("UNAUTHORIZED", "PermanentSendError", "amqp:unauthorized-access", 0),
]


@pytest.mark.parametrize(("fault", "error", "condition", "stored"), FAULTS)
def test_real_failures_map_and_a_resend_on_a_new_link_lands_once(
    broker: tuple[Emulator, LocalBackend],
    fault: str,
    error: str,
    condition: str | None,
    stored: int,
    mocker: Any,
) -> None:
    from sendonce.emulator import FaultAction

    emulator, store = broker
    message = Message("pay", message_id="order-1.2026/payment")
    with AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles={"orders": ORDERS}
    ) as backend:
        opened = mocker.spy(backend._client, "get_queue_sender")
        backend.send("orders", [Message("warm", message_id="warm-up")], timeout=10)
        emulator.faults.add(FaultAction[fault])
        with pytest.raises(SendError) as info:
            backend.send("orders", [message], timeout=2)
        assert type(info.value).__name__ == error
        assert info.value.message_id == "order-1.2026/payment"
        if condition is not None:
            assert info.value.condition == condition
        assert store.count("orders") == 1 + stored
        backend.send("orders", [message], timeout=10)  # the resend, same id
        assert opened.call_count == 2  # the failed link was dropped: the resend opened one
    ids = [m.message_id for m in store.receive("orders", max_messages=10)]
    assert ids == ["warm-up", "order-1.2026/payment"]
