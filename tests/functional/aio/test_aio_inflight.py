"""Transfers in flight (aio): several tasks' transfers at once over the real local broker.

:class:`AsyncOverlap` holds each transfer until a number of them are awaited at once,
which a sender sending one at a time never reaches; the local broker behind it (on its
worker thread) stores them one by one, in the order they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from sendonce import EntityProfile, InDoubtError, Message, RetryPolicy
from sendonce.aio import IdempotentSender, ThreadedBackend
from sendonce.backends.local import LocalBackend
from sendonce.testing import Fault, FaultyBackend

pytestmark = pytest.mark.timeout(120)

PARTITIONED = EntityProfile("orders", partitioned=True)


def run(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The test body on a fresh event loop (fixtures still resolve by the signature)."""

    @functools.wraps(test)
    def sync(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return sync


class AsyncOverlap:
    """An async backend proving transfers overlap and no key is in flight twice."""

    def __init__(self, inner: ThreadedBackend, parties: int) -> None:
        self.inner = inner
        self.parties = parties
        self.reached = asyncio.Event()
        self.inside: Counter[object] = Counter()
        self.now = 0
        self.peak = 0
        self.overlapping_keys: list[object] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> Any:
        first = messages[0]
        key = (first.partition_key, first.session_id)
        if key != (None, None) and self.inside[key]:
            self.overlapping_keys.append(key)
        self.inside[key] += 1
        self.now += 1
        self.peak = max(self.peak, self.now)
        if self.now >= self.parties:
            self.reached.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.reached.wait(), 10)
        try:
            return await self.inner.send(entity, messages, **kw)
        finally:
            self.inside[key] -= 1
            self.now -= 1


@pytest.fixture
def retry() -> RetryPolicy:  # overrides the suite's fake clock: nothing here waits
    return RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False)


def keyed(count: int, keys: int) -> list[Message]:
    return [
        Message(f"body {i}", message_id=f"order-{i}", partition_key=f"customer-{i % keys}")
        for i in range(count)
    ]


def per_key(ids: Sequence[str], messages: Sequence[Message]) -> dict[str | None, list[str]]:
    key_of = {m.message_id: m.partition_key for m in messages}
    lanes: dict[str | None, list[str]] = defaultdict(list)
    for message_id in ids:
        lanes[key_of[message_id]].append(message_id)
    return dict(lanes)


@run
async def test_send_many_keeps_several_transfers_in_flight_in_order_per_key(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    messages = keyed(64, keys=16)
    overlap = AsyncOverlap(ThreadedBackend(LocalBackend(broker_path)), parties=8)
    async with (
        overlap.inner,
        IdempotentSender(overlap, PARTITIONED, retry=retry, max_in_flight=8) as sender,
    ):
        report = await sender.send_many(messages)
    assert overlap.reached.is_set() and overlap.peak <= 8
    assert overlap.overlapping_keys == []
    assert report.sent == 64
    assert [r.message_id for r in report.results] == [m.message_id for m in messages]
    stored = store.message_ids("orders")
    assert Counter(stored) == Counter(m.message_id for m in messages)
    assert per_key(stored, messages) == per_key([m.message_id for m in messages], messages)


@run
async def test_concurrent_tasks_overlap_but_never_on_one_key(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    """Request handlers: one send() per task, 4 keys; tasks of a key queue up in order."""
    messages = keyed(40, keys=4)
    overlap = AsyncOverlap(ThreadedBackend(LocalBackend(broker_path)), parties=4)
    async with overlap.inner, IdempotentSender(overlap, PARTITIONED, retry=retry) as sender:
        results = await asyncio.gather(*(sender.send(m) for m in messages))
    assert overlap.reached.is_set()
    assert overlap.overlapping_keys == []
    assert [r.outcome for r in results] == ["sent"] * 40
    stored = store.message_ids("orders")
    assert per_key(stored, messages) == per_key([m.message_id for m in messages], messages)


@run
async def test_a_lost_ack_on_one_lane_leaves_every_message_once(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    lost: set[str] = set()

    def script(index: int, entity: str, messages: Sequence[Message]) -> Fault:
        message_id = messages[0].message_id
        if message_id in {"order-2", "order-7"} and message_id not in lost:
            lost.add(message_id)
            return Fault.AFTER_COMMIT
        return Fault.NONE

    backend = ThreadedBackend(FaultyBackend(LocalBackend(broker_path), script))
    messages = keyed(24, keys=6)
    async with (
        backend,
        IdempotentSender(backend, PARTITIONED, retry=retry, max_in_flight=6) as sender,
    ):
        report = await sender.send_many(messages)
    assert report.sent == 24 and report.failed == 0
    assert [r.message_id for r in report.results] == [m.message_id for m in messages]
    stored = store.message_ids("orders")
    assert Counter(stored) == Counter(m.message_id for m in messages)
    assert per_key(stored, messages) == per_key([m.message_id for m in messages], messages)


@run
async def test_in_doubt_on_one_lane_is_reported_while_the_others_are_sent(
    broker_path: Path, store: LocalBackend
) -> None:
    retry = RetryPolicy(max_attempts=2, initial_backoff=0, jitter=False)

    def script(index: int, entity: str, messages: Sequence[Message]) -> Fault:
        return Fault.AFTER_COMMIT if messages[0].message_id == "order-5" else Fault.NONE

    backend = ThreadedBackend(FaultyBackend(LocalBackend(broker_path), script))
    async with (
        backend,
        IdempotentSender(backend, PARTITIONED, retry=retry, max_in_flight=8) as sender,
    ):
        report = await sender.send_many(keyed(20, keys=10))
    assert report.in_doubt == ["order-5"]
    assert isinstance(report.failures[0].error, InDoubtError)
    assert report.sent == 19
    assert store.count("orders") == 20


@run
async def test_a_cancelled_send_many_raises_cancelled_and_starts_nothing_more(
    broker_path: Path, store: LocalBackend, retry: RetryPolicy
) -> None:
    gate = asyncio.Event()
    arrived = asyncio.Event()

    class Held:
        def __init__(self, inner: ThreadedBackend) -> None:
            self.inner = inner
            self.calls = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> Any:
            self.calls += 1
            if self.calls == 4:
                arrived.set()
            await gate.wait()
            return await self.inner.send(entity, messages, **kw)

    held = Held(ThreadedBackend(LocalBackend(broker_path)))
    async with (
        held.inner,
        IdempotentSender(held, PARTITIONED, retry=retry, max_in_flight=4) as sender,
    ):
        task = asyncio.ensure_future(sender.send_many(keyed(40, keys=40)))
        await arrived.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert held.calls == 4  # the 4 in flight were cancelled; nothing else started
    assert store.count("orders") == 0
