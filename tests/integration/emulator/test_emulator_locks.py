"""Message locks through the unmodified azure-servicebus client: renewal and lock loss.

The emulator runs with a one-second lock so the client's ``AutoLockRenewer``
has to renew it (``com.microsoft:renew-lock``) and an unrenewed lock expires.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageLockLostError

from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


@pytest.fixture
def short_locks(broker_path: Path) -> Iterator[Emulator]:
    with Emulator(broker_path, poll_interval=0.02, lock_duration=timedelta(seconds=1)) as emu:
        yield emu


def send(sb: ServiceBusClient, *ids: str) -> None:
    with sb.get_queue_sender("orders", keep_alive=None) as sender:
        sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids], timeout=10)


def test_auto_lock_renewer_keeps_the_lock(short_locks: Emulator, store: LocalBackend) -> None:
    with ServiceBusClient.from_connection_string(short_locks.connection_string) as sb:
        send(sb, "slow")
        renewer = AutoLockRenewer(max_lock_renewal_duration=30)
        with sb.get_queue_receiver("orders", auto_lock_renewer=renewer) as receiver:
            (m,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            first_until = m.locked_until_utc
            assert first_until is not None
            # Past the first lock's end (only renewals keep it now), the lock renewed: waited
            # for, not slept (a busy machine renews later, never sooner).
            deadline = time.monotonic() + 30
            while datetime.now(UTC) <= first_until or m.locked_until_utc <= first_until:
                assert time.monotonic() < deadline, "the lock was never renewed"
                time.sleep(0.05)
            receiver.complete_message(m)
        renewer.close()
    assert store.peek("orders") == []


def test_settling_after_the_lock_expired_raises_lock_lost(
    short_locks: Emulator, store: LocalBackend
) -> None:
    with ServiceBusClient.from_connection_string(short_locks.connection_string) as sb:
        send(sb, "late")
        with sb.get_queue_receiver("orders") as receiver:
            (m,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            deadline = time.monotonic() + 20
            while store.count("orders") == 0:  # the broker sees the lock expired
                assert time.monotonic() < deadline
                time.sleep(0.1)
            with pytest.raises(MessageLockLostError):
                receiver.renew_message_lock(m)
            with pytest.raises(MessageLockLostError):
                receiver.complete_message(m)
    # the message is available again, its delivery counted
    (again,) = store.receive("orders")
    assert again.message_id == "late" and again.delivery_count == 2
