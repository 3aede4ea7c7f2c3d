"""sendonce.aio.IdempotentSender over ThreadedBackend(LocalBackend) and FaultyBackend.

Real SQLite broker files; faults injected by the shipped FaultyBackend; time
advanced by a fake clock whose sleep is a coroutine (nothing waits).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _aio_helpers import FakeTime

from sendonce import (
    ConfigurationError,
    EntityProfile,
    InDoubtError,
    Message,
    PayloadConflictError,
    PermanentSendError,
    RetryPolicy,
    SendReport,
    SendResult,
    ValidationError,
)
from sendonce.aio import AsyncBackend, IdempotentSender, ThreadedBackend
from sendonce.backends import Ack
from sendonce.backends.local import LocalBackend
from sendonce.testing import Fault, FaultyBackend

pytestmark = pytest.mark.timeout(120)

ORDERS = EntityProfile("orders")
SHORT = EntityProfile("short", duplicate_detection_window=timedelta(seconds=20))


def msg(i: int | str, body: str = "body", **kw: Any) -> Message:
    return Message(body, message_id=f"order-{i}", **kw)


def faulty(path: Path, faults: Any = ()) -> tuple[ThreadedBackend, FaultyBackend]:
    inner = FaultyBackend(LocalBackend(path), faults)
    return ThreadedBackend(inner), inner


def test_threaded_backend_is_an_async_backend(broker_path: Path) -> None:
    backend = ThreadedBackend(LocalBackend(broker_path))
    assert isinstance(backend, AsyncBackend)
    asyncio.run(backend.close())


# -- in-doubt resends ------------------------------------------------------------------


def test_after_commit_fault_is_resent_and_lands_once(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy, fake_time: FakeTime
) -> None:
    backend, inner = faulty(broker_path, [Fault.AFTER_COMMIT])

    async def main() -> SendResult:
        async with backend, IdempotentSender(backend, ORDERS, retry=retry) as sender:
            return await sender.send(msg(1))

    result = asyncio.run(main())
    assert result.outcome == "sent"  # the duplicate ack is our own earlier attempt
    assert result.attempts == 2
    assert [c.message_ids for c in inner.calls] == [("order-1",)] * 2
    assert fake_time.slept == [0.5]  # the backoff went through the async sleep
    assert store.message_ids("orders") == ["order-1"]


def test_permanent_error_is_not_retried(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    backend, inner = faulty(broker_path, [Fault.PERMANENT])

    async def main() -> None:
        async with backend, IdempotentSender(backend, ORDERS, retry=retry) as sender:
            await sender.send(msg(1))

    with pytest.raises(PermanentSendError) as info:
        asyncio.run(main())
    assert info.value.message_id == "order-1"
    assert len(inner.calls) == 1
    assert store.message_ids("orders") == []


def test_permanent_error_after_an_in_doubt_attempt_is_in_doubt(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    backend, _ = faulty(broker_path, [Fault.AFTER_COMMIT, Fault.PERMANENT])

    async def main() -> None:
        async with backend, IdempotentSender(backend, ORDERS, retry=retry) as sender:
            await sender.send(msg(1))

    with pytest.raises(InDoubtError) as info:
        asyncio.run(main())
    assert info.value.attempts == 2
    assert isinstance(info.value.last_error, PermanentSendError)
    assert store.message_ids("orders") == ["order-1"]  # the first attempt did land


def test_transient_faults_until_the_deadline_raise_in_doubt(
    broker_path: Path, store: LocalBackend, fake_time: FakeTime
) -> None:
    backend, inner = faulty(broker_path, lambda *_: Fault.BEFORE_COMMIT)
    retry = RetryPolicy(
        max_attempts=1000,
        initial_backoff=1.0,
        max_backoff=4.0,
        jitter=False,
        attempt_timeout=5.0,
        sleep=fake_time.sleep,
        async_sleep=fake_time.async_sleep,
        clock=fake_time.clock,
    )
    start = fake_time.now
    timeouts: list[float] = []
    original = inner.send

    def recording_send(entity: str, messages: Sequence[Message], **kw: Any) -> list[Ack]:
        timeouts.append(kw["timeout"])
        return original(entity, messages, **kw)

    inner.send = recording_send  # type: ignore[method-assign]

    async def main() -> None:
        async with backend, IdempotentSender(backend, SHORT, retry=retry) as sender:
            await sender.send(msg(7, partition_key=None))

    with pytest.raises(InDoubtError) as info:
        asyncio.run(main())
    error = info.value
    deadline = start + 20 - 5  # window - safety margin
    assert error.message_id == "order-7"
    assert error.attempts == len(inner.calls) > 3
    assert "deadline" in str(error)
    assert fake_time.now <= deadline
    assert store.message_ids("short") == []
    # each attempt's timeout was cut so that none could still be in flight at the deadline
    elapsed = 0.0
    for timeout, slept in zip(timeouts, [*fake_time.slept, 0.0], strict=True):
        assert start + elapsed + timeout <= deadline + 1e-9
        elapsed += slept


def test_resume_after_the_deadline_sends_nothing(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy, fake_time: FakeTime
) -> None:
    backend, inner = faulty(broker_path)

    async def main() -> None:
        async with backend, IdempotentSender(backend, SHORT, retry=retry) as sender:
            await sender.send(msg(1), first_attempt=fake_time.now - 16)

    with pytest.raises(InDoubtError):
        asyncio.run(main())
    assert inner.calls == []


# -- send_many and the payload memory --------------------------------------------------


def test_send_many_accounts_for_every_message(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    # three transfers of 10: refused, in doubt then resent, clean; plus two in-call repeats
    backend, inner = faulty(broker_path, [Fault.PERMANENT, Fault.AFTER_COMMIT])
    messages = [msg(i) for i in range(30)] + [msg(3), msg(25)]

    async def main() -> SendReport:
        async with (
            backend,
            IdempotentSender(backend, ORDERS, retry=retry, max_batch_messages=10) as sender,
        ):
            return await sender.send_many(messages)

    report = asyncio.run(main())
    assert report.total == 32
    assert report.failed == 11  # order-0..9 and the repeat of order-3
    assert {f.message_id for f in report.failures} == {f"order-{i}" for i in range(10)}
    assert all(isinstance(f.error, PermanentSendError) for f in report.failures)
    assert report.sent == 20 and report.duplicates == 1  # the repeat of order-25
    assert [len(c.message_ids) for c in inner.calls] == [10, 10, 10, 10]
    assert sorted(store.message_ids("orders")) == sorted(f"order-{i}" for i in range(10, 30))
    with pytest.raises(PermanentSendError, match="10 more message"):
        report.raise_for_failures()


def test_payload_conflicts_send_nothing(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    backend, inner = faulty(broker_path)

    async def main() -> None:
        async with backend, IdempotentSender(backend, ORDERS, retry=retry) as sender:
            await sender.send(msg(1, "paid 10"))
            with pytest.raises(PayloadConflictError, match="order-1"):
                await sender.send(msg(1, "paid 20"))
            with pytest.raises(PayloadConflictError, match="same call"):
                await sender.send_many([msg(2, "a"), msg(3), msg(2, "b")])
            with pytest.raises(ValidationError, match=r"messages\[1\]"):
                await sender.send_many([msg(4), "not a message"])  # type: ignore[list-item]
            again = await sender.send(msg(1, "paid 10"))
            assert again.outcome == "duplicate"

    asyncio.run(main())
    assert len(inner.calls) == 2
    assert store.message_ids("orders") == ["order-1"]


def test_schedule_through_the_threaded_backend(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    backend, _ = faulty(broker_path, [Fault.AFTER_COMMIT])
    at = datetime.now(UTC) + timedelta(hours=1)

    async def main() -> SendResult:
        async with backend, IdempotentSender(backend, ORDERS, retry=retry) as sender:
            with pytest.raises(ValidationError, match="timezone-aware"):
                await sender.schedule(msg(9), datetime(2030, 1, 1))
            return await sender.schedule(msg(1), at)

    result = asyncio.run(main())
    assert result.outcome == "scheduled" and result.attempts == 2
    assert store.count("orders") == 0  # not due yet
    assert store.message_ids("orders") == ["order-1"]


# -- many tasks on one sender ----------------------------------------------------------


def test_concurrent_sends_land_each_id_once(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    # every 7th transfer commits and loses its ack: those sends resend from other tasks' midst
    backend, inner = faulty(
        broker_path, lambda i, *_: Fault.AFTER_COMMIT if i % 7 == 3 else Fault.NONE
    )
    messages = [msg(i % 60, f"body {i % 60}") for i in range(200)]

    async def main() -> list[SendResult]:
        async with backend, IdempotentSender(backend, ORDERS, retry=retry) as sender:
            return await asyncio.gather(*(sender.send(m) for m in messages))

    results = asyncio.run(main())
    assert len(results) == 200
    stored = Counter(store.message_ids("orders"))
    assert stored == {f"order-{i}": 1 for i in range(60)}
    # Each call reports from what it saw: a copy dropped as a duplicate is "sent" only when
    # the same call had an in-doubt attempt (its own copy may be the one kept).
    assert {r.message_id for r in results if r.outcome == "sent"} == set(stored)
    faults = sum(c.fault is Fault.AFTER_COMMIT for c in inner.calls)
    assert faults > 0
    assert sum(r.outcome == "sent" for r in results) <= 60 + faults
    assert {r.outcome for r in results} <= {"sent", "duplicate"}
    assert len(inner.calls) > 200


class _Gate:
    """A sync backend whose sends wait on an event: a transfer held in flight for the test."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.release = threading.Event()
        self.entered = threading.Event()
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def describe(self, entity: str) -> EntityProfile:
        return self.inner.describe(entity)

    def create_entity(self, profile: EntityProfile, *, exist_ok: bool = False) -> None:
        self.inner.create_entity(profile, exist_ok=exist_ok)

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            self.entered.set()
            assert self.release.wait(30)
            return self.inner.send(entity, messages, timeout=timeout)
        finally:
            with self._lock:
                self.active -= 1

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        return self.inner.schedule(entity, messages, at, timeout=timeout)

    def close(self) -> None:
        self.inner.close()


def test_cancelled_send_is_in_doubt_and_its_id_is_remembered(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    gate = _Gate(LocalBackend(broker_path))
    backend = ThreadedBackend(gate)  # type: ignore[arg-type]

    async def main() -> tuple[SendResult, SendResult]:
        async with backend, IdempotentSender(backend, ORDERS, retry=retry) as sender:
            first = asyncio.create_task(sender.send(msg(1, "paid 10")))
            await asyncio.to_thread(gate.entered.wait, 30)
            first.cancel()  # mid-transfer: the broker may store it or not
            with pytest.raises(asyncio.CancelledError):
                await first
            # the next call queues behind the one still running on the worker thread
            other = asyncio.create_task(sender.send(msg(2)))
            await asyncio.sleep(0)
            assert gate.max_active == 1
            gate.release.set()
            second = await other
            with pytest.raises(PayloadConflictError):
                await sender.send(msg(1, "paid 20"))
            resend = await sender.send(msg(1, "paid 10"))
            return second, resend

    second, resend = asyncio.run(main())
    assert gate.max_active == 1  # the backend never saw two calls at once
    assert second.outcome == "sent"
    assert resend.outcome == "duplicate"  # the cancelled transfer had landed
    assert sorted(store.message_ids("orders")) == ["order-1", "order-2"]


# -- lifecycle and configuration -------------------------------------------------------


def test_url_backend_is_owned_and_closed(tmp_path: Path, retry: RetryPolicy) -> None:
    url = f"local://{tmp_path / 'b.db'}"

    async def main() -> IdempotentSender:
        async with IdempotentSender(url, ORDERS, retry=retry) as sender:
            await sender.send(msg(1))
            assert isinstance(sender.backend, ThreadedBackend)
            assert await sender.backend.message_ids("orders") == ["order-1"]
        with pytest.raises(ConfigurationError, match="closed"):
            await sender.send(msg(2))
        return sender

    sender = asyncio.run(main())
    with pytest.raises(ConfigurationError, match="closed"):
        asyncio.run(sender.backend.describe("orders"))


def test_entity_by_name_is_described_on_open(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    store.create_entity(EntityProfile("plain", duplicate_detection=False))
    store.create_entity(ORDERS)

    async def main() -> None:
        backend = ThreadedBackend(LocalBackend(broker_path))
        async with backend:
            sender = IdempotentSender(backend, "orders", retry=retry)
            with pytest.raises(ConfigurationError, match="not open"):
                await sender.send(msg(1))
            await sender.open()
            assert sender.profile == ORDERS
            assert (await sender.send(msg(1))).outcome == "sent"
            await sender.close()
            with pytest.raises(ConfigurationError, match="duplicate detection"):
                async with IdempotentSender(backend, "plain", retry=retry):
                    pass
            async with IdempotentSender(
                backend, "plain", retry=retry, require_duplicate_detection=False
            ) as lax:
                assert (await lax.send(msg(2))).outcome == "sent"

    asyncio.run(main())
    assert store.message_ids("plain") == ["order-2"]


def test_bad_options_fail_before_any_io(broker_path: Path) -> None:
    backend = ThreadedBackend(LocalBackend(broker_path))
    with pytest.raises(ConfigurationError) as info:
        IdempotentSender(backend, ORDERS, memory_size=0)
    assert info.value.field == "memory_size"
    with pytest.raises(ConfigurationError) as info:
        IdempotentSender(backend, "")
    assert info.value.field == "entity"
    with pytest.raises(ConfigurationError) as info:
        IdempotentSender(backend, ORDERS, retry="fast")  # type: ignore[arg-type]
    assert info.value.field == "retry"
    with pytest.raises(ConfigurationError, match="ThreadedBackend") as info:
        IdempotentSender(backend.inner, ORDERS)  # type: ignore[arg-type]
    assert info.value.field == "backend"
    asyncio.run(backend.close())


def test_threaded_backend_refuses_what_is_not_a_sync_backend(broker_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="describe"):
        ThreadedBackend(object())  # type: ignore[arg-type]
    inner = ThreadedBackend(LocalBackend(broker_path))
    with pytest.raises(ConfigurationError, match="already asynchronous"):
        ThreadedBackend(inner)  # type: ignore[arg-type]
    asyncio.run(inner.close())


# -- transactions ----------------------------------------------------------------------


def test_transaction_commits_all_or_nothing(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    profile = EntityProfile("artemis", id_cache_size=100)

    async def main() -> None:
        backend, inner = faulty(broker_path, [Fault.NONE, Fault.AFTER_COMMIT])
        async with backend, IdempotentSender(backend, profile, retry=retry) as sender:
            async with sender.transaction() as tx:
                tx.send(msg(1))
                tx.send(msg(2))
                # another task may send meanwhile; the group is not sent yet
                assert (await sender.send(msg(9))).outcome == "sent"
                assert await backend.message_ids("artemis") == ["order-9"]
            # the group's commit lost its ack; the resend found both ids: our own group landed
            assert tx.report is not None and tx.report.sent == 2
            assert [c.message_ids for c in inner.calls[1:]] == [("order-1", "order-2")] * 2
            async with sender.transaction() as tx:
                tx.send_many([msg(3), msg(2)])  # order-2 is a duplicate: the group is ignored
            assert tx.report is not None
            assert (tx.report.duplicates, tx.report.failed) == (1, 1)
            lost = tx.report.failures[0]
            assert lost.message_id == "order-3"
            assert isinstance(lost.error, PermanentSendError)
            assert lost.error.condition == "sendonce:group-ignored"
            with pytest.raises(RuntimeError):
                async with sender.transaction() as tx:
                    tx.send(msg(5))
                    raise RuntimeError("application failed mid-group")
            with pytest.raises(PayloadConflictError):
                async with sender.transaction() as tx:
                    tx.send(msg(1, "another body"))

    asyncio.run(main())
    assert sorted(store.message_ids("artemis")) == ["order-1", "order-2", "order-9"]
