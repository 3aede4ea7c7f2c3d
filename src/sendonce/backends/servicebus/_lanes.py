"""Lanes: up to ``max_in_flight`` sender links to one entity, one transfer on each at a time.

A ``ServiceBusSender`` is not safe for concurrent use (azure-sdk-for-python #36334):
one transfer per link at a time. Serialising every call on one link caps a
producer at one transfer per network round trip; a pool of links (what
azure-sdk-for-python #33608 asks the client for) lets that many transfers be
outstanding at once. A lane is opened only when every open one is busy, so a
sequential caller keeps using one link.

The pool only lends and takes back: the backend opens, uses and closes the
senders, because the sync and the asyncio backends do that differently. A lane
given back after a failure is not reused (its link may be dead), and the other
lanes' transfers are not disturbed by it.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from ...errors import ConfigurationError

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "AsyncLanes",
    "Lane",
    "Lanes",
    "check_max_in_flight",
]

S = TypeVar("S")

DEFAULT_MAX_IN_FLIGHT = 16
"""Chosen by measurement (docs/benchmarks.md, "Over a network round trip"): at 5 ms RTT
16 lanes carry about 16 transfers per round trip against the emulator, and more adds
connections (each lane is one AMQP connection) for little gain."""

_MAX_LANES = 256


def check_max_in_flight(value: object) -> int:
    """An int from 1 to 256: how many transfers a backend carries at once per entity."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _MAX_LANES:
        raise ConfigurationError(
            f"max_in_flight must be an int from 1 to {_MAX_LANES}, got {value!r}",
            field="max_in_flight",
        )
    return value


@dataclass(slots=True, eq=False)
class Lane(Generic[S]):
    """One sender link. ``opened``: its link is attached. ``abandoned``: a helper thread
    still holds it (its opening outlived the call), so only that thread may close it."""

    sender: S
    opened: bool = False
    abandoned: bool = False


class Lanes(Generic[S]):
    """The lanes of one entity, for threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)
        self._guard = threading.Lock()
        self._idle: list[Lane[S]] = []
        self._closed = False

    def take(self, timeout: float) -> tuple[Lane[S] | None, bool]:
        """Wait up to ``timeout`` for a free lane: ``(idle lane or None for a new one, got)``."""
        if not self._free.acquire(timeout=max(timeout, 0.0)):
            return None, False
        return self._lend()

    def take_now(self) -> tuple[Lane[S] | None, bool]:
        """:meth:`take` without waiting: ``got`` is False when the caller must wait."""
        if not self._free.acquire(blocking=False):
            return None, False
        return self._lend()

    def _lend(self) -> tuple[Lane[S] | None, bool]:
        with self._guard:
            if self._closed:
                self._free.release()
                raise ConfigurationError("the backend is closed", field="backend")
            return (self._idle.pop() if self._idle else None), True

    def cancel(self) -> None:
        """Undo a ``take`` whose new lane could not be made."""
        self._free.release()

    def give_back(self, lane: Lane[S], *, keep: bool) -> bool:
        """Return a taken lane; ``True`` when the caller must close its sender."""
        with self._guard:
            kept = keep and not self._closed and not lane.abandoned
            if kept:
                self._idle.append(lane)
        self._free.release()
        return not kept and not lane.abandoned

    def close(self, wait: float) -> list[Lane[S]]:
        """Stop lending; wait up to ``wait`` for lanes in use; return the idle ones to close.

        Lanes still in use after the wait are closed by their users on ``give_back``.
        """
        with self._guard:
            self._closed = True
        deadline = time.monotonic() + wait
        held = 0
        for _ in range(self.size):
            if not self._free.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                break
            held += 1
        for _ in range(held):
            self._free.release()
        with self._guard:
            idle, self._idle = self._idle, []
        return idle


class AsyncLanes(Generic[S]):
    """The lanes of one entity, for one event loop (no lock: the loop is the only thread).

    Waiters queue first come first served and a lane given back goes straight to the
    longest waiter. Each waiter costs one future and one timer, whatever the queue's
    length: a waiter that gives up (timeout, cancellation) stays in the queue, done,
    and is skipped when its turn comes, so nothing walks the queue.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._available = size
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._idle: list[Lane[S]] = []
        self._closed = False
        # The waiters' timers run in this context: ``_give_up`` reads no context variable,
        # so none is copied per waiter. One per pool: a context runs one callback at a
        # time, and pools of different event loops may fire at once.
        self._timer_context = contextvars.Context()

    async def take(self, timeout: float, *, closing: bool = False) -> tuple[Lane[S] | None, bool]:
        """Wait up to ``timeout`` for a free lane: ``(idle lane or None for a new one, got)``.

        ``closing``: :meth:`close` collecting the lanes (it may take them once closed).
        """
        if self._available and not self._waiters:
            self._available -= 1  # free now: no suspension, no cancel point
        else:
            loop = asyncio.get_running_loop()
            turn: asyncio.Future[bool] = loop.create_future()
            self._waiters.append(turn)
            timer = loop.call_later(max(timeout, 0.0), _give_up, turn, context=self._timer_context)
            try:
                got = await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled() and turn.result():
                    self._release()  # handed a lane as the cancel landed: pass it on
                raise
            finally:
                timer.cancel()
            if not got:
                return None, False
        if self._closed and not closing:
            self._release()
            raise ConfigurationError("the backend is closed", field="backend")
        return (self._idle.pop() if self._idle and not closing else None), True

    def take_now(self) -> tuple[Lane[S] | None, bool]:
        """:meth:`take` without waiting: ``(idle lane or None, got)``; ``got`` is False when
        the caller must queue (``await take(timeout)``)."""
        if not self._available or self._waiters or self._closed:
            return None, False
        self._available -= 1
        return (self._idle.pop() if self._idle else None), True

    def _release(self) -> None:
        """A lane is free: hand it to the longest waiter still waiting, else keep it."""
        waiters = self._waiters
        while waiters:
            turn = waiters.popleft()
            if not turn.done():
                turn.set_result(True)
                return
        self._available += 1

    def cancel(self) -> None:
        """Undo a ``take`` whose new lane could not be made."""
        self._release()

    def give_back(self, lane: Lane[S], *, keep: bool) -> bool:
        """Return a taken lane; ``True`` when the caller must close its sender."""
        kept = keep and not self._closed
        if kept:
            self._idle.append(lane)
        self._release()
        return not kept

    async def close(self, wait: float) -> list[Lane[S]]:
        """Stop lending; wait up to ``wait`` for lanes in use; return the idle ones to close."""
        self._closed = True
        deadline = time.monotonic() + wait
        held = 0
        try:
            for _ in range(self.size):
                _, got = await self.take(deadline - time.monotonic(), closing=True)
                if not got:
                    break
                held += 1
        finally:
            for _ in range(held):
                self._release()
        idle, self._idle = self._idle, []
        return idle


def _give_up(turn: asyncio.Future[bool]) -> None:
    """A waiter's timeout: it stops waiting (and is skipped when its turn comes)."""
    if not turn.done():
        turn.set_result(False)
