"""Transfers in flight: several at once, one at a time per key, in input order per key.

A broker answers a transfer after a network round trip, so one transfer at a time
caps a sender at 1/RTT transfers per second. The sender therefore keeps up to
``max_in_flight`` transfers outstanding. Service Bus keeps order only per session
or partition key, and so does the sender: transfers sharing a key (partition key
or session id) are never in flight together and start in input order; unkeyed
transfers run side by side.

:class:`Lanes` decides which transfer of one call may start next; :class:`KeyGate`
keeps keys exclusive across concurrent calls (threads, or several senders on one
backend); :func:`fly` is the sync driver (a thread pool; the aio driver is in
``sendonce.aio._inflight``).
"""

from __future__ import annotations

import contextvars
import heapq
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

from . import _sender_telemetry
from .errors import ConfigurationError

__all__ = ["KeyGate", "Lanes", "Stopped", "fly", "gate_for", "in_flight_limit"]

R = TypeVar("R")


class Stopped(Exception):
    """Internal: a transfer did not start (another attempt) because its call was interrupted.

    ``attempts`` says how many attempts it had made (0: it was never attempted).
    """

    def __init__(self, attempts: int) -> None:
        super().__init__(f"stopped after {attempts} attempt(s)")
        self.attempts = attempts


def in_flight_limit(backend: object, override: int | None) -> int:
    """The sender's limit: ``override`` if given, else the backend's ``max_in_flight`` (1)."""
    if override is not None:
        if not isinstance(override, int) or isinstance(override, bool) or override < 1:
            raise ConfigurationError(
                "max_in_flight must be an int >= 1 or None (the backend's)", field="max_in_flight"
            )
        return override
    value = getattr(backend, "max_in_flight", 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(
            f"{type(backend).__name__}.max_in_flight must be an int >= 1, not {value!r}",
            field="max_in_flight",
        )
    return value


class Lanes:
    """Which transfers of one call may start: per key one at a time, in input order.

    ``keys[i]`` is transfer ``i``'s key, or None when it may run beside anything.
    :meth:`take` hands out the lowest-numbered transfer that may start now, so a call
    progresses in input order (what a ledger writing intents ahead relies on).
    """

    __slots__ = ("_busy", "_keys", "_left", "_ready", "_waiting")

    def __init__(self, keys: Sequence[Hashable | None]) -> None:
        self._keys = keys
        self._waiting: dict[Hashable, deque[int]] = {}
        self._busy: set[Hashable] = set()
        self._ready: list[int] = []
        for index, key in enumerate(keys):
            if key is None:
                self._ready.append(index)
            elif key in self._waiting:
                self._waiting[key].append(index)
            else:
                self._waiting[key] = deque()
                self._ready.append(index)
        heapq.heapify(self._ready)
        self._left = len(keys)

    def __len__(self) -> int:
        """Transfers not finished yet."""
        return self._left

    def peek(self) -> int | None:
        """The transfer :meth:`take` would return, without taking it."""
        return self._ready[0] if self._ready else None

    def take(self) -> int | None:
        """The next transfer that may start (None: all are running or wait for their key)."""
        return heapq.heappop(self._ready) if self._ready else None

    def finish(self, index: int) -> None:
        """Transfer ``index`` is over: the next one of its key may start."""
        self._left -= 1
        key = self._keys[index]
        if key is None:
            return
        queue = self._waiting[key]
        if queue:
            heapq.heappush(self._ready, queue.popleft())

    def drain(self) -> list[int]:
        """Every transfer not yet started (they never will be)."""
        rest = list(self._ready)
        for queue in self._waiting.values():
            rest.extend(queue)
            queue.clear()
        self._ready.clear()
        self._left -= len(rest)
        return sorted(rest)


class KeyGate:
    """One transfer per key at a time across threads, first come first served.

    Shared by every sender on one backend (:func:`gate_for`), so two calls, or two
    senders, never have transfers of one partition key or session in flight together.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._queues: dict[Hashable, deque[object]] = {}

    @contextmanager
    def hold(self, key: Hashable | None) -> Iterator[None]:
        """Wait for ``key``'s turn, and keep it for the ``with`` block (None: no wait)."""
        if key is None:
            yield
            return
        ticket = object()
        waited = None
        with self._lock:
            queue = self._queues.setdefault(key, deque())
            queue.append(ticket)
            if queue[0] is not ticket:
                began = time.perf_counter()
                while queue[0] is not ticket:
                    self._lock.wait()
                waited = time.perf_counter() - began
        if waited is not None:
            _sender_telemetry.lane_wait("key", _entity_of(key), waited)
        try:
            yield
        finally:
            with self._lock:
                queue.popleft()
                if not queue:
                    del self._queues[key]
                self._lock.notify_all()


def _entity_of(key: Hashable) -> str:
    """The entity of a gate key (the sender's keys are ``(entity, (pk, sid))``)."""
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


_GATES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_GATES_LOCK = threading.Lock()


def gate_for(backend: object, make: Callable[[], R]) -> R:
    """The gate every sender on ``backend`` shares (a private one if it takes no weakref)."""
    with _GATES_LOCK:
        try:
            gate = _GATES.get(backend)
            if gate is None:
                gate = _GATES[backend] = make()
        except TypeError:
            return make()
    return gate


def fly(
    keys: Sequence[Hashable | None],
    limit: int,
    step: Callable[[int], R],
    finish: Callable[[int, R], None],
    stop: threading.Event,
    *,
    ready: Callable[[int], Future[Any] | None] | None = None,
) -> None:
    """Run ``step(i)`` for every transfer, up to ``limit`` at once, and ``finish`` each.

    ``finish`` runs in the calling thread, in completion order. ``ready(i)`` returns
    None when transfer ``i`` may start, or a future to wait for first (its intents
    being written). An exception or interruption (``KeyboardInterrupt``) sets
    ``stop`` so that no transfer starts another attempt, waits for those in flight,
    finishes them, and propagates.
    """
    lanes = Lanes(keys)
    if limit <= 1 or len(keys) <= 1:
        _fly_inline(lanes, step, finish, stop, ready)
        return
    pool = ThreadPoolExecutor(max_workers=min(limit, len(keys)), thread_name_prefix="sendonce")
    running: dict[Future[R], int] = {}
    try:
        while lanes:
            blocker = None
            while len(running) < limit and (index := lanes.peek()) is not None:
                blocker = ready(index) if ready is not None else None
                if blocker is not None:
                    break
                lanes.take()
                # In the caller's context (a transfer's span is a child of its call's).
                running[pool.submit(contextvars.copy_context().run, step, index)] = index
            waited: set[Future[Any]] = set(running)
            if blocker is not None:
                waited.add(blocker)
            done, _ = wait(waited, return_when=FIRST_COMPLETED)
            for future in done:
                if future is blocker:
                    continue
                index = running.pop(future)
                lanes.finish(index)
                finish(index, future.result())
    except BaseException:
        stop.set()
        lanes.drain()
        _land(running, finish)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _land(running: dict[Future[R], int], finish: Callable[[int, R], None]) -> None:
    """After an interruption: let the transfers in flight end, and finish those that did."""
    for future, index in running.items():
        try:
            result = future.result()
        except Exception:
            continue
        finish(index, result)


def _fly_inline(
    lanes: Lanes,
    step: Callable[[int], R],
    finish: Callable[[int, R], None],
    stop: threading.Event,
    ready: Callable[[int], Future[Any] | None] | None,
) -> None:
    """One at a time, in the calling thread (a limit of 1: no pool to pay for)."""
    try:
        while (index := lanes.take()) is not None:
            if ready is not None:
                while (blocker := ready(index)) is not None:
                    wait([blocker])
            result = step(index)
            lanes.finish(index)
            finish(index, result)
    except BaseException:
        stop.set()
        lanes.drain()
        raise
