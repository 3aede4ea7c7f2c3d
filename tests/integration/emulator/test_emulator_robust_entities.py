"""Requests the emulator used to mishandle: receivers on missing entities, failing
management operations, lock bookkeeping left behind, very large schedules.

Each test failed on an earlier emulator (a receiver on a missing subscription
was accepted and received nothing forever; a management error dropped the whole
connection; lock entries were never freed; 20,000 scheduled messages failed to
decode).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusConnectionError,
    ServiceBusError,
)

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def _settled(read: object, want: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    value = read()  # type: ignore[operator]
    while value != want and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()  # type: ignore[operator]
    return int(value)


def _emulator_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Errors and tracebacks the emulator logged."""
    return [
        r
        for r in caplog.records
        if r.name.startswith("sendonce") and (r.levelno >= logging.ERROR or r.exc_info)
    ]


def test_a_receiver_on_a_missing_subscription_is_refused_at_attach(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client:
        receiver = client.get_subscription_receiver("events", "typo", max_wait_time=1)
        with pytest.raises(MessagingEntityNotFoundError, match="typo"), receiver:
            receiver.receive_messages(max_wait_time=1)
        peeker = client.get_subscription_receiver("events", "typo")
        with pytest.raises(MessagingEntityNotFoundError), peeker:
            peeker.peek_messages(max_message_count=1)
        queue = client.get_queue_receiver("no-such-queue", max_wait_time=1)
        with pytest.raises(MessagingEntityNotFoundError), queue:
            queue.receive_messages(max_wait_time=1)
        # The connection is still good for the subscriptions that exist.
        with client.get_subscription_receiver("events", "a") as good:
            assert good.receive_messages(max_wait_time=0.5) == []
    assert not _emulator_errors(caplog)


def test_a_receiver_whose_entity_is_deleted_is_detached(
    emulator: Emulator, store: LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client, client.get_subscription_receiver("events", "a", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_wait_time=0.5) == []
        store.delete_entity("events")
        time.sleep(0.5)
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.receive_messages(max_wait_time=1)
    assert not _emulator_errors(caplog)


def test_a_failing_management_operation_is_an_error_reply(
    emulator: Emulator, store: LocalBackend
) -> None:
    store.create_entity(EntityProfile("carts", sessions=True))
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client, client.get_queue_receiver("carts", session_id="S", max_wait_time=1) as receiver:
        receiver.session.set_state(b"small")
        with pytest.raises(ServiceBusError) as failure:
            receiver.session.set_state(b"x" * 300_000)  # over the entity's 256 KB
        assert not isinstance(failure.value, ServiceBusConnectionError)
        # The same connection, link and session lock go on working.
        assert receiver.session.get_state() == b"small"
        receiver.session.renew_lock()
    assert _settled(lambda: emulator.open_connections, 0) == 0


@pytest.fixture
def short_locks(broker_path: Path) -> Iterator[Emulator]:
    with Emulator(broker_path, poll_interval=0.02, lock_duration=timedelta(seconds=1)) as emu:
        yield emu


def _send(client: ServiceBusClient, count: int) -> None:
    with client.get_queue_sender("orders") as sender:
        sender.send_messages(
            [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(count)], timeout=30
        )


def _receive(receiver: object, count: int) -> list[object]:
    got: list[object] = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=count, max_wait_time=1)  # type: ignore[attr-defined]
    return got


def test_lock_bookkeeping_is_freed_when_the_receiver_closes(emulator: Emulator) -> None:
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client:
        _send(client, 5)
        with client.get_queue_receiver("orders") as receiver:
            assert len(_receive(receiver, 5)) == 5
            assert emulator.held_locks == 5
        assert _settled(lambda: emulator.held_locks, 0) == 0


def test_lock_bookkeeping_is_freed_when_the_connection_drops(emulator: Emulator) -> None:
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    _send(client, 3)
    receiver = client.get_queue_receiver("orders")
    assert len(_receive(receiver, 3)) == 3
    assert emulator.held_locks == 3
    # The client vanishes: no detach, no close frame.
    receiver._handler._connection._transport.sock.shutdown(socket.SHUT_RDWR)
    assert _settled(lambda: emulator.held_locks, 0) == 0
    with contextlib.suppress(Exception):
        client.close()


def test_lock_bookkeeping_is_freed_when_the_lock_expires(short_locks: Emulator) -> None:
    client = ServiceBusClient.from_connection_string(short_locks.connection_string, retry_total=0)
    with client:
        _send(client, 4)
        with client.get_queue_receiver("orders") as receiver:
            assert len(_receive(receiver, 4)) == 4
            assert short_locks.held_locks == 4
            # The receiver stays open and never settles: the locks run out.
            assert _settled(lambda: short_locks.held_locks, 0, timeout=10) == 0
        with client.get_queue_receiver(
            "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as again:
            assert len(_receive(again, 4)) == 4  # released to the next receiver


def test_twenty_thousand_messages_are_scheduled_in_one_request(
    emulator: Emulator, store: LocalBackend
) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    messages = [ServiceBusMessage(f"s{i}", message_id=f"s{i}") for i in range(20_000)]
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client, client.get_queue_sender("orders") as sender:
        seqs = sender.schedule_messages(messages, at, timeout=120)
    assert len(seqs) == len(set(seqs)) == 20_000
    assert store.stats("orders")["scheduled"] == 20_000
