"""Session lock expiry and renewal through the emulator, with the unmodified client.

Service Bus: a session lock not renewed within the entity's lock duration is
released; the holder then gets ``SessionLockLostError`` and another receiver can
accept the session
(https://learn.microsoft.com/azure/service-bus-messaging/message-sessions#message-session-state).
``AutoLockRenewer`` keeps it held.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from azure.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError, SessionLockLostError

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]

LOCK = timedelta(seconds=3)


@pytest.fixture
def short_lock_emulator(broker_path: Path) -> Iterator[Emulator]:
    with LocalBackend(broker_path) as store:
        store.create_entity(EntityProfile("carts", sessions=True))
    with Emulator(broker_path, poll_interval=0.02, lock_duration=LOCK) as emu:
        yield emu


def _send(sb: ServiceBusClient, *ids: str) -> None:
    with sb.get_queue_sender("carts", keep_alive=None) as sender:
        sender.send_messages([ServiceBusMessage(i, message_id=i, session_id="S") for i in ids])


def test_an_expired_session_lock_is_lost_and_the_session_freed(
    short_lock_emulator: Emulator,
) -> None:
    with ServiceBusClient.from_connection_string(
        short_lock_emulator.connection_string, retry_total=0
    ) as sb:
        _send(sb, "s1")
        first = sb.get_queue_receiver("carts", session_id="S", max_wait_time=5)
        with first:
            assert [m.message_id for m in first.receive_messages(max_wait_time=5)] == ["s1"]
            first.session.set_state(b"half-done")
            time.sleep(LOCK.total_seconds() + 2)  # never renewed
            with pytest.raises(SessionLockLostError):
                first.session.get_state()
            # Another receiver takes the session; the message comes again.
            with sb.get_queue_receiver("carts", session_id="S", max_wait_time=5) as second:
                (again,) = second.receive_messages(max_wait_time=5)
                assert again.message_id == "s1"
                assert again.delivery_count == 1
                assert second.session.get_state() == b"half-done"
                second.complete_message(again)


def test_auto_lock_renewer_keeps_the_session(short_lock_emulator: Emulator) -> None:
    with ServiceBusClient.from_connection_string(
        short_lock_emulator.connection_string, retry_total=0
    ) as sb:
        _send(sb, "k1")
        renewer = AutoLockRenewer(max_lock_renewal_duration=60)
        with sb.get_queue_receiver("carts", session_id="S", max_wait_time=5) as holder:
            renewer.register(holder, holder.session, max_lock_renewal_duration=60)
            (message,) = holder.receive_messages(max_wait_time=5)
            time.sleep(LOCK.total_seconds() + 2)
            with pytest.raises(ServiceBusError):
                with sb.get_queue_receiver("carts", session_id="S", max_wait_time=2):
                    pass
            assert holder.session.get_state() is None
            holder.complete_message(message)
        renewer.close()


def test_session_state_is_kept_in_the_broker_file(broker_path: Path) -> None:
    """State set through the client outlives the emulator and is shared with local://."""
    with LocalBackend(broker_path) as store:
        store.create_entity(EntityProfile("carts", sessions=True))
        store.set_session_state("carts", "S", b"from-local")
    for round_ in range(2):  # a second emulator on the same file sees the state
        with Emulator(broker_path, poll_interval=0.02) as emu:
            with ServiceBusClient.from_connection_string(
                emu.connection_string, retry_total=0
            ) as sb:
                with sb.get_queue_receiver("carts", session_id="S", max_wait_time=2) as r:
                    expected = b"from-local" if round_ == 0 else b"from-client"
                    assert r.session.get_state() == expected
                    r.session.set_state(b"from-client")
    with LocalBackend(broker_path) as store:
        assert store.get_session_state("carts", "S") == b"from-client"
