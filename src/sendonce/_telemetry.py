"""The features' OpenTelemetry traces and metrics: what the sender, the ledger, the Spark
task and the outbox relay call, built on the featureless core (``sendonce.telemetry._core``:
the switch, the providers, spans and propagation).

Nothing here costs anything unless OpenTelemetry is in use: :func:`active` is one
module-global check while no provider has been set (the core never imports the API
itself), and every caller keeps its untraced path behind ``if telemetry is None``. Once a
tracer or meter provider is set, the core switches and the instruments here are built
once for it (:func:`_on_switch`).

What is emitted follows the OpenTelemetry messaging semantic conventions of version
1.27.0 (``messaging.system``, ``messaging.operation.type = send``,
``messaging.destination.name``, ``messaging.message.id``, ``messaging.batch.message_count``,
``server.address``, ``server.port``, ``error.type``); the rest is named ``sendonce.*``.
A single ``send`` (or ``schedule``) is one PRODUCER span: the call and its transfer are one;
``send_many`` is a CLIENT span with one PRODUCER child per transfer.
``docs/observability.md`` lists every span, event, metric and attribute. A transfer's
trace context travels in each of its messages' application properties (``traceparent``
and ``Diagnostic-Id``, as the azure-servicebus client writes them), set once per transfer
so every resend carries the same one.

Why one long module: it is still the hall every feature's instruments live in (the
sender's call and transfer scopes, the ledger's writes, the Spark task, the outbox relay).
The split has started (issue 35): the core is ``sendonce.telemetry._core``, and the command
line's root span is declared at its own edge (``sendonce.cli._otel``); each feature's
instruments move next to it the same way, and this module then only re-exports what
callers import.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import operator
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from . import _message
from ._message import with_properties
from .errors import (
    InDoubtError,
    LedgerError,
    NotStoredError,
    PayloadConflictError,
    PermanentSendError,
    SendError,
    ValidationError,
)
from .telemetry import _core
from .telemetry._core import Core, carrier, flush, reset, use, worker_setup

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ._entity import EntityProfile
    from ._message import Message

__all__ = [
    "OFF",
    "PROPAGATION_PROPERTIES",
    "RESERVE",
    "Telemetry",
    "active",
    "carrier",
    "error_type",
    "flush",
    "in_doubt",
    "instrument",
    "lane_wait",
    "ledger_write",
    "outcome_of",
    "reset",
    "retried",
    "spark_task",
    "use",
    "worker_setup",
]


# -- names (docs/observability.md has the table) ------------------------------------------

SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
BATCH_COUNT = "messaging.batch.message_count"
MESSAGE_ID = "messaging.message.id"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
OUTCOME = "sendonce.outcome"

TRACEPARENT = "traceparent"
DIAGNOSTIC_ID = "Diagnostic-Id"
TRACESTATE = "tracestate"
PROPAGATION_PROPERTIES = (TRACEPARENT, DIAGNOSTIC_ID, TRACESTATE)
"""The application properties a producer's trace context travels in (azure-servicebus's
names: its consumers read ``traceparent``, then ``Diagnostic-Id``)."""

_RESERVED_BYTES = 160
"""What the trace properties add to a message at most, as ``Message.size`` counts:
``traceparent`` and ``Diagnostic-Id`` (55 characters each) with their names, and room for
a short ``tracestate``. The sender plans transfers with it while tracing is on."""
_MAX_TRACESTATE = _RESERVED_BYTES - 2 * 55 - len(TRACEPARENT) - len(DIAGNOSTIC_ID) - len(TRACESTATE)

_PAIR_SIZE = len(TRACEPARENT) + len(DIAGNOSTIC_ID) + 2 * 55
"""``traceparent`` and ``Diagnostic-Id`` with their 55-character values."""

RESERVE = 0
"""Bytes the sender's planning keeps free per message for the trace properties: 0 unless
tracing is on."""

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
"""The semantic conventions' advised boundaries (seconds) for messaging durations: the SDK's
default ones (0, 5, 10, 25... meant for milliseconds) would put every transfer in one bucket."""

T = TypeVar("T")
A = TypeVar("A")

# -- the switch (the core's, sendonce.telemetry._core) --------------------------------------

_active: Telemetry | None = None
"""The features' instruments on the core in use; None while telemetry is off (the hot
check of every hook)."""
_current_transfer: contextvars.ContextVar[TransferScope | None] = contextvars.ContextVar(
    "sendonce_transfer", default=None
)
_current_call: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "sendonce_single_call", default=None
)
"""The single-message call (``send``, ``schedule``) whose span its one transfer takes over."""


def active() -> Telemetry | None:
    """The instruments, or None while OpenTelemetry is not in use (the common, free case)."""
    telemetry = _active
    if telemetry is not None:
        return telemetry
    core = _core.active()  # looks for a newly set global provider
    if core is None:
        return None
    _on_switch(core)
    return _active


def _on_switch(core: Core | None) -> None:
    """The core changed: build (once per core) or drop the features' instruments."""
    global _active, RESERVE
    telemetry: Telemetry | None = None if core is None else core.extension(Telemetry, Telemetry)
    _active = telemetry
    RESERVE = _RESERVED_BYTES if telemetry is not None and telemetry.tracer is not None else 0


# -- what the sender passes around --------------------------------------------------------


def error_type(exc: BaseException) -> str:
    """``error.type``: the broker's condition when known, else the exception's full name."""
    for error in (exc, getattr(exc, "last_error", None)):
        condition = getattr(error, "condition", None)
        if isinstance(condition, str) and condition:
            return condition
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


Outcome = Literal[
    "sent",
    "duplicate",
    "scheduled",
    "in_doubt",
    "not_stored",
    "payload_conflict",
    "ledger_error",
    "refused",
    "invalid",
    "failed",
]


def outcome_of(error: BaseException) -> Outcome:
    """The ``sendonce.outcome`` of a message that failed with ``error``."""
    if isinstance(error, InDoubtError):
        return "in_doubt"
    if isinstance(error, NotStoredError):
        return "not_stored"
    if isinstance(error, PayloadConflictError):
        return "payload_conflict"
    if isinstance(error, LedgerError):
        return "ledger_error"
    if isinstance(error, PermanentSendError):
        return "refused"
    if isinstance(error, ValidationError):
        return "invalid"
    return "failed"


def _target(sender: Any) -> tuple[str, str]:
    """(messaging.system, destination) of a sender (its backend's system, its entity)."""
    backend = getattr(sender, "_backend", None)
    system = getattr(backend, "messaging_system", None)
    profile = getattr(sender, "profile", None)
    entity = getattr(profile, "name", None) or getattr(sender, "_entity_arg", None)
    entity = getattr(entity, "name", entity)
    return (system if isinstance(system, str) else "unknown"), str(entity)


def server_of(backend: Any) -> tuple[str | None, int | None]:
    """(``server.address``, ``server.port``) of a backend: its ``server_address`` and
    ``server_port`` attributes, or those of the backend it wraps (``inner``); (None, None)
    for a broker that is no server (the local broker's file)."""
    for _ in range(4):  # a wrapper of a wrapper at most; never a loop
        if backend is None:
            break
        address = getattr(backend, "server_address", None)
        if isinstance(address, str) and address:
            port = getattr(backend, "server_port", None)
            return address, port if isinstance(port, int) and not isinstance(port, bool) else None
        backend = getattr(backend, "inner", None)
    return None, None


def _attributes(sender: Any, operation: str) -> dict[str, Any]:
    """What every span and metric point of ``sender``'s ``operation`` carries: worked out on
    its first call and kept (a sender's backend and entity do not change). Shared: copy it
    to add to it."""
    kept: dict[str, dict[str, Any]] | None = getattr(sender, "_otel_attributes", None)
    if kept is not None:
        found = kept.get(operation)
        if found is not None:
            return found
    system, entity = _target(sender)
    attributes: dict[str, Any] = {
        SYSTEM: system,
        DESTINATION: entity,
        OPERATION_TYPE: "send",
        OPERATION_NAME: operation,
    }
    address, port = server_of(getattr(sender, "_backend", None))
    if address is not None:
        attributes[SERVER_ADDRESS] = address
        if port is not None:
            attributes[SERVER_PORT] = port
    if getattr(sender, "profile", None) is not None:  # an aio sender knows it once open
        if kept is None:
            kept = {}
            try:
                sender._otel_attributes = kept
            except AttributeError:  # pragma: no cover - a sender without a __dict__
                return attributes
        kept[operation] = attributes
    return attributes


def _size_of(headers: Mapping[str, str]) -> int:
    """What ``headers`` add to a message's size, as ``Message.size`` counts."""
    if len(headers) == 2:  # traceparent and Diagnostic-Id: always this long
        return _PAIR_SIZE
    return sum(len(k) + len(v) for k, v in headers.items())


def _traceparent(span: Span) -> dict[str, str] | None:
    """The trace properties a transfer's messages carry: ``traceparent`` and
    ``Diagnostic-Id`` (the same value), and ``tracestate`` when there is a short one."""
    found = _core.traceparent(span, _MAX_TRACESTATE)
    if found is None:
        return None
    parent, state = found
    headers = {TRACEPARENT: parent, DIAGNOSTIC_ID: parent}
    if state:
        headers[TRACESTATE] = state
    return headers


class Telemetry:
    """The features' metric instruments on a :class:`~sendonce.telemetry._core.Core`, built
    once per core (when OpenTelemetry turns on or changes providers)."""

    @property
    def tracer_provider(self) -> Any:
        return self.core.tracer_provider

    @property
    def meter_provider(self) -> Any:
        return self.core.meter_provider

    def __init__(self, core: Core) -> None:
        self.core = core
        self._trace = core.trace
        self._context = core.context
        self._propagator = core.propagator
        self.tracer: Any = core.tracer
        meter = core.meter
        self.messages = meter.create_counter(
            "sendonce.messages",
            unit="{message}",
            description="Messages handed to a sender, by what became of each (sendonce.outcome)",
        )
        self.duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of one transfer to the broker, its retries included",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.retries = meter.create_counter(
            "sendonce.retries",
            unit="{retry}",
            description="Transfer attempts retried, by the failure's condition (error.type)",
        )
        # Counted here, read when the metrics are collected: two dict updates per transfer
        # instead of two SDK measurements.
        self._in_flight: dict[tuple[str, str, str], int] = {}
        self._in_flight_lock = threading.Lock()
        meter.create_observable_up_down_counter(
            "sendonce.transfers.in_flight",
            callbacks=[self._observe_in_flight],
            unit="{transfer}",
            description="Transfers started and not yet over",
        )
        self.lane_waits = meter.create_histogram(
            "sendonce.lane.wait.duration",
            unit="s",
            description="Time a transfer waited for its key's turn or for a free link",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.ledger_duration = meter.create_histogram(
            "sendonce.ledger.operation.duration",
            unit="s",
            description="Duration of one ledger write (intent, confirm or release)",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )

    def in_flight(self, key: tuple[str, str, str], change: int) -> None:
        """A transfer of (system, destination, operation) started (+1) or ended (-1)."""
        with self._in_flight_lock:
            self._in_flight[key] = self._in_flight.get(key, 0) + change

    def _observe_in_flight(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        with self._in_flight_lock:
            counts = list(self._in_flight.items())
        return [
            Observation(count, {SYSTEM: s, DESTINATION: d, OPERATION_NAME: o})
            for (s, d, o), count in counts
        ]

    def _span(
        self, name: str, kind: str, attributes: dict[str, Any], parent: Any = None
    ) -> Span | None:
        return self.core.span(name, kind, attributes, parent)

    # -- sender calls ---------------------------------------------------------------

    def run_call(
        self, operation: str, sender: Any, method: Callable[..., T], args: Any, kwargs: Any
    ) -> T:
        """``method(sender, *args, **kwargs)`` inside a call span, its outcomes counted."""
        scope = CallScope(self, operation, sender, args)
        with scope:
            result = method(sender, *args, **kwargs)
            scope.done(result)
        return result

    async def arun_call(
        self,
        operation: str,
        sender: Any,
        method: Callable[..., Awaitable[T]],
        args: Any,
        kwargs: Any,
    ) -> T:
        """The asyncio :meth:`run_call`."""
        scope = CallScope(self, operation, sender, args)
        with scope:
            result = await method(sender, *args, **kwargs)
            scope.done(result)
        return result

    def bind(self, operation: str, sender: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` bound to ``sender``, each call in a call span (sync or async alike)."""
        if inspect.iscoroutinefunction(method):

            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                return await self.arun_call(operation, sender, method, args, kwargs)

            return functools.update_wrapper(traced_async, method)

        def traced(*args: Any, **kwargs: Any) -> Any:
            return self.run_call(operation, sender, method, args, kwargs)

        return functools.update_wrapper(traced, method)

    def transfer(
        self, sender: Any, batch: Sequence[Message], operation: str = "send"
    ) -> TransferScope:
        """The scope of one transfer and its retries: a child span, in-flight and duration."""
        return TransferScope(self, sender, batch, operation)

    def count(self, attributes: dict[str, Any], outcomes: Mapping[str, int]) -> None:
        for outcome, count in outcomes.items():
            if count:
                self.messages.add(count, {**attributes, OUTCOME: outcome})


class CallScope:
    """One sender call (``send``, ``send_many``, ``schedule``, a transaction's commit).

    A single-message call (``send``, ``schedule``) is one PRODUCER span that its transfer
    takes over (:class:`TransferScope` finds it in ``_current_call``): the call *is* the
    transfer. A call of several messages is a CLIENT span, each transfer a child of it.
    """

    __slots__ = (
        "attributes",
        "call_token",
        "claimed",
        "counted",
        "sender",
        "single",
        "span",
        "telemetry",
        "token",
    )

    def __init__(self, telemetry: Telemetry, operation: str, sender: Any, args: Any) -> None:
        self.telemetry = telemetry
        self.sender = sender
        attributes = self.attributes = _attributes(sender, operation)
        self.single = single = operation in _SINGLE
        if single and args:
            message_id = getattr(args[0], "message_id", None)
            if isinstance(message_id, str):
                attributes = {**attributes, MESSAGE_ID: message_id}
        self.span = telemetry._span(
            f"{operation} {attributes[DESTINATION]}",
            "PRODUCER" if single else "CLIENT",
            attributes,
        )
        self.token: Any = None
        self.call_token: Any = None
        self.counted = False
        self.claimed = False

    def __enter__(self) -> CallScope:
        span = self.span
        if span is not None:
            telemetry = self.telemetry
            self.token = telemetry._context.attach(telemetry._trace.set_span_in_context(span))
            if self.single:
                self.call_token = _current_call.set(self)
        return self

    def claim(self, sender: Any) -> Span | None:
        """This single call's span, for its one transfer (None once taken or if untraced)."""
        if self.claimed or self.sender is not sender:
            return None
        self.claimed = True
        return self.span

    def done(self, result: Any) -> None:
        """Record what the call returned: a ``SendResult`` or a ``SendReport``."""
        self.counted = True
        span = self.span
        outcome = getattr(result, "outcome", None)
        if isinstance(outcome, str):  # a SendResult
            self.telemetry.messages.add(1, {**self.attributes, OUTCOME: outcome})
            if span is not None:
                span.set_attribute(OUTCOME, outcome)
            return
        failures = getattr(result, "failures", None)
        if failures is None:
            return
        outcomes: dict[str, int] = {"sent": result.sent, "duplicate": result.duplicates}
        for failure in failures:
            kind = outcome_of(failure.error)
            outcomes[kind] = outcomes.get(kind, 0) + 1
        self.telemetry.count(self.attributes, outcomes)
        if span is not None:
            total = sum(outcomes.values())
            if total != 1:
                span.set_attribute(BATCH_COUNT, total)
            span.set_attribute("sendonce.sent", outcomes["sent"])
            span.set_attribute("sendonce.duplicates", outcomes["duplicate"])
            span.set_attribute("sendonce.failed", len(failures))
            if failures:
                first = failures[0].error
                span.set_attribute(ERROR_TYPE, error_type(first))
                span.set_status(
                    self.telemetry._trace.Status(
                        self.telemetry._trace.StatusCode.ERROR,
                        f"{len(failures)} message(s) failed, first {type(first).__name__}",
                    )
                )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and not self.counted and isinstance(exc, SendError | ValidationError):
            # A single send that failed, or a call refused before anything was sent (the
            # message that made it fail is counted; the others of the call were not sent).
            self.telemetry.count(self.attributes, {outcome_of(exc): 1})
        span = self.span
        if span is None:
            return
        if self.call_token is not None:
            _current_call.reset(self.call_token)
        if exc is not None:
            kind = outcome_of(exc) if isinstance(exc, SendError | ValidationError) else None
            if kind is not None:
                span.set_attribute(OUTCOME, kind)
            _fail_span(self.telemetry, span, exc)
        self.telemetry._context.detach(self.token)
        span.end()


def _fail_span(telemetry: Telemetry, span: Span, exc: BaseException) -> None:
    span.set_attribute(ERROR_TYPE, error_type(exc))
    span.set_status(telemetry._trace.Status(telemetry._trace.StatusCode.ERROR, type(exc).__name__))


class TransferScope:
    """One transfer with its retries: a PRODUCER span whose context each message carries.

    The transfer of a single-message call takes over the call's span instead of starting
    one of its own (one span per single send); a transfer of ``send_many`` or a transaction
    is a child span of its call.
    """

    __slots__ = (
        "attributes",
        "batch",
        "began",
        "flight",
        "headers",
        "owned",
        "profile",
        "span",
        "telemetry",
        "token",
        "transfer_token",
    )

    def __init__(
        self, telemetry: Telemetry, sender: Any, batch: Sequence[Message], operation: str
    ) -> None:
        self.telemetry = telemetry
        self.batch = batch
        self.profile: EntityProfile | None = getattr(sender, "profile", None)
        self.attributes = _attributes(sender, operation)
        self.headers: dict[str, str] | None = None
        self.span: Span | None = None
        self.owned = True
        self.flight: tuple[str, str, str] = ("", "", "")
        self.token: Any = None
        self.transfer_token: Any = None
        self.began = 0.0
        call = _current_call.get()
        if call is not None:
            span = call.claim(sender)
            if span is not None:
                self.span = span
                self.owned = False

    def __enter__(self) -> TransferScope:
        telemetry = self.telemetry
        span = self.span
        if self.owned:
            batch = self.batch
            attributes = dict(self.attributes)
            if len(batch) == 1:
                attributes[MESSAGE_ID] = batch[0].message_id
            else:
                attributes[BATCH_COUNT] = len(batch)
            name = f"{attributes[OPERATION_NAME]} {attributes[DESTINATION]}"
            span = self.span = telemetry._span(name, "PRODUCER", attributes)
            if span is not None:
                self.token = telemetry._context.attach(telemetry._trace.set_span_in_context(span))
        if span is not None:
            self.headers = _traceparent(span)
        self.transfer_token = _current_transfer.set(self)
        self.flight = key = self.key()
        telemetry.in_flight(key, 1)
        self.began = time.perf_counter()
        return self

    def key(self) -> tuple[str, str, str]:
        a = self.attributes
        return (a[SYSTEM], a[DESTINATION], a[OPERATION_NAME])

    def wire(self, batch: Sequence[Message]) -> Sequence[Message]:
        """``batch`` as it goes on the wire: each message carrying this transfer's context.

        Computed once per transfer, so every attempt (every resend) carries the same
        context. The id, keys and body are untouched, so duplicate detection and the
        payload checks see the same message. A message that already carries trace
        properties keeps its own; one the entity would refuse with them goes without.
        """
        headers = self.headers
        if headers is None:
            return batch
        kind = type(batch)
        if kind is not tuple and kind is not list:
            from ._message_columns import MessageColumns

            if isinstance(batch, MessageColumns):
                constant = batch.factory._constant or {}
                if any(name in constant for name in PROPAGATION_PROPERTIES):
                    return batch
                return batch.with_properties(headers)
        profile = self.profile
        limit = profile._check_above if profile is not None else None
        grow = _size_of(headers)
        shared = MappingProxyType(headers)  # one mapping for the transfer: encoded once
        wire: list[Message] = []
        append = wire.append
        for message in batch:
            props = message.application_properties
            if props is None:
                traced = _with_shared(message, shared, grow)
            elif any(name in props for name in PROPAGATION_PROPERTIES):
                append(message)
                continue
            else:
                traced = with_properties(message, headers)
            if limit is not None and profile is not None and message._size + grow > limit:
                try:
                    profile.check(traced)
                except ValidationError:
                    traced = message  # the context would make it too large: send it without
            append(traced)
        return wire

    def acked(self, attempted: A) -> A:
        """Note the broker's answer (an ``Attempted[list[Ack]]``) on the span; returns it."""
        span = self.span
        if span is not None:
            attempted_: Any = attempted
            span.set_attribute("sendonce.attempts", attempted_.attempts)
            if attempted_.in_doubt_before:
                # A duplicate ack now is the earlier, in-doubt attempt's copy: ours, sent.
                span.set_attribute("sendonce.in_doubt_before", True)
            else:
                acks = attempted_.value
                if len(acks) == 1:
                    duplicates = 1 if acks[0].outcome == "duplicate" else 0
                else:
                    duplicates = sum(1 for ack in acks if ack.outcome == "duplicate")
                if duplicates:
                    span.set_attribute("sendonce.duplicates", duplicates)
        return attempted

    def retried(self, attempt: int, error: BaseException | None, backoff: float) -> None:
        kind = error_type(error) if error is not None else "unknown"
        self.telemetry.retries.add(1, {**self.attributes, ERROR_TYPE: kind})
        if self.span is not None:
            self.span.add_event(
                "sendonce.retry",
                {"sendonce.attempt": attempt, ERROR_TYPE: kind, "sendonce.backoff": backoff},
            )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        telemetry = self.telemetry
        elapsed = time.perf_counter() - self.began
        _current_transfer.reset(self.transfer_token)
        telemetry.in_flight(self.flight, -1)
        if exc is None:
            telemetry.duration.record(elapsed, self.attributes)
        else:
            telemetry.duration.record(elapsed, {**self.attributes, ERROR_TYPE: error_type(exc)})
        span = self.span
        if span is None:
            return
        if exc is not None:
            if isinstance(exc, InDoubtError):
                span.add_event("sendonce.in_doubt", _in_doubt_attributes(exc, _why(exc)))
            attempts = getattr(exc, "attempts", None)
            if isinstance(attempts, int):
                span.set_attribute("sendonce.attempts", attempts)
            _fail_span(telemetry, span, exc)
        if self.owned:  # else the call's span: its scope ends it
            telemetry._context.detach(self.token)
            span.end()


_COPY = operator.attrgetter(*_message._FIELDS)
_PASTE = tuple(getattr(_message.Message, name).__set__ for name in _message._FIELDS)


def _with_shared(message: Message, shared: Mapping[str, str], grow: int) -> Message:
    """A copy of ``message`` (which has no application properties) carrying ``shared``, the
    transfer's one trace-properties mapping: the local broker encodes it once per transfer
    (it keys its encodings on the mapping), and no dict is built per message."""
    copy: Message = _message._new(_message.Message)
    for put, value in zip(_PASTE, _COPY(message)):  # noqa: B905 - both from _FIELDS
        put(copy, value)
    _message._SET_PROPS(copy, shared)
    _message._SET_SIZE(copy, message._size + grow)
    return copy


def _why(error: InDoubtError) -> str:
    """``not_resent`` when the backend refused a resend its broker may no longer detect (an
    Artemis id cache the id may have left), else ``retries``: the attempts ran out."""
    cause = error.last_error
    if isinstance(cause, InDoubtError) or (cause is None and not error.attempts):
        return "not_resent"
    return "retries"


def _in_doubt_attributes(error: InDoubtError, reason: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {"sendonce.reason": reason, ERROR_TYPE: error_type(error)}
    if error.message_id:
        attributes[MESSAGE_ID] = error.message_id
    if error.attempts:
        attributes["sendonce.attempts"] = error.attempts
    if error.elapsed is not None:
        attributes["sendonce.elapsed"] = error.elapsed.total_seconds()
    return attributes


# -- hooks the retry policy, the ledger and the lanes call ------------------------------


def retried(attempt: int, error: BaseException | None, backoff: float) -> None:
    """A transfer attempt failed and will be retried after ``backoff`` seconds."""
    if _active is None:
        return
    scope = _current_transfer.get()
    if scope is not None:
        scope.retried(attempt, error, backoff)


def in_doubt(error: InDoubtError, reason: str) -> None:
    """An in-doubt decision made without a transfer (the ledger's): an event on the call."""
    telemetry = _active
    if telemetry is None or telemetry.tracer is None:
        return
    span = telemetry._trace.get_current_span()
    if span.is_recording():
        span.add_event("sendonce.in_doubt", _in_doubt_attributes(error, reason))


def lane_wait(kind: str, entity: str, seconds: float) -> None:
    """A transfer waited ``seconds`` for its key's turn (``key``) or a free link (``link``)."""
    telemetry = _active
    if telemetry is not None:
        telemetry.lane_waits.record(seconds, {DESTINATION: entity, "sendonce.lane": kind})


class _Timed:
    """A ledger write, a Spark task or a relay batch: a span (if tracing) and a duration."""

    __slots__ = ("attributes", "began", "histogram", "span", "telemetry", "token")

    def __init__(
        self,
        telemetry: Telemetry,
        name: str,
        kind: str,
        attributes: dict[str, Any],
        histogram: Any = None,
        parent: Any = None,
    ) -> None:
        self.telemetry = telemetry
        self.attributes = attributes
        self.histogram = histogram
        self.span = telemetry._span(name, kind, attributes, parent)
        self.token: Any = None
        self.began = 0.0

    def __enter__(self) -> _Timed:
        if self.span is not None:
            telemetry = self.telemetry
            self.token = telemetry._context.attach(telemetry._trace.set_span_in_context(self.span))
        self.began = time.perf_counter()
        return self

    def set(self, **attributes: Any) -> None:
        """Add ``sendonce.<name>`` attributes (counts known at the end)."""
        if self.span is not None:
            for name, value in attributes.items():
                self.span.set_attribute(f"sendonce.{name}", value)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.histogram is not None:
            attributes = self.attributes
            if exc is not None:
                attributes = {**attributes, ERROR_TYPE: error_type(exc)}
            self.histogram.record(time.perf_counter() - self.began, attributes)
        span = self.span
        if span is None:
            return
        if exc is not None:
            _fail_span(self.telemetry, span, exc)
        self.telemetry._context.detach(self.token)
        span.end()


class _Untimed:
    """The scope when telemetry is off: does nothing (one shared instance)."""

    __slots__ = ()

    def __enter__(self) -> _Untimed:
        return self

    def set(self, **attributes: Any) -> None:
        pass

    def __exit__(self, *exc_info: object) -> None:
        pass


OFF = _Untimed()
Scope = _Timed | _Untimed


def ledger_write(operation: str, entity: str, store: object, **counts: int) -> Scope:
    """A ledger write (``intent``, ``confirm`` or ``release``); ``counts`` name what it
    writes (``keys=``, ``transfers=``)."""
    telemetry = active()
    if telemetry is None:
        return OFF
    kind = type(store).__name__.removesuffix("Store").lower()
    attributes = {
        DESTINATION: entity,
        "sendonce.ledger.operation": operation,
        "sendonce.ledger.store": kind or "unknown",
    }
    scope = _Timed(
        telemetry, f"ledger {operation} {entity}", "INTERNAL", attributes, telemetry.ledger_duration
    )
    scope.set(**counts)
    return scope


def spark_task(
    entity: str, partition: int, attempt: int, parent: Mapping[str, str] | None = None
) -> Scope:
    """One Spark task's publish, a child of ``parent`` (the driver's :func:`carrier`); its
    counts are set at the end (``scope.set(...)``)."""
    telemetry = active()
    if telemetry is None:
        return OFF
    attributes = {
        DESTINATION: entity,
        OPERATION_TYPE: "send",
        OPERATION_NAME: "publish",
        "sendonce.spark.partition": partition,
        "sendonce.spark.attempt": attempt,
    }
    context = telemetry._propagator.extract(parent) if parent else None
    return _Timed(telemetry, f"publish {entity}", "INTERNAL", attributes, parent=context)


# -- senders ------------------------------------------------------------------------------

_SINGLE = frozenset({"send", "schedule"})
"""The operations of one message: one span, the call's and its transfer's."""

_TRACED_METHODS = (
    ("send", "send"),
    ("send_many", "send_many"),
    ("schedule", "schedule"),
    ("_send_atomic", "transaction"),
)


def instrument(sender: Any) -> None:
    """Decide once, as a sender is configured, whether it is traced: ``sender._otel``.

    A traced sender gets its calls (``send``, ``send_many``, ``schedule``, a transaction's
    commit) wrapped in spans on the instance; an untraced one is left as it is, so its calls
    cost nothing more. A sender made before a provider was set stays untraced.
    """
    telemetry = active()
    sender._otel = telemetry
    if telemetry is None:
        return
    for name, operation in _TRACED_METHODS:
        method = getattr(type(sender), name, None)
        if method is not None:
            sender.__dict__[name] = telemetry.bind(operation, sender, method)


_core.on_switch(_on_switch)
_on_switch(_core.current())  # a core set before this module was imported
