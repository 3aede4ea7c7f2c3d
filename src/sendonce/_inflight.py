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

import contextlib
import contextvars
import heapq
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar, cast

from . import _sender_telemetry
from .errors import ConfigurationError

__all__ = ["Flight", "KeyGate", "Lanes", "Stopped", "fly", "gate_for", "in_flight_limit"]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


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
        for waiting in self._waiting.values():
            rest.extend(waiting)
            waiting.clear()
        self._ready.clear()
        self._left -= len(rest)
        return sorted(rest)


class KeyGate:
    """One transfer per key at a time across threads, first come first served.

    Shared by every sender on one backend (:func:`gate_for`), so two calls, or two
    senders, never have transfers of one partition key or session in flight together.
    :meth:`hold` waits in the calling thread; :meth:`enter` does not wait: its future
    is done when the key's turn comes (the submit-driven engine waits on it beside the
    transfers in flight).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[Hashable, deque[Future[None]]] = {}

    @contextmanager
    def hold(self, key: Hashable | None) -> Iterator[None]:
        """Wait for ``key``'s turn, and keep it for the ``with`` block (None: no wait)."""
        if key is None:
            yield
            return
        ticket = self.enter(key)
        if not ticket.done():
            began = time.perf_counter()
            try:
                ticket.result()
            except BaseException:
                if not self.withdraw(key, ticket):
                    self.leave(key, ticket)  # granted meanwhile: pass the turn on
                raise
            _sender_telemetry.lane_wait("key", _entity_of(key), time.perf_counter() - began)
        try:
            yield
        finally:
            self.leave(key, ticket)

    def enter(self, key: Hashable) -> Future[None]:
        """Queue for ``key``: a ticket, done once it is this caller's turn (at once if the
        key is free). Give it back with :meth:`leave` (or :meth:`withdraw` unused)."""
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:  # free: the shared done ticket (its holder is queue[0])
                self._queues[key] = deque((_FREE,))
                return _FREE
            ticket: Future[None] = Future()
            queue.append(ticket)
        return ticket

    def leave(self, key: Hashable, ticket: Future[None]) -> None:
        """The holder of ``key`` is done: the next ticket's turn comes (its callbacks run
        in this thread)."""
        following = None
        with self._lock:
            queue = self._queues[key]
            if queue and queue[0] is ticket:
                queue.popleft()
            if queue:
                following = queue[0]
            else:
                del self._queues[key]
        if following is not None and not following.done():
            following.set_result(None)

    def withdraw(self, key: Hashable, ticket: Future[None]) -> bool:
        """Leave the queue before the turn came: True if done so (False: it had come)."""
        with self._lock:
            queue = self._queues.get(key)
            if queue is None or ticket.done() or queue[0] is ticket:
                return False
            queue.remove(ticket)
        ticket.cancel()
        return True


_FREE: Future[None] = Future()
"""The ticket of a key entered while free: done already, and shared (a key's queue holds it
only at its head, so it never stands twice in one queue); a Future less per transfer."""
_FREE.set_result(None)


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


class Pending(Protocol[R_co]):
    """What the driver needs of a transfer in flight: a ``concurrent.futures.Future`` (a
    pool's) or a :class:`Flight`."""

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None: ...

    def done(self) -> bool: ...

    def result(self) -> R_co: ...


class Flight(Generic[R]):
    """A transfer the engine drives without a thread: done when the transfer is over.

    :func:`fly` calls :meth:`interrupt` when its call is interrupted (give up what has
    not reached the broker) and :meth:`settle` once the flight is done (give its key's
    turn back), both in the driver's thread.

    Not a ``concurrent.futures.Future``: nobody blocks on a flight (the driver learns of
    its end through its queue), so it needs no condition variable, only the first outcome
    and the callbacks to run with it (a future's condition is a few microseconds a transfer).
    """

    __slots__ = ("_callbacks", "_error", "_over", "_result", "_settling")

    def __init__(self) -> None:
        self._settling = threading.Lock()
        self._over = False
        self._result: R | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Any], object]] = []

    def start(self) -> None:
        """Begin (the driver calls it once the flight is in its books)."""

    def interrupt(self) -> None:
        """Stop before anything more is sent (the flight still completes)."""

    def settle(self) -> None:
        """The flight is done and its outcome read: release what it holds."""

    def done(self) -> bool:
        """Whether the flight is over."""
        return self._over

    def result(self) -> R:
        """What the transfer came to (raises its error); only once :meth:`done`."""
        if self._error is not None:
            raise self._error
        return cast("R", self._result)

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        """Call ``fn(self)`` once the flight is over (at once if it is)."""
        with self._settling:
            if not self._over:
                self._callbacks.append(fn)
                return
        fn(self)

    def set_result(self, result: R) -> None:
        """End the flight with ``result`` (the first outcome wins)."""
        self._complete(result, None)

    def set_exception(self, error: BaseException) -> None:
        """End the flight with ``error`` (the first outcome wins)."""
        self._complete(None, error)

    def _complete(self, result: R | None, error: BaseException | None) -> None:
        with self._settling:
            if self._over:
                return
            self._result, self._error, self._over = result, error, True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


def fly(
    keys: Sequence[Hashable | None],
    limit: int,
    step: Callable[[int], R],
    finish: Callable[[int, R], None],
    stop: threading.Event,
    *,
    ready: Callable[[int], Future[Any] | None] | None = None,
    launch: Callable[[int], Pending[R]] | None = None,
) -> None:
    """Run every transfer, up to ``limit`` at once, and ``finish`` each.

    ``launch(i)`` returns at once with a future of what ``step(i)`` would return (a
    :class:`Flight`, started here and completed by the backend's own submission);
    without ``launch`` each transfer is ``step(i)`` on a thread of a pool of ``limit``
    (the adapter for a backend with no non-blocking submission). A limit of 1
    runs ``step`` in the calling thread.

    ``finish`` runs in the driving thread, in completion order. ``ready(i)`` returns
    None when transfer ``i`` may start, or a future to wait for first (its intents
    being written). An exception or interruption (``KeyboardInterrupt``) sets
    ``stop`` so that no transfer starts another attempt, interrupts the flights, waits
    for those in flight, finishes them, and propagates.

    Flights called for on the main thread are driven from one thread of the call's
    (:func:`_drive_beside`): Ctrl-C lands only in the main thread, never inside a
    backend's ``submit``, and the thread that submits is the one that learns of each
    end, so a transfer costs no hand-over between the caller and a submitting thread.
    """
    lanes = Lanes(keys)
    if limit <= 1 or len(keys) <= 1:
        _fly_inline(lanes, step, finish, stop, ready)
        return
    # Each future, as it ends, lands here: the driver waits on one queue, not on every
    # future in flight (which costs a waiter per future per wake-up).
    ended: queue.SimpleQueue[Any] = queue.SimpleQueue()
    if launch is not None:
        if threading.current_thread() is threading.main_thread():
            _drive_beside(lanes, limit, launch, finish, stop, ready, ended)
        else:
            _drive(lanes, limit, launch, finish, stop, ready, ended)
        return
    pool = ThreadPoolExecutor(max_workers=min(limit, len(keys)), thread_name_prefix="sendonce")

    def on_thread(index: int) -> Future[R]:
        # In the caller's context (a transfer's span is a child of its call's).
        return pool.submit(contextvars.copy_context().run, step, index)

    try:
        _drive(lanes, limit, on_thread, finish, stop, ready, ended)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_INTERRUPTED = object()
"""Put in a driver's queue by the caller's thread: Ctrl-C landed there."""
_ABANDONED = object()
"""Put in a driver's queue by the caller's thread: a second Ctrl-C; stop landing."""


def _drive(
    lanes: Lanes,
    limit: int,
    launch: Callable[[int], Pending[R]],
    finish: Callable[[int, R], None],
    stop: threading.Event,
    ready: Callable[[int], Future[Any] | None] | None,
    ended: queue.SimpleQueue[Any],
) -> None:
    """Launch transfers as lanes and ``ready`` allow, and finish each as it ends."""
    running: dict[Pending[R], int] = {}
    hooked: set[Future[Any]] = set()
    try:
        while lanes:
            blocker = None
            while len(running) < limit and (index := lanes.peek()) is not None:
                blocker = ready(index) if ready is not None else None
                if blocker is not None:
                    break
                lanes.take()
                future = launch(index)
                running[future] = index
                future.add_done_callback(ended.put)
                if isinstance(future, Flight):  # started once in the books: never lost
                    future.start()
            if blocker is not None and blocker.done():  # look again at once; take what ended
                try:
                    done = ended.get_nowait()
                except queue.Empty:
                    continue
            else:
                if blocker is not None and blocker not in hooked:
                    hooked.add(blocker)
                    blocker.add_done_callback(ended.put)
                elif blocker is None and not running:
                    continue
                done = ended.get()
            while True:
                if done is _INTERRUPTED:
                    raise KeyboardInterrupt
                index_ = running.pop(done, None)
                if index_ is not None:
                    lanes.finish(index_)
                    if isinstance(done, Flight):
                        done.settle()
                    finish(index_, done.result())
                try:
                    done = ended.get_nowait()
                except queue.Empty:
                    break
    except BaseException:
        stop.set()
        lanes.drain()
        _land(running, finish, ended)
        raise


def _drive_beside(
    lanes: Lanes,
    limit: int,
    launch: Callable[[int], Pending[R]],
    finish: Callable[[int, R], None],
    stop: threading.Event,
    ready: Callable[[int], Future[Any] | None] | None,
    ended: queue.SimpleQueue[Any],
) -> None:
    """:func:`_drive` in a thread of the call's (``sendonce-call``, in the caller's
    context) while the main thread waits for it: a Ctrl-C there is handed to the driver,
    which lands the call as :func:`_drive` does; a second one tells it to stop landing
    (each flight gives its key back when it ends) and propagates."""
    failure: list[BaseException] = []
    over = threading.Event()

    def body() -> None:
        try:
            _drive(lanes, limit, launch, finish, stop, ready, ended)
        except BaseException as exc:
            failure.append(exc)
        finally:
            over.set()

    driver = threading.Thread(
        target=contextvars.copy_context().run, args=(body,), name="sendonce-call", daemon=True
    )
    try:
        driver.start()  # Ctrl-C may land as it returns, the driver already launching
        _await(over)
    except BaseException:
        if driver.ident is None:  # it never started: nothing was launched
            raise
        ended.put(_INTERRUPTED)
        try:
            _await(over)
        except BaseException:
            ended.put(_ABANDONED)  # it stops at its next look: no finish after we leave
            with contextlib.suppress(BaseException):  # a third Ctrl-C: leave at once
                _await(over)
            raise
        driver.join()
        raise
    driver.join()
    if failure:
        raise failure[0]


def _await(event: threading.Event) -> None:
    """Wait for ``event`` in the main thread, a short wait at a time: a Ctrl-C that lands
    just as the thread blocks (its handler pending, no wait left to interrupt) is raised
    at the next turn instead of when the call ends."""
    while not event.wait(0.05):
        pass


def _land(
    running: dict[Pending[R], int], finish: Callable[[int, R], None], ended: queue.SimpleQueue[Any]
) -> None:
    """After an interruption: interrupt the flights, let the transfers in flight end, and
    finish those that did (until the caller's thread abandons the call)."""
    for future in running:
        if isinstance(future, Flight):
            future.interrupt()
        # Hook each again: a Ctrl-C may have landed between a pool future's launch and its
        # hook, or after the driver took it from the queue and before it left ``running``;
        # waiting on the queue alone would then wait forever. A second put is skipped below.
        future.add_done_callback(ended.put)
    try:
        while running:
            done = ended.get()
            if done is _ABANDONED:
                break
            index = running.pop(done, None)
            if index is None:  # a blocker, or a repeated interruption
                continue
            if isinstance(done, Flight):
                done.settle()
            try:
                result = done.result()
            except Exception:  # a stopped or failed transfer is not finished
                continue
            finish(index, result)
    finally:
        for future in running:  # interrupted again while landing: each settles as it ends
            if isinstance(future, Flight):
                future.add_done_callback(_settle_later)


def _settle_later(future: Pending[Any]) -> None:
    cast("Flight[Any]", future).settle()


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
