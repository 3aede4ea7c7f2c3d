"""sendonce.aio over the real azure.servicebus.aio client, against the emulator.

Every in-doubt fault must end with each business message in the queue exactly
once; a refusal must not be retried.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _aio_sb_helpers import EVENTS, ORDERS, SHORT, FakeTime

from sendonce import (
    ConfigurationError,
    InDoubtError,
    Message,
    PayloadConflictError,
    PermanentSendError,
    RetryPolicy,
    SendReport,
    SendResult,
    TransientSendError,
)
from sendonce.aio import AsyncBackend, AzureServiceBusBackend, IdempotentSender, connect
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator, Fault, FaultAction

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def backend_for(emulator: Emulator, **options: Any) -> AzureServiceBusBackend:
    profiles = {p.name: p for p in (ORDERS, EVENTS, SHORT)}
    return AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles=profiles, **options
    )


def orders(n: int, prefix: str = "order") -> list[Message]:
    return [Message(f"body {i}", message_id=f"{prefix}-{i}") for i in range(n)]


def test_sends_batches_and_schedules_arrive(
    emulator: Emulator, store: LocalBackend, retry: RetryPolicy
) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)

    async def main() -> tuple[SendResult, SendReport, SendResult]:
        backend = backend_for(emulator)
        assert isinstance(backend, AsyncBackend)
        async with backend, IdempotentSender(backend, "orders", retry=retry) as sender:
            one = await sender.send(Message("one", message_id="a-1"))
            many = await sender.send_many(orders(20))
            later = await sender.schedule(Message("later", message_id="sch-1"), at)
            return one, many, later

    one, many, later = asyncio.run(main())
    assert one.outcome == "sent" and one.attempts == 1
    assert many.sent == 20 and many.failed == 0
    assert later.outcome == "scheduled" and later.sequence_number is not None
    assert store.message_ids("orders") == ["a-1", *[f"order-{i}" for i in range(20)], "sch-1"]
    (scheduled,) = [m for m in store.peek("orders", max_messages=30) if m.message_id == "sch-1"]
    assert scheduled.scheduled_enqueue_time is not None
    assert abs(scheduled.scheduled_enqueue_time - at) < timedelta(milliseconds=1)


@pytest.mark.parametrize(
    "action",
    [
        FaultAction.DROP_AFTER_COMMIT,
        FaultAction.DETACH_AFTER_COMMIT,
        FaultAction.WITHHOLD,
        FaultAction.SERVER_BUSY,
        FaultAction.DROP_BEFORE_COMMIT,
    ],
)
def test_each_fault_ends_with_every_message_exactly_once(
    emulator: Emulator, store: LocalBackend, fake_time: FakeTime, action: FaultAction
) -> None:
    messages = orders(6)
    withheld = action is FaultAction.WITHHOLD
    retry = RetryPolicy(
        async_sleep=fake_time.async_sleep,
        clock=fake_time.clock,
        jitter=False,
        # A withheld disposition costs the attempt timeout: 1 s there. Elsewhere a timeout
        # that no loaded machine's link opening reaches (the verdict must not hang on load).
        attempt_timeout=1.0 if withheld else 60.0,
        max_attempts=30,
    )

    async def main() -> tuple[SendResult, SendReport]:
        async with (
            backend_for(emulator) as backend,
            IdempotentSender(backend, ORDERS, retry=retry) as sender,
        ):
            emulator.faults.add(Fault(action, entity="orders"))
            single = await sender.send(messages[0])
            emulator.faults.add(Fault(action, entity="orders"))
            report = await sender.send_many(messages[1:])
            return single, report

    single, report = asyncio.run(main())
    # the fault costs one attempt; a busy machine may make a 1 s attempt after it time out too
    assert single.outcome == "sent"
    assert single.attempts >= 2 if withheld else single.attempts == 2
    assert report.failed == 0 and report.sent + report.duplicates == 5
    assert emulator.faults.pending == 0
    assert store.message_ids("orders") == [m.message_id for m in messages]


def test_schedule_survives_a_drop_after_commit(
    emulator: Emulator, store: LocalBackend, retry: RetryPolicy
) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    emulator.faults.add(Fault(FaultAction.DROP_AFTER_COMMIT, operation="schedule"))

    async def main() -> SendResult:
        async with (
            backend_for(emulator) as backend,
            IdempotentSender(backend, ORDERS, retry=retry) as sender,
        ):
            return await sender.schedule(Message("later", message_id="sch-1"), at)

    result = asyncio.run(main())
    assert result.outcome == "scheduled" and result.attempts == 2
    assert store.message_ids("orders") == ["sch-1"]


def test_unauthorized_is_permanent_and_not_retried(
    emulator: Emulator, store: LocalBackend, retry: RetryPolicy
) -> None:
    emulator.faults.add(Fault(FaultAction.UNAUTHORIZED, entity="orders"))

    async def main() -> None:
        async with (
            backend_for(emulator) as backend,
            IdempotentSender(backend, ORDERS, retry=retry) as sender,
        ):
            with pytest.raises(PermanentSendError) as info:
                await sender.send(Message("x", message_id="u-1"))
            assert info.value.condition == "amqp:unauthorized-access"
            assert info.value.message_id == "u-1"
            # the link was replaced: the next send goes through
            assert (await sender.send(Message("y", message_id="u-2"))).outcome == "sent"

    asyncio.run(main())
    assert emulator.transfers("orders") == 2  # one refused, one stored: no retry
    assert store.message_ids("orders") == ["u-2"]


def test_faults_until_the_deadline_raise_in_doubt(
    emulator: Emulator, store: LocalBackend, fake_time: FakeTime
) -> None:
    for _ in range(40):
        emulator.faults.add(Fault(FaultAction.SERVER_BUSY, entity="short"))
    retry = RetryPolicy(
        max_attempts=40,
        initial_backoff=2.0,
        max_backoff=4.0,
        jitter=False,
        attempt_timeout=5.0,
        async_sleep=fake_time.async_sleep,
        clock=fake_time.clock,
    )

    async def main() -> None:
        async with (
            backend_for(emulator) as backend,
            IdempotentSender(backend, "short", retry=retry) as sender,
        ):
            await sender.send(Message("x", message_id="s-1"))

    with pytest.raises(InDoubtError, match="deadline") as info:
        asyncio.run(main())
    assert info.value.message_id == "s-1"
    assert 1 < info.value.attempts < 40
    assert fake_time.now <= 1000 + 20 - 5
    assert store.message_ids("short") == []


def test_topic_sends_reach_every_subscription_once(
    emulator: Emulator, store: LocalBackend, retry: RetryPolicy
) -> None:
    emulator.faults.add(Fault(FaultAction.DROP_AFTER_COMMIT, entity="events"))

    async def main() -> SendReport:
        async with (
            backend_for(emulator) as backend,
            IdempotentSender(backend, EVENTS, retry=retry) as sender,
        ):
            return await sender.send_many(orders(5, "evt"))

    report = asyncio.run(main())
    assert report.failed == 0
    for sub in ("a", "b"):
        assert store.message_ids("events", subscription=sub) == [f"evt-{i}" for i in range(5)]


def test_concurrent_tasks_share_one_backend(
    emulator: Emulator, store: LocalBackend, retry: RetryPolicy
) -> None:
    emulator.faults.add(Fault(FaultAction.DROP_AFTER_COMMIT, entity="orders"))
    messages = [Message(f"body {i % 15}", message_id=f"c-{i % 15}") for i in range(40)]

    async def main() -> list[SendResult]:
        async with connect(emulator.connection_string, profiles={"orders": ORDERS}) as backend:
            async with IdempotentSender(backend, "orders", retry=retry) as sender:
                return await asyncio.gather(*(sender.send(m) for m in messages))

    results = asyncio.run(main())
    assert len(results) == 40
    assert Counter(store.message_ids("orders")) == {f"c-{i}": 1 for i in range(15)}


@pytest.fixture
def silent_peer() -> Iterator[int]:
    """A TCP listener that accepts and never says a word (a hung broker)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_link_opening_is_bounded_by_the_call_timeout(silent_peer: int) -> None:
    conn_str = (
        f"Endpoint=sb://127.0.0.1:{silent_peer};SharedAccessKeyName=k;"
        "SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true"
    )

    async def main() -> None:
        async with AzureServiceBusBackend.from_connection_string(
            conn_str, profiles={"orders": ORDERS}
        ) as backend:
            with pytest.raises(TransientSendError, match="nothing was sent") as info:
                await backend.send("orders", orders(1), timeout=0.5)
            assert "c2VjcmV0" not in str(info.value)

    asyncio.run(main())


def test_emulator_needs_explicit_profiles(emulator: Emulator) -> None:
    async def main() -> None:
        async with AzureServiceBusBackend.from_connection_string(
            emulator.connection_string
        ) as backend:
            with pytest.raises(ConfigurationError, match="profiles=") as info:
                await backend.describe("orders")
            assert info.value.field == "entity"
            with pytest.raises(ConfigurationError, match="transactions"):
                await backend.send("orders", orders(2), timeout=1, atomic=True)

    asyncio.run(main())


def test_transactions_are_refused_on_service_bus(emulator: Emulator, retry: RetryPolicy) -> None:
    async def main() -> None:
        async with (
            backend_for(emulator) as backend,
            IdempotentSender(backend, ORDERS, retry=retry) as sender,
        ):
            with pytest.raises(ConfigurationError, match="no transactions") as info:
                async with sender.transaction():
                    pass
            assert info.value.field == "transaction"

    asyncio.run(main())


def test_cancelled_transfer_is_in_doubt_and_the_link_is_replaced(
    emulator: Emulator, store: LocalBackend, retry: RetryPolicy
) -> None:
    emulator.faults.add(Fault(FaultAction.WITHHOLD, entity="orders"))  # stored, never settled

    async def main() -> SendResult:
        async with (
            backend_for(emulator) as backend,
            IdempotentSender(backend, ORDERS, retry=retry) as sender,
        ):
            task = asyncio.create_task(sender.send(Message("paid", message_id="x-1")))
            while emulator.transfers("orders") == 0:  # the broker has the transfer
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # in doubt: the resend (same body) is safe, a different body is refused
            with pytest.raises(PayloadConflictError):
                await sender.send(Message("other", message_id="x-1"))
            return await sender.send(Message("paid", message_id="x-1"))

    resend = asyncio.run(main())
    assert resend.outcome == "sent" and resend.attempts == 1  # a new link carried it
    assert emulator.transfers("orders") == 2
    assert store.message_ids("orders") == ["x-1"]
