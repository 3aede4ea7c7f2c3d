"""Session locks are the broker's: an emulator client and a local:// session receiver exclude
each other on the same broker file (sync and asyncio clients)."""

from __future__ import annotations

import asyncio

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import SessionCannotBeLockedError as ClientCannotLock

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend, SessionCannotBeLockedError
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


def _send(emulator: Emulator, *items: tuple[str, str]) -> None:
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("carts", keep_alive=None) as sender:
            sender.send_messages(
                [ServiceBusMessage(mid, message_id=mid, session_id=s) for mid, s in items]
            )


def test_a_local_session_receiver_and_a_client_exclude_each_other(
    emulator: Emulator, store: LocalBackend
) -> None:
    store.create_entity(EntityProfile("carts", sessions=True))
    _send(emulator, ("a1", "A"), ("b1", "B"))
    with ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0) as sb:
        with store.accept_session("carts", "A") as local:
            # the client cannot lock the session that local:// holds...
            with pytest.raises(ClientCannotLock), sb.get_queue_receiver("carts", session_id="A"):
                pass
            # ...and NEXT_AVAILABLE_SESSION passes it by
            with sb.get_queue_receiver(
                "carts", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
            ) as receiver:
                assert receiver.session.session_id == "B"
                # local:// cannot lock the session the client holds
                with pytest.raises(SessionCannotBeLockedError):
                    store.accept_session("carts", "B")
                with pytest.raises(SessionCannotBeLockedError):
                    store.receive("carts", session_id="B")
                (b1,) = receiver.receive_messages(max_wait_time=5)
                receiver.complete_message(b1)
            (a1,) = local.receive()
            local.complete(a1)
        # released on both sides: the client locks A, and local:// locks B
        with sb.get_queue_receiver("carts", session_id="A", max_wait_time=2) as receiver:
            assert receiver.receive_messages(max_wait_time=1) == []
            with store.accept_session("carts", "B") as local_b:
                assert local_b.receive() == []
    assert store.message_ids("carts") == []


def test_the_asyncio_client_is_refused_a_session_held_by_local(
    emulator: Emulator, store: LocalBackend
) -> None:
    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    store.create_entity(EntityProfile("carts", sessions=True))
    _send(emulator, ("a1", "A"))

    async def run() -> list[str]:
        async with AsyncClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as sb:
            with store.accept_session("carts", "A"):
                with pytest.raises(ClientCannotLock):
                    async with sb.get_queue_receiver("carts", session_id="A"):
                        pass
            # the local session closed: the asyncio client takes it
            async with sb.get_queue_receiver("carts", session_id="A") as receiver:
                got = await receiver.receive_messages(max_wait_time=5)
                for m in got:
                    await receiver.complete_message(m)
                return [str(m.message_id) for m in got]

    assert asyncio.run(run()) == ["a1"]


def test_a_client_session_left_unsettled_returns_to_local_in_order(
    emulator: Emulator, store: LocalBackend
) -> None:
    """Closing a session receiver releases the session and its unsettled messages."""
    store.create_entity(EntityProfile("carts", sessions=True))
    _send(emulator, ("s1", "S"), ("s2", "S"))
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_receiver("carts", session_id="S", max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            assert [m.message_id for m in got] == ["s1", "s2"]
            receiver.complete_message(got[0])  # s2 is left unsettled
    with store.accept_session("carts", "S") as local:
        (s2,) = local.receive(max_messages=5)
        assert (s2.message_id, s2.delivery_count) == ("s2", 2)
        local.complete(s2)


def test_a_session_receiver_on_an_entity_without_sessions_is_refused(emulator: Emulator) -> None:
    from azure.servicebus.exceptions import ServiceBusError

    with ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0) as sb:
        with pytest.raises(ServiceBusError), sb.get_queue_receiver("orders", session_id="S"):
            pass
