"""Broker-file work off the network thread: one worker owns the store, the reactor gets results.

SQLite work can wait: another process may hold the file's write lock for
seconds. Done on the reactor thread, that wait froze every connection (no new
client was even answered). Here the reactor submits ``work(store)`` with a
callback; the worker runs it and posts the callback back to the reactor
through a pipe the reactor watches, so callbacks run on the reactor thread and
touch proton objects safely.

The store is opened with a short busy timeout: a write that finds the file
locked fails fast and is tried again later (until its own patience runs out),
so work queued behind it (reads, which WAL mode never blocks, and writes to
other entities once the lock is free) is not held up by it.

When the worker is idle and the file has not been found locked lately, work
runs at once on the reactor thread with a busier-still timeout (a few
milliseconds): handing it to another thread and back costs more than the work
itself (8 senders in flight: 0.13 ms from transfer to disposition inline,
1.3 ms through the worker). Found locked, it goes to the worker after all.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import TransientSendError

__all__ = ["Outcome", "StorageWorker", "is_busy_failure"]

_log = logging.getLogger("sendonce.emulator")

T = TypeVar("T")

# How long one attempt may wait on SQLite's busy handler before yielding the worker.
FAST_BUSY_TIMEOUT = 0.05
# The same on the reactor thread (work run inline), which must never wait long.
INLINE_BUSY_TIMEOUT = 0.005
# After the file was found locked inline, how long work goes to the worker only.
_INLINE_PAUSE = 1.0

_thread_state = threading.local()


def attempt_timeout() -> float:
    """The busy timeout for one store attempt on this thread (worker or reactor)."""
    return float(getattr(_thread_state, "attempt_timeout", INLINE_BUSY_TIMEOUT))


# Pause between attempts of a write that found the file locked.
_RETRY_PAUSE = 0.02


def is_busy_failure(exc: BaseException) -> bool:
    """A store call that gave up because another connection held the file's lock."""
    return isinstance(exc, TransientSendError) and "stayed locked" in str(exc)


@dataclass
class Outcome(Generic[T]):
    """What a piece of work gave: its value, or the exception it raised."""

    value: T | None = None
    error: BaseException | None = None

    def get(self) -> T:
        """The value, or raise the work's exception (on the reactor thread)."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


@dataclass
class _Job:
    order: int
    work: Callable[[Any], Any]
    done: Callable[[Outcome[Any]], None]
    give_up: float
    not_before: float = 0.0


class StorageWorker:
    """One thread that owns the broker store and runs submitted work.

    ``submit(work, done, writes=..., patience=...)``: ``work(store)`` runs on
    the worker; ``done(outcome)`` runs later on the reactor thread (when the
    reactor calls :meth:`run_completions`, which the pipe's readability tells
    it to do). Writes run in submission order among themselves, and so do
    reads; a write waiting for another process's lock lets reads pass it. A
    write failing because the file is locked is retried until ``patience``
    seconds have passed since submission; ``patience=0`` gives up at once.
    """

    def __init__(self, open_store: Callable[[float], Any]) -> None:
        self._open_store = open_store
        self._running = False
        self._inline_off_until = 0.0
        self.inline_store: Any = None
        self._reads: collections.deque[_Job] = collections.deque()
        self._writes: collections.deque[_Job] = collections.deque()
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._stopping = False
        self._completions: collections.deque[tuple[Callable[[Outcome[Any]], None], Outcome[Any]]]
        self._completions = collections.deque()
        self._signalled = False
        self._signal_lock = threading.Lock()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._thread: threading.Thread | None = None
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        self.store: Any = None

    # -- either thread ---------------------------------------------------------------------

    def fileno(self) -> int:
        """The pipe end that becomes readable when callbacks wait for the reactor."""
        return self._read_fd

    def start(self, name: str) -> None:
        """Start the thread and open the store on it; raises what opening raised."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._opened.wait()
        if self._open_error is not None:
            self._thread.join()
            self._close_pipe()
            raise self._open_error

    def submit(
        self,
        work: Callable[[Any], T],
        done: Callable[[Outcome[T]], None],
        *,
        writes: bool,
        patience: float = 30.0,
    ) -> None:
        """Queue ``work(store)``; ``done`` gets its outcome on the reactor thread."""
        job = _Job(next(self._order), work, done, time.monotonic() + patience)
        with self._cond:
            (self._writes if writes else self._reads).append(job)
            self._cond.notify()

    @property
    def backlog(self) -> int:
        """Work queued and not yet run (for tests and diagnostics)."""
        with self._cond:
            return len(self._reads) + len(self._writes)

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the work already queued, close the store, end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        self._close_pipe()

    # -- reactor thread --------------------------------------------------------------------

    def run_inline(self, work: Callable[[Any], T]) -> Outcome[T] | None:
        """Run ``work`` here and now if the worker is idle and the file has been free lately.

        None when it cannot (then submit it): the worker has work (which must keep
        its order), or the file is locked (found so now or a moment ago).
        """
        if self.inline_store is None or time.monotonic() < self._inline_off_until:
            return None
        # No lock needed: only this thread queues work, so with both queues empty
        # the worker cannot start anything before this work is done.
        if self._running or self._reads or self._writes or self._stopping:
            return None
        try:
            return Outcome(value=work(self.inline_store))
        except Exception as exc:
            if is_busy_failure(exc):
                self._inline_off_until = time.monotonic() + _INLINE_PAUSE
                return None  # nothing was stored: the worker tries again
            return Outcome(error=exc)

    def run_completions(self) -> None:
        """Run the callbacks of finished work (call on the reactor thread)."""
        with self._signal_lock:
            self._signalled = False
            with contextlib.suppress(BlockingIOError, OSError):
                os.read(self._read_fd, 4096)
        while self._completions:
            done, outcome = self._completions.popleft()
            try:
                done(outcome)
            except Exception:
                _log.exception("emulator failed finishing storage work")

    # -- worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            _thread_state.attempt_timeout = FAST_BUSY_TIMEOUT
            self.store = self._open_store(FAST_BUSY_TIMEOUT)
            self.inline_store = self._open_store(INLINE_BUSY_TIMEOUT)
        except BaseException as exc:  # reported to the starting thread
            self._open_error = exc
            self._opened.set()
            return
        self._opened.set()
        try:
            while True:
                picked = self._next()
                if picked is None:
                    break
                self._execute(*picked)
        finally:
            for store in (self.inline_store, self.store):
                try:
                    if store is not None:
                        store.close()
                except Exception:
                    _log.exception("closing the emulator's broker store failed")

    def _next(self) -> tuple[_Job, bool] | None:
        """The oldest job that can run now: a read, or the first write once its pause is over."""
        with self._cond:
            while True:
                now = time.monotonic()
                write = self._writes[0] if self._writes else None
                write_ready = write is not None and (write.not_before <= now or self._stopping)
                if self._reads and (
                    write is None or not write_ready or self._reads[0].order < write.order
                ):
                    self._running = True
                    return self._reads.popleft(), False
                if write_ready:
                    self._running = True
                    return self._writes.popleft(), True
                if self._stopping:
                    return None
                self._cond.wait(None if write is None else write.not_before - now)

    def _execute(self, job: _Job, writes: bool) -> None:
        try:
            self._run_job(job, writes)
        finally:
            with self._cond:
                self._running = False

    def _run_job(self, job: _Job, writes: bool) -> None:
        try:
            outcome: Outcome[Any] = Outcome(value=job.work(self.store))
        except BaseException as exc:
            now = time.monotonic()
            if writes and is_busy_failure(exc) and now < job.give_up and not self._stopping:
                job.not_before = now + _RETRY_PAUSE
                with self._cond:
                    self._writes.appendleft(job)  # writes keep their order
                return
            if not isinstance(exc, Exception):
                raise
            outcome = Outcome(error=exc)
        self._post(job.done, outcome)

    def _post(self, done: Callable[[Outcome[Any]], None], outcome: Outcome[Any]) -> None:
        self._completions.append((done, outcome))
        with self._signal_lock:
            if self._signalled:
                return
            self._signalled = True
            with contextlib.suppress(OSError):  # the reactor is gone
                os.write(self._write_fd, b"!")

    def _close_pipe(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._read_fd = self._write_fd = -1
