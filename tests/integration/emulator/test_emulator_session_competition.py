"""Two session receivers compete for sessions: every message processed exactly once, in order.

Service Bus guarantees that a session is locked to one receiver at a time, so
messages of a session are handled in order by whoever holds it
(https://learn.microsoft.com/azure/service-bus-messaging/message-sessions).
The client's ``NEXT_AVAILABLE_SESSION`` picks any unlocked session with messages.
"""

from __future__ import annotations

import threading
import time

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

SESSIONS = ("A", "B", "C", "D")
PER_SESSION = 5


def test_two_session_receivers_process_every_message_once_in_order(
    emulator: Emulator, store: LocalBackend
) -> None:
    store.create_entity(EntityProfile("carts", sessions=True))
    sent = [(s, f"{s}-{i}") for i in range(PER_SESSION) for s in SESSIONS]  # interleaved
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("carts", keep_alive=None) as sender:
            sender.send_messages(
                [ServiceBusMessage(mid, message_id=mid, session_id=s) for s, mid in sent]
            )

    processed: list[tuple[str, str, str]] = []  # (worker, session, message id)
    record = threading.Lock()
    errors: list[BaseException] = []
    deadline = time.monotonic() + 60

    def worker(name: str) -> None:
        try:
            with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
                while time.monotonic() < deadline:
                    with record:
                        if len(processed) >= len(sent):
                            return
                    try:
                        receiver = sb.get_queue_receiver(
                            "carts", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                        )
                        receiver.__enter__()
                    except ServiceBusError:
                        continue  # no unlocked session with messages right now
                    with receiver:
                        session = receiver.session.session_id
                        assert session is not None
                        while batch := receiver.receive_messages(
                            max_message_count=2, max_wait_time=1
                        ):
                            for message in batch:
                                with record:
                                    processed.append((name, session, str(message.message_id)))
                                receiver.complete_message(message)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    ids = [mid for _, _, mid in processed]
    assert sorted(ids) == sorted(mid for _, mid in sent)  # each exactly once
    for session in SESSIONS:
        in_order = [mid for _, s, mid in processed if s == session]
        assert in_order == [f"{session}-{i}" for i in range(PER_SESSION)]
    assert store.message_ids("carts") == []


def test_next_available_session_waits_for_a_session(
    emulator: Emulator, store: LocalBackend
) -> None:
    """The attach is held until a session has a message, within the client's max_wait_time."""
    store.create_entity(EntityProfile("carts", sessions=True))
    got: list[tuple[str | None, str]] = []

    def consume() -> None:
        with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
            with sb.get_queue_receiver(
                "carts", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=30
            ) as receiver:
                for message in receiver.receive_messages(max_wait_time=10):
                    got.append((receiver.session.session_id, str(message.message_id)))
                    receiver.complete_message(message)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(1)  # the receiver is waiting for a session (no timing is asserted)
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb:
        with sb.get_queue_sender("carts", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("x", message_id="late", session_id="S"))
    consumer.join(60)
    assert got == [("S", "late")]


def test_next_available_session_times_out_when_none_comes(
    emulator: Emulator, store: LocalBackend
) -> None:
    from azure.servicebus.exceptions import OperationTimeoutError

    store.create_entity(EntityProfile("carts", sessions=True))

    with ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0) as sb:
        with pytest.raises(OperationTimeoutError):
            with sb.get_queue_receiver(
                "carts",
                session_id=NEXT_AVAILABLE_SESSION,
                max_wait_time=1,
            ):
                pass


def test_the_asyncio_client_waits_for_the_next_available_session(
    emulator: Emulator, store: LocalBackend
) -> None:
    import asyncio

    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    store.create_entity(EntityProfile("carts", sessions=True))

    async def run() -> list[tuple[str | None, str]]:
        async with AsyncClient.from_connection_string(emulator.connection_string) as sb:

            async def consume() -> list[tuple[str | None, str]]:
                async with sb.get_queue_receiver(
                    "carts", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=30
                ) as receiver:
                    got = await receiver.receive_messages(max_wait_time=10)
                    for message in got:
                        await receiver.complete_message(message)
                    return [(receiver.session.session_id, str(m.message_id)) for m in got]

            consumer = asyncio.create_task(consume())
            await asyncio.sleep(1)
            async with sb.get_queue_sender("carts", keep_alive=None) as sender:
                await sender.send_messages(
                    ServiceBusMessage("x", message_id="late", session_id="S")
                )
            return await consumer

    assert asyncio.run(run()) == [("S", "late")]
