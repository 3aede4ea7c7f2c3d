"""The executor connection pool of sendonce.spark against the emulator (no Spark needed)."""

from __future__ import annotations

import time

import pytest

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.emulator import Emulator
from sendonce.spark._pool import Borrowed, close_idle, pooled

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def settle(read: object, want: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while read() != want and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    return int(read())  # type: ignore[operator]


def send_one(borrowed: Borrowed, message_id: str) -> None:
    with IdempotentSender(borrowed.backend, EntityProfile("orders")) as sender:
        sender.send(Message("x", message_id=message_id))


def test_a_healthy_backend_is_reused_then_closed_when_idle(emulator: Emulator) -> None:
    url = emulator.connection_string
    first = Borrowed(url, keep=1.0)
    send_one(first, "a")
    first.release(healthy=True)
    assert pooled() == 1 and emulator.open_connections == 1
    second = Borrowed(url, keep=1.0)
    assert second.reused and second.backend is first.backend and pooled() == 0
    send_one(second, "b")
    second.release(healthy=True)
    assert emulator.connections_accepted == 1  # one connection for both "tasks"
    assert settle(lambda: emulator.open_connections, 0) == 0  # the reaper closed it
    assert pooled() == 0


def test_a_backend_from_a_failed_task_is_closed_not_pooled(emulator: Emulator) -> None:
    borrowed = Borrowed(emulator.connection_string, keep=30.0)
    send_one(borrowed, "c")
    borrowed.release(healthy=False)
    assert pooled() == 0
    assert settle(lambda: emulator.open_connections, 0) == 0
    again = Borrowed(emulator.connection_string, keep=30.0)
    assert not again.reused  # a fresh connection for the retry
    again.release(healthy=True)
    close_idle(everything=True)  # what interpreter exit does
    assert pooled() == 0
    assert settle(lambda: emulator.open_connections, 0) == 0


def test_keep_zero_and_local_urls_are_never_pooled(emulator: Emulator, tmp_path: object) -> None:
    borrowed = Borrowed(emulator.connection_string, keep=0.0)
    send_one(borrowed, "d")
    borrowed.release(healthy=True)
    assert pooled() == 0
    local = Borrowed(f"local://{tmp_path}/other.db", keep=30.0)
    local.release(healthy=True)
    assert pooled() == 0
