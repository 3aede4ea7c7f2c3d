"""One transfer driven through a backend's non-blocking ``submit`` (docs/engine.md).

A backend with a native submission (``capabilities.native_submit``: Artemis over its
event loop) carries N transfers in flight as N pending futures. The engine therefore
drives a transfer there without a thread of its own: it queues for its key's turn
(:meth:`KeyGate.enter <sendonce._inflight.KeyGate.enter>`), submits its first attempt
with the timeout the retry policy allows, and is done when the backend's future is.

Most transfers end there. One whose first attempt fails (in doubt, not sent, too big)
continues in a worker thread under :meth:`RetryPolicy.resume
<sendonce._retry.RetryPolicy.resume>`: tenacity's rules, the same ids, the deadline of
the entity's window, backoffs slept there and not in the driver. A worker is a retry,
not a transfer: a healthy broker needs none.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

from ._inflight import Flight, KeyGate, Stopped
from ._message import Message
from ._report import Part
from ._retry import Attempted, FirstAttempt, RetryPolicy
from .backends._base import Ack
from .errors import InDoubtError, MessageSizeError, PermanentSendError

__all__ = ["Retries", "TransferFlight"]

logger = logging.getLogger("sendonce.sender")

Submit = Callable[..., "Future[list[Ack]]"]
Blocking = Callable[
    [Sequence[Message], "float | None", threading.Event, "list[int]", int], list[Part]
]


class Retries:
    """One call's helper threads, each made on first use: the one thread that submits
    (so that the main thread, where Ctrl-C lands, never runs inside a backend's
    ``submit``) and the workers of retried transfers."""

    __slots__ = ("_calls", "_limit", "_lock", "_pool", "_submitter")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._submitter: threading.Thread | None = None
        self._calls: queue.SimpleQueue[tuple[contextvars.Context, Callable[[], None]] | None]
        self._calls = queue.SimpleQueue()

    def submitting(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` where a backend may be called: at once off the main thread, else in
        the submitting thread; in the caller's context either way."""
        if threading.current_thread() is not threading.main_thread():
            fn()
            return
        with self._lock:
            if self._submitter is None:
                self._submitter = threading.Thread(
                    target=self._serve, name="sendonce-call", daemon=True
                )
                self._submitter.start()
        self._calls.put((contextvars.copy_context(), fn))

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            context, fn = call
            try:
                context.run(fn)
            except Exception:  # a flight ends itself on any error: this is a defect
                logger.exception("sendonce: a transfer could not be submitted")

    def run(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in a worker, in the caller's context."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self._limit, thread_name_prefix="sendonce-retry"
                )
            pool = self._pool
        pool.submit(contextvars.copy_context().run, fn, *args)

    def close(self) -> None:
        """Wait for the threads (every flight is over by then) and end them."""
        with self._lock:
            submitter, pool = self._submitter, self._pool
            self._submitter = self._pool = None
        if submitter is not None:
            self._calls.put(None)
            submitter.join()
        if pool is not None:
            pool.shutdown(wait=True)


class TransferFlight(Flight[list[Part]]):
    """One planned transfer through ``submit``: done with what became of each part.

    ``checked(acks, batch)`` refuses acks that do not match the batch; ``blocking`` is the
    sender's own ``_transfer`` (a transfer split because it was too big runs there).
    ``tried[0]`` counts the attempts handed to the backend (a ledger releases the
    intents of a transfer never attempted).
    """

    def __init__(
        self,
        *,
        submit: Submit,
        entity: str,
        batch: Sequence[Message],
        policy: RetryPolicy,
        terms: dict[str, Any],
        checked: Callable[[list[Ack], Sequence[Message]], list[Ack]],
        blocking: Blocking,
        gate: KeyGate,
        key: Hashable | None,
        stop: threading.Event,
        tried: list[int],
        retries: Retries,
    ) -> None:
        super().__init__()
        self._submit = submit
        self._entity = entity
        self._batch = batch
        self._policy = policy
        self._terms = terms
        self._checked = checked
        self._blocking = blocking
        self._gate = gate
        self._key = key
        self._stop = stop
        self._tried = tried
        self._retries = retries
        self._ticket: Future[None] | None = None
        self._attempt: Future[list[Ack]] | None = None
        self._first: FirstAttempt | None = None
        self._settled = False
        self._begun = False
        self._interrupted = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Begin in the submitting thread (never in the caller's: see ``Retries``)."""
        self._retries.submitting(self._begin)

    def _begin(self) -> None:
        """Queue for the key's turn (none to wait for without a key) and go when it comes."""
        with self._lock:
            if self._begun:  # interrupted before it began: it never will
                return
            self._begun = True
        if self._key is None:
            self._go()
            return
        ticket = self._ticket = self._gate.enter(self._key)
        if ticket.done():  # the key was free
            self._go()
        else:
            ticket.add_done_callback(self._granted)

    def _granted(self, ticket: Future[None]) -> None:
        # In the thread that gave the turn back (a driver's, maybe another call's): go on
        # in this call's submitting thread.
        if not ticket.cancelled():
            self._retries.submitting(self._go)

    def _go(self) -> None:
        """Submit the first attempt (never blocks; errors end the flight, never hang it)."""
        try:
            if self._stop.is_set():
                self._end(Stopped(self._tried[0]))
                return
            first = self._first = self._policy.begin(**self._terms)
            try:
                timeout = first.timeout()
            except (InDoubtError, PermanentSendError) as exc:  # its deadline has passed
                self.set_result([Part(self._batch, None, exc, 0)])
                return
            self._tried[0] += 1
            try:
                attempt = self._submit(self._entity, self._batch, timeout=timeout)
            except Exception as exc:  # never handed over: nothing stored (docs/engine.md)
                self._tried[0] -= 1
                self._retries.run(self._resume, exc)
                return
            self._track(attempt)
            attempt.add_done_callback(self._landed)
        except BaseException as exc:
            self._end(exc)

    def _landed(self, attempt: Future[list[Ack]]) -> None:
        # Possibly on the backend's I/O thread: record, or hand over; never block.
        try:
            if attempt.cancelled():  # given up before it was handed to the wire
                self._tried[0] -= 1
                self._end(Stopped(self._tried[0]))
                return
            error = attempt.exception()
            if error is None:
                try:
                    acks = self._checked(attempt.result(), self._batch)
                except PermanentSendError as exc:
                    self.set_result([Part(self._batch, None, exc, 0)])
                    return
                self.set_result([Part(self._batch, Attempted(acks, 1, False), None, 0)])
                return
            self._retries.run(self._resume, error)
        except BaseException as exc:
            self._end(exc)

    def _resume(self, failure: BaseException) -> None:
        """In a worker: the retries after a failed first attempt, by the policy's rules."""
        batch = self._batch
        first = self._first
        assert first is not None
        try:
            attempted = self._policy.resume(first, self._again, failure)
        except MessageSizeError as exc:
            if len(batch) == 1:
                self._end(exc)
                return
            self._split()
        except (InDoubtError, PermanentSendError) as exc:
            self.set_result([Part(batch, None, exc, 0)])
        except BaseException as exc:
            self._end(exc)
        else:
            self.set_result([Part(batch, attempted, None, 0)])

    def _split(self) -> None:
        """Too big for the transport: the two halves one after the other (as ``send``)."""
        batch = self._batch
        half = len(batch) // 2
        started = self._terms.get("started")
        try:
            parts = self._blocking(batch[:half], started, self._stop, self._tried, 0)
            parts += self._blocking(batch[half:], started, self._stop, self._tried, half)
        except BaseException as exc:
            self._end(exc)
            return
        self.set_result(parts)

    def _again(self, timeout: float) -> list[Ack]:
        """A retry's attempt: submitted, and waited for in the worker."""
        if self._stop.is_set():
            raise Stopped(self._tried[0])
        self._tried[0] += 1
        attempt = self._submit(self._entity, self._batch, timeout=timeout)
        self._track(attempt)
        try:
            acks = attempt.result()
        except CancelledError:  # interrupted before it was handed to the wire
            self._tried[0] -= 1
            raise Stopped(self._tried[0]) from None
        return self._checked(acks, self._batch)

    def _track(self, attempt: Future[list[Ack]]) -> None:
        """Note the attempt in flight; one made as the call was interrupted is cancelled
        (it goes nowhere if the backend has not written it yet)."""
        with self._lock:
            self._attempt = attempt
            interrupted = self._interrupted
        if interrupted:
            attempt.cancel()

    def _end(self, error: BaseException) -> None:
        self.set_exception(error)  # unless it has ended already (the first outcome wins)

    def interrupt(self) -> None:
        """Give up what has not reached the broker: the queue for the key's turn, or an
        attempt the backend has not yet written (its ``cancel()`` says)."""
        with self._lock:
            begun, self._begun = self._begun, True
            self._interrupted = True
            attempt = self._attempt
        if not begun:
            self._end(Stopped(0))
            return
        if attempt is not None:
            attempt.cancel()
        ticket = self._ticket
        if ticket is not None and self._key is not None and self._gate.withdraw(self._key, ticket):
            self._ticket = None
            self._end(Stopped(0))

    def settle(self) -> None:
        """Give the key's turn back (once)."""
        if self._settled:
            return
        self._settled = True
        ticket, key = self._ticket, self._key
        if ticket is not None and key is not None and ticket.done() and not ticket.cancelled():
            self._gate.leave(key, ticket)
