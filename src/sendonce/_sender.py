"""The idempotent sender: validate, batch by the key rules, retry in-doubt sends safely.

Every message leaves with its own deterministic id. Before anything of a call is
sent, every message is checked against the entity; then messages travel in
transfers that never mix partition keys or session ids, and each transfer is
retried with the same ids until the broker answers, the attempts run out, or
the duplicate-detection deadline comes near. Nothing is dropped silently: each
input message ends in the report as sent, duplicate or failed.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

from ._buffer import DEFAULT_MAX_BUFFER_BYTES, check_buffer
from ._calls import SenderCalls, TransactionCore
from ._effects import (
    Ahead,
    Attempt,
    Drain,
    Effect,
    Flights,
    LedgerFlights,
    Mark,
    Read,
    Schedule,
    Store,
    Transfer,
    run,
)
from ._entity import EntityProfile
from ._flight import Retries, Submit, TransferFlight
from ._inflight import Flight, KeyGate, Pending, Stopped, fly, gate_for, in_flight_limit
from ._ledger_layer import LedgerRun, WriteAhead
from ._message import Message
from ._report import (
    Outcome,
    Part,
    SendFailure,
    SendReport,
    SendResult,
)
from ._retry import Attempted, RetryPolicy
from ._sender_core import (
    DEFAULT_MAX_BATCH_MESSAGES,
    DEFAULT_MEMORY_SIZE,
    transfer_key,
)
from .backends._base import Ack, Backend, capabilities_of, submit_of
from .errors import (
    ConfigurationError,
)
from .ledger import Ledger

__all__ = [
    "DEFAULT_MAX_BATCH_MESSAGES",
    "DEFAULT_MEMORY_SIZE",
    "IdempotentSender",
    "Outcome",
    "SendFailure",
    "SendReport",
    "SendResult",
    "Transaction",
]


logger = logging.getLogger("sendonce.sender")


class IdempotentSender(SenderCalls):
    """Sends messages so each business message lands exactly once.

    ``backend`` is a :class:`~sendonce.backends.Backend` (not closed by the
    sender) or a url for :func:`~sendonce.backends.connect` (closed with the
    sender). ``entity`` is an :class:`EntityProfile` or a name the backend can
    describe. A profile given for a backend that can create entities (the local
    broker) creates the entity if it does not exist yet.

    ``max_in_flight`` is how many transfers one call keeps outstanding at once
    (default: the backend's ``max_in_flight``, else 1); transfers sharing a partition
    key or session id never overlap and start in input order. Many threads may
    share one sender.

    ``max_buffer_bytes`` bounds what ``send_many`` holds of an input that is not a
    list, tuple or ``MessageColumns`` (a generator): it reads, validates and sends such
    an input a chunk at a time, and reads no more while the buffer is full (default
    32 MiB; each message counts its size plus ~1 KiB of bookkeeping).
    """

    def __init__(
        self,
        backend: Backend | str,
        entity: EntityProfile | str,
        *,
        retry: RetryPolicy | None = None,
        require_duplicate_detection: bool = True,
        memory_size: int = DEFAULT_MEMORY_SIZE,
        max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES,
        ledger: Ledger | str | None = None,
        max_in_flight: int | None = None,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
    ) -> None:
        in_flight_limit(None, max_in_flight)  # a bad value fails before anything is opened
        check_buffer(max_buffer_bytes)
        if isinstance(backend, str):
            from .backends._url import connect

            backend = connect(backend)
            self._owns_backend = True
        elif not callable(getattr(backend, "send", None)):
            raise ConfigurationError(
                f"backend must be a Backend or a url string, not {type(backend).__name__}",
                field="backend",
            )
        else:
            self._owns_backend = False
        self._backend = backend
        self._owns_ledger = False
        try:
            resolved = _open_ledger(ledger)
            self._owns_ledger = isinstance(ledger, str)
            try:
                self._configure(
                    self._resolve(backend, entity),
                    retry=retry,
                    require_duplicate_detection=require_duplicate_detection,
                    memory_size=memory_size,
                    max_batch_messages=max_batch_messages,
                    ledger=resolved,
                    max_buffer_bytes=max_buffer_bytes,
                )
                self.max_in_flight = in_flight_limit(backend, max_in_flight)
            except BaseException:
                if resolved is not None and self._owns_ledger:
                    resolved.close()
                raise
        except BaseException:
            if self._owns_backend:
                backend.close()
            raise
        self._transaction: Transaction | None = None
        self._closed = False
        self._gate: KeyGate = gate_for(backend, KeyGate)
        self._ledger_pool: ThreadPoolExecutor | None = None
        self._ledger_pid = os.getpid()

    @staticmethod
    def _resolve(backend: Backend, entity: EntityProfile | str) -> EntityProfile:
        if isinstance(entity, EntityProfile):
            create = getattr(backend, "create_entity", None)
            if create is not None:
                create(entity, exist_ok=True)
            declare = getattr(backend, "declare", None)
            if declare is not None:
                declare(entity)
            return entity
        if isinstance(entity, str) and entity:
            return backend.describe(entity)
        raise ConfigurationError(
            "entity must be an EntityProfile or a non-empty entity name", field="entity"
        )

    # -- lifecycle -----------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend this sender sends through (closed with the sender only if it opened it)."""
        return self._backend

    def close(self) -> None:
        """Close the backend (and ledger) if this sender opened it from a url. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._ledger_pool is not None and self._ledger_pid == os.getpid():
                self._ledger_pool.shutdown(wait=True)
            try:
                if self._owns_backend:
                    self._backend.close()
            finally:
                if self._owns_ledger and self._ledger is not None:
                    self._ledger.close()

    @property
    def ledger(self) -> Ledger | None:
        """The durable send ledger this sender records its intents in, if any."""
        return self._ledger

    def __enter__(self) -> IdempotentSender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IdempotentSender(entity={self.profile.name!r}, backend={self._backend!r})"

    # -- sending -------------------------------------------------------------------

    def _attempt_transfer(
        self,
        batch: Sequence[Message],
        *,
        atomic: bool = False,
        started: float | None = None,
        stop: threading.Event | None = None,
        tried: list[int] | None = None,
    ) -> Attempted[list[Ack]]:
        entity = self.profile.name
        backend = self._backend
        attempts = tried if tried is not None else [0]

        wire = batch  # what goes to the broker: with its trace context when traced

        def attempt(timeout: float) -> list[Ack]:
            if stop is not None and stop.is_set():
                raise Stopped(attempts[0])
            attempts[0] += 1
            return self._checked(backend.send(entity, wire, timeout=timeout, atomic=atomic), batch)

        def retried() -> Attempted[list[Ack]]:
            return self.retry.call(attempt, **self._retry_terms(batch, started))

        telemetry = self._otel
        if telemetry is None:
            return retried()
        with telemetry.transfer(self, batch) as scope:  # a span; its context in each message
            wire = scope.wire(batch)
            return scope.acked(retried())

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this sender is closed", field="sender")
        if self._transaction is not None:
            raise ConfigurationError(
                "a transaction is open on this sender: send through the transaction object "
                "(with sender.transaction() as tx: tx.send(...))",
                field="transaction",
            )

    def send(
        self, message: Message, *, first_attempt: float | datetime | None = None
    ) -> SendResult:
        """Send one message; raises ``InDoubtError``/``PermanentSendError`` if it fails.

        ``first_attempt`` resumes a message whose first attempt was made earlier (by a
        process that then crashed): its deadline stays first attempt + window - margin,
        and once that has passed nothing is sent and ``InDoubtError`` is raised. Pass the
        wall-clock time you recorded (an aware ``datetime``) or a time on the policy's clock.
        """
        self._check_open()
        return run(self._send_one_steps(message, first_attempt), self._perform)

    def send_many(
        self, messages: Iterable[Message], *, first_attempt: float | datetime | None = None
    ) -> SendReport:
        """Send many messages in as few transfers as the entity's rules allow.

        A list, tuple or ``MessageColumns`` is validated whole before any of it is sent
        (a bad message raises, naming its index and id). Any other iterable (a
        generator) is streamed: read, validated and sent a chunk at a time within
        ``max_buffer_bytes``; a bad message raises before anything of its chunk is sent,
        the chunks before it having been sent (the error says so; their report is its
        ``sent_before``). Send failures do not raise: they are in the report, one entry
        per message in input order, alongside the sent and duplicate results.
        ``first_attempt`` resumes a crashed call with its original deadline (see ``send``).
        """
        self._check_open()
        return run(self._send_many_steps(messages, first_attempt), self._perform)

    def _perform(self, effect: Effect) -> Any:
        """An effect of a call's steps (``_calls``), in the calling thread."""
        kind = type(effect)
        if kind is Mark:  # the task's cancellations: none in a thread
            return 0
        if kind is Attempt:
            e = cast("Attempt", effect)
            return self._attempt_transfer(
                e.batch, atomic=e.atomic, started=e.started, stop=e.stop, tried=e.tried
            )
        if kind is Transfer:
            t = cast("Transfer", effect)
            key = self._gate_key(t.batch)
            if key is None:
                return self._transfer(t.batch, t.started, None)
            with self._gate.hold(key):
                return self._transfer(t.batch, t.started, None)
        if kind is Flights:
            flights = cast("Flights", effect)
            return self._flights(flights.batches, flights.started)
        if kind is LedgerFlights:
            return self._ledger_flights(cast("LedgerFlights", effect))
        if kind is Store:
            store = cast("Store", effect)
            return store.fn(*store.args)
        if kind is Read:
            cast("Read", effect).chunks.fill()
            return None
        if kind is Schedule:
            return self._scheduled(cast("Schedule", effect))
        if kind is Ahead:
            return self._ahead(cast("Ahead", effect).run)
        if kind is Drain:
            ahead = cast("Drain", effect).ahead
            if ahead.in_flight is not None:
                ahead.collect(then_next=False)
            self._ledger_writer().submit(int).result()  # every write queued has ended
            return None
        return None  # Pause: nothing to do in a thread

    def _flights(
        self, batches: Sequence[Sequence[Message]], started: float | None
    ) -> list[list[Part]]:
        """Every transfer, up to ``max_in_flight`` at once, one per key at a time; what
        became of each. An interruption lets the transfers in flight end and starts no
        other."""
        stop = threading.Event()
        outcomes: list[list[Part]] = [[] for _ in batches]

        def step(index: int) -> list[Part]:
            batch = batches[index]
            key = self._gate_key(batch)
            if key is None:  # unordered: nothing to hold
                return self._transfer(batch, started, stop)
            with self._gate.hold(key):
                return self._transfer(batch, started, stop)

        def finish(index: int, parts: list[Part]) -> None:
            outcomes[index] = parts

        submit = self._native_submit()
        retries = Retries(self.max_in_flight)

        def launch(index: int) -> Pending[list[Part]]:
            assert submit is not None
            return self._flight(submit, batches[index], started, stop, [0], retries)

        try:
            keys = [transfer_key(batch) for batch in batches]
            fly(keys, self.max_in_flight, step, finish, stop, launch=launch if submit else None)
        finally:
            retries.close()
        return outcomes

    def _native_submit(self) -> Submit | None:
        """The backend's own non-blocking ``submit`` where it has one (docs/engine.md) and
        the sender is not traced (a traced transfer's span wraps its retries in a thread);
        None: each transfer in flight is ``send`` on a thread of its own."""
        backend = self._backend
        if self._otel is not None or not capabilities_of(backend).native_submit:
            return None
        return cast("Submit | None", submit_of(backend))

    def _flight(
        self,
        submit: Submit,
        batch: Sequence[Message],
        started: float | None,
        stop: threading.Event,
        tried: list[int],
        retries: Retries,
    ) -> TransferFlight:
        """One transfer through ``submit``, for :func:`fly` to start (see ``_flight``)."""
        return TransferFlight(
            submit=submit,
            entity=self.profile.name,
            batch=batch,
            policy=self.retry,
            terms=self._retry_terms(batch, started),
            checked=self._checked,
            blocking=self._transfer,
            gate=self._gate,
            key=self._gate_key(batch),
            stop=stop,
            tried=tried,
            retries=retries,
        )

    def _transfer(
        self,
        batch: Sequence[Message],
        started: float | None,
        stop: threading.Event | None,
        tried: list[int] | None = None,
        offset: int = 0,
    ) -> list[Part]:
        """One planned transfer with its retries (``_calls``), in this thread. ``Stopped``
        leaves if ``stop`` is set."""
        return run(self._transfer_steps(batch, started, tried, stop, offset), self._perform)

    def _ledger_writer(self) -> ThreadPoolExecutor:
        """The worker thread intents are written in (one per sender, made on first use)."""
        with self._state_lock:
            # A forked child inherits the executor but not its thread: it makes its own.
            if self._ledger_pool is None or self._ledger_pid != os.getpid():
                self._ledger_pool = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="sendonce-ledger"
                )
                self._ledger_pid = os.getpid()
            return self._ledger_pool

    def _ahead(self, run: LedgerRun) -> WriteAhead:
        """The call's ledger writes, in the sender's worker thread (SQLite and psycopg
        release the GIL), beside the transfers in flight."""
        pool = self._ledger_writer()

        def submit(fn: Any, *args: Any) -> Future[Any]:
            # Always in the worker thread, even for one window: Ctrl-C reaches only the
            # main thread, so a write that completes is noted (``landed``) whatever the
            # main thread was doing, and can be released on the way out. In the caller's
            # context: the write's span is a child of the call's.
            return pool.submit(contextvars.copy_context().run, fn, *args)

        # ``room`` is never set: waited for beside the transfers in flight.
        return WriteAhead(run, submit, Future())

    def _ledger_flights(self, effect: LedgerFlights) -> None:
        """The run's transfers in flight, each once its window is durable; a refused
        transfer's intents released as it ends (before its window's confirmation)."""
        run: LedgerRun = effect.run
        ahead: WriteAhead = effect.ahead
        outcomes = effect.outcomes
        layer = self._ledger_layer
        assert layer is not None
        stop = threading.Event()

        def ready(index: int) -> Future[Any] | None:
            return cast("Future[Any] | None", ahead.ready(index))

        def step(index: int) -> list[Part]:
            sends, start = run.to_send(index)
            if not sends:
                return []
            with self._gate.hold(self._gate_key(sends)):
                return self._transfer(sends, start, stop, run.tried[index])

        def finish(index: int, parts: list[Part]) -> None:
            outcomes[index] = parts
            released, owner = run.done(index, parts)
            if released:
                layer.release_quietly(released, owner)
            ahead.after_transfer()  # its confirmation may make room for the next write

        native = self._native_submit()
        retries = Retries(self.max_in_flight)

        def launch(index: int) -> Pending[list[Part]]:
            sends, start = run.to_send(index)
            if not sends:
                nothing: Flight[list[Part]] = Flight()
                nothing.set_result([])
                return nothing
            assert native is not None
            return self._flight(native, sends, start, stop, run.tried[index], retries)

        try:
            keys = [transfer_key(batch) for batch in run.batches]
            fly(
                keys,
                self.max_in_flight,
                step,
                finish,
                stop,
                ready=ready,
                launch=launch if native else None,
            )
        finally:
            retries.close()

    def schedule(
        self, message: Message, at: datetime, *, first_attempt: float | datetime | None = None
    ) -> SendResult:
        """Schedule one message for ``at``; it shares the duplicate-detection id space.

        On Service Bus a retried schedule can return the sequence number of a
        copy the service dropped as a duplicate (Azure/azure-service-bus #265), and
        after an in-doubt attempt the sequence number may be unknown (None).
        """
        self._check_open()
        return run(self._schedule_steps(message, at, first_attempt), self._perform)

    def _scheduled(self, effect: Schedule) -> Attempted[list[Ack]]:
        """The retried schedule of one message, its key held (a span around it if traced)."""
        entity, backend, at = self.profile.name, self._backend, effect.at
        wire: Sequence[Message] = [effect.message]

        def attempt(timeout: float) -> list[Ack]:
            return backend.schedule(entity, wire, at, timeout=timeout)

        terms = self._retry_terms(wire, effect.started)
        telemetry = self._otel
        with self._gate.hold(self._gate_key(wire)):
            if telemetry is None:
                return self.retry.call(attempt, **terms)
            with telemetry.transfer(self, wire, "schedule") as scope:
                wire = scope.wire(wire)
                return scope.acked(self.retry.call(attempt, **terms))

    # -- transactions ----------------------------------------------------------------

    @contextmanager
    def transaction(
        self, *, first_attempt: float | datetime | None = None
    ) -> Iterator[Transaction]:
        """Send a group all or nothing (local broker, Artemis semantics).

        ``with sender.transaction() as tx: tx.send(a); tx.send(b)`` commits on
        exit. A duplicate id on any member makes the broker ignore the whole
        group; its other members are reported as failures. ``first_attempt``
        resumes a crashed group with its original deadline (see ``send``).
        Service Bus has no transactions in the Python client: ``ConfigurationError``.
        """
        self._check_open()
        self._check_atomic(self._backend)
        started = self._started(first_attempt)
        tx = Transaction(self, started)
        self._transaction = tx
        try:
            yield tx
        except BaseException:
            self._transaction = None
            tx.messages.clear()
            raise
        self._transaction = None
        tx._commit()

    def _send_atomic(self, messages: list[Message], started: float | None = None) -> SendReport:
        return run(self._atomic_steps(messages, started), self._perform)


def _open_ledger(ledger: Ledger | str | None) -> Ledger | None:
    if ledger is None or isinstance(ledger, Ledger):
        return ledger
    if isinstance(ledger, str):
        return Ledger(ledger)
    raise ConfigurationError("ledger must be a Ledger, a ledger url or None", field="ledger")


class Transaction(TransactionCore):
    """A group of messages committed all or nothing when its ``with`` block exits."""

    def send(self, message: Message) -> None:
        """Add ``message`` to the group (validated now, sent when the ``with`` block exits)."""
        self._add((message,), "message")

    def send_many(self, messages: Iterable[Message]) -> None:
        """Add ``messages`` to the group (validated now, sent when the ``with`` block exits)."""
        self._add(messages, "messages")

    def _commit(self) -> None:
        sender = cast("IdempotentSender", self._sender)
        self.report = sender._send_atomic(self.messages, self._started)
