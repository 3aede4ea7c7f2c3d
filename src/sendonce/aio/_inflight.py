"""Transfers in flight for event loops: the sync rules (``sendonce._inflight``) as tasks.

Up to ``max_in_flight`` transfers of one call run as tasks; transfers sharing a key
never overlap and start in input order (:class:`~sendonce._inflight.Lanes`), and
:class:`AsyncKeyGate` keeps a key exclusive across concurrent calls and senders.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from .. import _sender_telemetry
from .._inflight import Lanes, _entity_of

__all__ = ["AsyncKeyGate", "afly", "cancelled_meanwhile", "cancelling"]

R = TypeVar("R")


class AsyncKeyGate:
    """One transfer per key at a time across tasks, first come first served.

    ``asyncio.Lock`` wakes its waiters in order; a lock lives while someone holds
    or waits for it, so the gate does not grow with the number of keys ever seen.
    """

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def hold(self, key: Hashable | None) -> AsyncIterator[None]:
        """Wait for ``key``'s turn and keep it for the block (None: no wait)."""
        if key is None:
            yield
            return
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            if lock.locked():  # another transfer of this key is in flight: wait for it
                began = time.perf_counter()
                async with lock:
                    _sender_telemetry.lane_wait("key", _entity_of(key), time.perf_counter() - began)
                    yield
            else:
                async with lock:
                    yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]


async def afly(
    keys: Sequence[Hashable | None],
    limit: int,
    step: Callable[[int], Awaitable[R]],
    finish: Callable[[int, R], None],
    *,
    ready: Callable[[int], asyncio.Future[Any] | None] | None = None,
    started: set[int] | None = None,
) -> None:
    """Run ``step(i)`` for every transfer, up to ``limit`` at once, and ``finish`` each.

    ``ready(i)`` returns None when transfer ``i`` may start, or a future to wait for
    first. ``started`` collects the transfers begun. On cancellation (or an error)
    the transfers in flight are cancelled, those that had ended are finished, and the
    exception propagates.
    """
    begun = started if started is not None else set()
    if len(keys) == 1 and ready is None:  # one transfer (a single send): no task, no lanes
        begun.add(0)
        finish(0, await step(0))
        return
    lanes = Lanes(keys)
    running: dict[asyncio.Future[R], int] = {}
    try:
        while lanes:
            blocker = None
            while len(running) < limit and (index := lanes.peek()) is not None:
                blocker = ready(index) if ready is not None else None
                if blocker is not None:
                    break
                lanes.take()
                begun.add(index)
                if limit == 1:  # one at a time: no task to pay for
                    result = await step(index)
                    lanes.finish(index)
                    finish(index, result)
                    continue
                running[asyncio.ensure_future(step(index))] = index
            waited: set[asyncio.Future[Any]] = set(running)
            if blocker is not None:
                waited.add(blocker)
            if not waited:
                continue
            done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                if future is blocker:
                    continue
                index = running.pop(future)
                lanes.finish(index)
                finish(index, future.result())
    except BaseException:
        lanes.drain()
        for future in running:
            future.cancel()
        outcomes = await asyncio.gather(*running, return_exceptions=True)
        for (_, index), outcome in zip(running.items(), outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                finish(index, outcome)
        raise


def cancelling() -> int:
    """How many cancellations the current task has pending (0 outside a task)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def cancelled_meanwhile(before: int) -> None:
    """Raise ``CancelledError`` if the current task was cancelled since ``before``.

    On Python 3.11 ``asyncio.wait_for`` inside a transport can absorb a cancellation
    that lands as its inner wait ends (CPython gh-86296): the call then returns as if
    nothing happened. A cancelled send must raise, so the sender checks on its way out.
    """
    if cancelling() > before:
        raise asyncio.CancelledError()
