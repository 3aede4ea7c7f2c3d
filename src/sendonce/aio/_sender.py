"""The asyncio idempotent sender: the sync sender's rules, an awaited transport loop.

Validation, batching by the key rules, the payload-conflict memory and the
accounting are :class:`sendonce._sender.SenderCore`, shared with the sync
sender; only the transfers and the retry loop (``RetryPolicy.acall``) await.

Cancellation: a task cancelled while its transfer is in flight leaves the
outcome in doubt (the broker may have stored the messages). The ids stay in
the sender's memory, so resending them is conflict-checked, and resending them
inside the duplicate-detection window is safe.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, cast

from .._buffer import DEFAULT_MAX_BUFFER_BYTES, check_buffer
from .._calls import SenderCalls, TransactionCore
from .._effects import (
    Ahead,
    Attempt,
    Drain,
    Effect,
    Flights,
    LedgerFlights,
    Mark,
    Pause,
    Read,
    Schedule,
    Store,
    Transfer,
    arun,
)
from .._entity import EntityProfile
from .._inflight import gate_for, in_flight_limit
from .._ledger_layer import LedgerRun, WriteAhead
from .._message import Message
from .._report import Part
from .._retry import Attempted, RetryPolicy
from .._sender import SendReport, SendResult, _open_ledger
from .._sender_core import (
    DEFAULT_MAX_BATCH_MESSAGES,
    DEFAULT_MEMORY_SIZE,
    transfer_key,
)
from ..backends._base import Ack
from ..backends._dispatch import dispatch, reports_dispatch
from ..errors import (
    ConfigurationError,
)
from ..ledger import Ledger
from ._base import AsyncBackend
from ._inflight import AsyncKeyGate, afly, cancelled_meanwhile, cancelling

__all__ = ["IdempotentSender", "Transaction"]

_logger = logging.getLogger("sendonce.aio.sender")

READ_SLICE = 256
"""Messages ``send_many`` takes from a generator between two turns of the event loop
(building a small message costs ~5-15 us: a few ms per slice)."""
ACCOUNT_SLICE = 512
"""Transfers ``send_many`` accounts for (or sets up with a ledger) between two turns of
the event loop."""
PLAN_SLICE = 2048
"""Messages ``send_many`` validates and batches between two turns of the event loop
(~1-3 us each: a few ms per slice)."""


class IdempotentSender(SenderCalls):
    """Sends messages from an event loop so each business message lands exactly once.

    ``backend`` is an :class:`~sendonce.aio.AsyncBackend` (not closed by the
    sender) or a url for :func:`sendonce.aio.connect` (closed with the sender).
    ``entity`` is an :class:`EntityProfile` or a name the backend can describe.
    Entity resolution may do I/O, so it happens in ``async with`` (or
    ``await sender.open()``), before the first send.

    Many tasks may share one sender: its id memory is updated between awaits,
    and the backend serialises or multiplexes the transfers. ``max_in_flight`` is
    how many transfers one call keeps outstanding at once (default: the backend's
    ``max_in_flight``, else 1); transfers sharing a partition key or session id never
    overlap and start in input order. ``max_buffer_bytes`` bounds what ``send_many``
    holds of a streamed input (a generator), as with the sync sender.
    """

    def _slice(self, what: str) -> int | None:
        return PLAN_SLICE if what == "plan" else ACCOUNT_SLICE

    def __init__(
        self,
        backend: AsyncBackend | str,
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
        if not isinstance(entity, EntityProfile) and not (isinstance(entity, str) and entity):
            raise ConfigurationError(
                "entity must be an EntityProfile or a non-empty entity name", field="entity"
            )
        # A ledger url is opened here, once (a short blocking open); its calls later
        # run in a worker thread so the event loop never waits on the store.
        resolved = _open_ledger(ledger)
        self._owns_ledger = isinstance(ledger, str)
        self._options: dict[str, Any] = {
            "retry": retry,
            "require_duplicate_detection": require_duplicate_detection,
            "memory_size": memory_size,
            "max_batch_messages": max_batch_messages,
            "ledger": resolved,
            "max_buffer_bytes": max_buffer_bytes,
        }
        self._entity_arg = entity
        self._opened = False
        self._closed = False
        if isinstance(entity, EntityProfile):
            try:
                self._configure(entity, **self._options)  # bad options fail here, before I/O
            except BaseException:
                if resolved is not None and self._owns_ledger:
                    resolved.close()
                raise
            self._given_profile: EntityProfile | None = entity
        else:
            self._given_profile = None
        if isinstance(backend, str):
            from ._connect import connect

            self._backend: AsyncBackend = connect(backend)
            self._owns_backend = True
        elif not callable(getattr(backend, "send", None)):
            if resolved is not None and self._owns_ledger:
                resolved.close()
            raise ConfigurationError(
                f"backend must be an AsyncBackend or a url string, not {type(backend).__name__}",
                field="backend",
            )
        else:
            if callable(getattr(backend, "__enter__", None)) and not inspect.iscoroutinefunction(
                getattr(backend, "send", None)
            ):
                raise ConfigurationError(
                    f"{type(backend).__name__} is a sync backend: wrap it for the event loop, "
                    "sendonce.aio.ThreadedBackend(backend), or use sendonce.IdempotentSender",
                    field="backend",
                )
            self._backend = backend
            self._owns_backend = False
        self.max_in_flight = in_flight_limit(self._backend, max_in_flight)
        self._gate: AsyncKeyGate = gate_for(self._backend, AsyncKeyGate)

    # -- lifecycle -----------------------------------------------------------------

    @property
    def backend(self) -> AsyncBackend:
        """The async backend this sender sends through."""
        return self._backend

    async def open(self) -> IdempotentSender:
        """Resolve the entity: describe it, or create/declare the given profile. Idempotent."""
        if self._closed:
            raise ConfigurationError("this sender is closed", field="sender")
        if self._opened:
            return self
        try:
            profile = await self._resolve(self._backend, self._entity_arg)
            if self._given_profile is None:
                self._configure(profile, **self._options)
        except BaseException:
            await self.close()
            raise
        self._opened = True
        return self

    @staticmethod
    async def _resolve(backend: AsyncBackend, entity: EntityProfile | str) -> EntityProfile:
        if isinstance(entity, EntityProfile):
            for name, args in (("create_entity", {"exist_ok": True}), ("declare", {})):
                method = getattr(backend, name, None)
                if method is not None:
                    outcome = method(entity, **args)
                    if inspect.isawaitable(outcome):
                        await outcome
            return entity
        return await backend.describe(entity)

    async def close(self) -> None:
        """Close the backend (and ledger) if this sender opened it from a url. Idempotent."""
        if not self._closed:
            self._closed = True
            try:
                if self._owns_backend:
                    await self._backend.close()
            finally:
                ledger = self._options["ledger"]
                if self._owns_ledger and ledger is not None:
                    await asyncio.to_thread(ledger.close)

    async def __aenter__(self) -> IdempotentSender:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        await self.close()
        return False

    def __repr__(self) -> str:
        name = getattr(self._entity_arg, "name", self._entity_arg)
        return f"aio.IdempotentSender(entity={name!r}, backend={self._backend!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this sender is closed", field="sender")
        if not self._opened:
            raise ConfigurationError(
                "this sender is not open: use `async with IdempotentSender(...) as sender` "
                "or `await sender.open()` first",
                field="sender",
            )

    # -- sending -------------------------------------------------------------------

    async def _attempt_transfer(
        self,
        batch: Sequence[Message],
        *,
        atomic: bool = False,
        started: float | None = None,
        tried: list[int] | None = None,
    ) -> Attempted[list[Ack]]:
        entity = self.profile.name
        backend = self._backend
        wire = batch  # what goes to the broker: with its trace context when traced

        reports = reports_dispatch(backend)

        async def attempt(timeout: float) -> list[Ack]:
            if tried is None:
                acks = await backend.send(entity, wire, timeout=timeout, atomic=atomic)
            else:
                # ``tried`` counts the attempts that may have reached the broker: a call
                # cancelled while it waited in the backend's own queue sent nothing, and
                # its intents are released on the way out (see ``_dispatch``).
                with dispatch() as call:
                    try:
                        acks = await backend.send(entity, wire, timeout=timeout, atomic=atomic)
                    finally:
                        if not (reports and call.abandon()):
                            tried[0] += 1
            return self._checked(acks, batch)

        async def retried() -> Attempted[list[Ack]]:
            return await self.retry.acall(attempt, **self._retry_terms(batch, started))

        telemetry = self._otel
        if telemetry is None:
            return await retried()
        with telemetry.transfer(self, batch) as scope:  # a span; its context in each message
            wire = scope.wire(batch)
            return scope.acked(await retried())

    async def send(
        self, message: Message, *, first_attempt: float | datetime | None = None
    ) -> SendResult:
        """Send one message; raises ``InDoubtError``/``PermanentSendError`` if it fails.

        ``first_attempt`` resumes a message first attempted earlier, keeping its
        original deadline (see the sync ``IdempotentSender.send``).
        """
        self._check_open()
        return await arun(self._send_one_steps(message, first_attempt), self._perform)

    async def send_many(
        self, messages: Iterable[Message], *, first_attempt: float | datetime | None = None
    ) -> SendReport:
        """Send many messages in as few transfers as the entity's rules allow.

        A list, tuple or ``MessageColumns`` is validated whole before any of it is sent;
        any other iterable (a generator) is streamed a chunk at a time within
        ``max_buffer_bytes``, as with the sync sender (a bad message raises before
        anything of its chunk is sent; the error's ``sent_before`` reports the chunks
        before it). Send failures are in the report, one entry per message in input
        order. Big inputs are read and validated a slice at a time, other tasks running
        between slices.
        """
        self._check_open()
        return await arun(self._send_many_steps(messages, first_attempt), self._perform)

    async def _perform(self, effect: Effect) -> Any:
        """An effect of a call's steps (``_calls``), awaited: a store's call in a worker
        thread, a pause as a turn of the event loop."""
        kind = type(effect)
        if kind is Attempt:
            e = cast("Attempt", effect)
            return await self._attempt_transfer(
                e.batch, atomic=e.atomic, started=e.started, tried=e.tried
            )
        if kind is Transfer:
            t = cast("Transfer", effect)
            return await self._transfer(t.batch, t.started)
        if kind is Flights:
            flights = cast("Flights", effect)
            return await self._flights(flights.batches, flights.started)
        if kind is LedgerFlights:
            return await self._ledger_flights(cast("LedgerFlights", effect))
        if kind is Mark:
            mark = cast("Mark", effect)
            if mark.check:
                cancelled_meanwhile(mark.before)
                return None
            return cancelling()
        if kind is Pause:
            await asyncio.sleep(0)
            return None
        if kind is Store:
            store = cast("Store", effect)
            if store.light:
                return store.fn(*store.args)
            return await asyncio.to_thread(store.fn, *store.args)
        if kind is Ahead:

            def submit(fn: Any, *args: Any) -> asyncio.Future[Any]:
                return asyncio.ensure_future(asyncio.to_thread(fn, *args))

            # ``room`` is never set: waited for beside the transfers in flight.
            loop = asyncio.get_running_loop()
            return WriteAhead(cast("Ahead", effect).run, submit, loop.create_future())
        if kind is Drain:
            ahead = cast("Drain", effect).ahead
            writing = ahead.in_flight
            if writing is not None:
                await asyncio.wait([cast("asyncio.Future[Any]", writing)])
                ahead.collect(then_next=False)
            return None
        if kind is Read:
            # The generator's own work (building each message) is done a slice at a time,
            # other tasks running between slices.
            chunks = cast("Read", effect).chunks
            while chunks.read(READ_SLICE):
                await asyncio.sleep(0)
            return None
        return await self._scheduled(cast("Schedule", effect))

    async def _flights(
        self, batches: Sequence[Sequence[Message]], started: float | None
    ) -> list[list[Part]]:
        """Every transfer, up to ``max_in_flight`` at once as tasks, one per key at a
        time; what became of each."""
        outcomes: list[list[Part]] = [[] for _ in batches]

        async def step(index: int) -> list[Part]:
            return await self._transfer(batches[index], started)

        def finish(index: int, parts: list[Part]) -> None:
            outcomes[index] = parts

        keys = [transfer_key(batch) for batch in batches]
        await afly(keys, self.max_in_flight, step, finish)
        return outcomes

    async def _transfer(
        self, batch: Sequence[Message], started: float | None, tried: list[int] | None = None
    ) -> list[Part]:
        """One planned transfer with its retries (``_calls``), its key held."""
        key = self._gate_key(batch)
        if key is None:  # unordered: nothing to hold
            return await arun(self._transfer_steps(batch, started, tried), self._perform)
        async with self._gate.hold(key):
            return await arun(self._transfer_steps(batch, started, tried), self._perform)

    async def _ledger_flights(self, effect: LedgerFlights) -> None:
        """The run's transfers in flight as tasks, each once its window is durable; a
        refused transfer's intents released (in a worker thread) before its window's
        confirmation can be written."""
        run: LedgerRun = effect.run
        ahead: WriteAhead = effect.ahead
        outcomes = effect.outcomes
        layer = self._ledger_layer
        assert layer is not None

        def ready(index: int) -> asyncio.Future[Any] | None:
            return cast("asyncio.Future[Any] | None", ahead.ready(index))

        async def step(index: int) -> list[Part]:
            sends, start = run.to_send(index)
            if not sends:
                return []
            parts = await self._transfer(sends, start, run.tried[index])
            refused, owner = run.refused(index, parts)
            if refused:
                await asyncio.to_thread(layer.release_quietly, refused, owner)
            return parts

        def finish(index: int, parts: list[Part]) -> None:
            outcomes[index] = parts
            run.done(index, parts)
            ahead.after_transfer()  # its confirmation may make room for the next write

        keys = [transfer_key(batch) for batch in run.batches]
        await afly(keys, self.max_in_flight, step, finish, ready=ready)

    async def schedule(
        self, message: Message, at: datetime, *, first_attempt: float | datetime | None = None
    ) -> SendResult:
        """Schedule one message for ``at``; it shares the duplicate-detection id space."""
        self._check_open()
        return await arun(self._schedule_steps(message, at, first_attempt), self._perform)

    async def _scheduled(self, effect: Schedule) -> Attempted[list[Ack]]:
        """The retried schedule of one message, its key held (a span around it if traced)."""
        entity, backend, at = self.profile.name, self._backend, effect.at
        wire: Sequence[Message] = [effect.message]

        async def attempt(timeout: float) -> list[Ack]:
            return await backend.schedule(entity, wire, at, timeout=timeout)

        terms = self._retry_terms(wire, effect.started)
        telemetry = self._otel
        async with self._gate.hold(self._gate_key(wire)):
            if telemetry is None:
                return await self.retry.acall(attempt, **terms)
            with telemetry.transfer(self, wire, "schedule") as scope:
                wire = scope.wire(wire)
                return scope.acked(await self.retry.acall(attempt, **terms))

    # -- transactions ----------------------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """Send a group all or nothing (local broker, Artemis semantics).

        ``async with sender.transaction() as tx: tx.send(a); tx.send(b)`` commits
        on exit as one atomic transfer; the ``tx`` methods only validate and
        collect. Other tasks may keep sending through the sender meanwhile.
        Service Bus has no transactions in the Python client: ``ConfigurationError``.
        """
        self._check_open()
        self._check_atomic(self._backend)
        tx = Transaction(self)
        yield tx  # an exception in the block discards the group: nothing is sent
        tx.report = await self._send_atomic(tx.messages)

    async def _send_atomic(self, messages: list[Message]) -> SendReport:
        self._check_open()
        return await arun(self._atomic_steps(messages), self._perform)


class Transaction(TransactionCore):
    """A group of messages committed all or nothing when its ``async with`` block exits.

    ``report`` holds the outcome once committed: members of a group the broker
    ignored (another member was a duplicate) are failures in it.
    """

    def send(self, message: Message) -> None:
        """Validate ``message`` and add it to the group (sent on commit)."""
        self._add((message,), "message")

    def send_many(self, messages: Iterable[Message]) -> None:
        """Add ``messages`` to the group (validated now, sent when the ``async with`` exits)."""
        self._add(messages, "messages")
