"""Lock expiry through the unmodified ``azure.servicebus.aio`` client: message and session locks.

The asyncio twins of test_emulator_locks.py (message locks) and
test_emulator_session_locks.py (session locks), with short emulator locks. Waits
are for the broker to see a lock expire; no timing is asserted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import MessageLockLostError, SessionLockLostError

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]

SESSION_LOCK = timedelta(seconds=3)


@pytest.fixture
def short_locks(broker_path: Path) -> Iterator[Emulator]:
    with Emulator(broker_path, poll_interval=0.02, lock_duration=timedelta(seconds=1)) as emu:
        yield emu


@pytest.fixture
def short_session_locks(broker_path: Path) -> Iterator[Emulator]:
    with LocalBackend(broker_path) as store:
        store.create_entity(EntityProfile("carts", sessions=True))
    with Emulator(broker_path, poll_interval=0.02, lock_duration=SESSION_LOCK) as emu:
        yield emu


async def _until(check: object, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the broker never saw the lock expire"
        await asyncio.sleep(0.1)


def test_an_expired_message_lock_is_lost(short_locks: Emulator, store: LocalBackend) -> None:
    async def run() -> None:
        async with ServiceBusClient.from_connection_string(short_locks.connection_string) as sb:
            async with sb.get_queue_sender("orders", keep_alive=None) as sender:
                await sender.send_messages(ServiceBusMessage("x", message_id="late"), timeout=10)
            async with sb.get_queue_receiver("orders") as receiver:
                (m,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                await _until(lambda: store.count("orders") == 1)  # available again
                with pytest.raises(MessageLockLostError):
                    await receiver.renew_message_lock(m)
                with pytest.raises(MessageLockLostError):
                    await receiver.complete_message(m)

    asyncio.run(run())
    (again,) = store.receive("orders")
    assert again.message_id == "late" and again.delivery_count == 2


def test_an_expired_session_lock_is_lost_and_the_session_freed(
    short_session_locks: Emulator,
) -> None:
    async def run() -> tuple[str | None, int, bytes | None]:
        async with ServiceBusClient.from_connection_string(
            short_session_locks.connection_string, retry_total=0
        ) as sb:
            async with sb.get_queue_sender("carts", keep_alive=None) as sender:
                await sender.send_messages(
                    ServiceBusMessage("s", message_id="s1", session_id="S"), timeout=10
                )
            first = sb.get_queue_receiver("carts", session_id="S", max_wait_time=5)
            async with first:
                (m,) = await first.receive_messages(max_wait_time=5)
                await first.session.set_state(b"half-done")
                await asyncio.sleep(SESSION_LOCK.total_seconds() + 2)  # never renewed
                with pytest.raises(SessionLockLostError):
                    await first.session.get_state()
                # another receiver takes the session; the message comes again
                async with sb.get_queue_receiver(
                    "carts", session_id="S", max_wait_time=5
                ) as second:
                    (again,) = await second.receive_messages(max_wait_time=5)
                    state = await second.session.get_state()
                    await second.complete_message(again)
                    return again.message_id, again.delivery_count, state
            raise AssertionError(f"not reached ({m})")

    message_id, delivery_count, state = asyncio.run(run())
    assert (message_id, delivery_count, state) == ("s1", 1, b"half-done")
