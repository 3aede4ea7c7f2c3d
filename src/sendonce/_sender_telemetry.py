"""The sender's spans and metrics, declared at the sender's edge on the featureless telemetry
core (``sendonce.telemetry._core``: the switch, the providers, spans and propagation).

Nothing here costs anything unless OpenTelemetry is in use: a sender decides once, as it
is made, whether it is traced (:func:`instrument`), and every caller keeps its untraced
path behind ``if telemetry is None``.

What is emitted follows the OpenTelemetry messaging semantic conventions of version
1.27.0 (``messaging.system``, ``messaging.operation.type = send``,
``messaging.destination.name``, ``messaging.message.id``, ``messaging.batch.message_count``,
``server.address``, ``server.port``, ``error.type``); the rest is named ``sendonce.*``.
A single ``send`` (or ``schedule``) is one PRODUCER span: the call and its transfer are one;
``send_many`` is a CLIENT span with one PRODUCER child per transfer.
``docs/observability.md`` lists every span, event, metric and attribute.

The conventions want each message to carry its creation context: with no per-message
"create" span, the context of the span that publishes it. So a transfer's context travels
in each of its messages' application properties (``traceparent`` and ``Diagnostic-Id``, as
the azure-servicebus client writes them; ``sendonce._propagation``), formatted once per
transfer, so every resend carries the same one.

The hot path is kept short on purpose (the cost targets of docs/benchmarks.md): what a
sender's spans and points carry is worked out once per sender and operation
(:class:`Target`), transfers in flight and messages by outcome are counted here and read
when metrics are collected, and a single send's late attributes reach its span in one call.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ._propagation import PROPAGATION_PROPERTIES, RESERVED_BYTES, headers_of, links_of, stamp
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
from .telemetry._core import (
    BATCH_COUNT,
    DESTINATION,
    DURATION_BUCKETS,
    ERROR_TYPE,
    MESSAGE_ID,
    OPERATION_NAME,
    OPERATION_TYPE,
    SERVER_ADDRESS,
    SERVER_PORT,
    SYSTEM,
    Core,
    error_type,
    fail,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ._entity import EntityProfile
    from ._message import Message

__all__ = [
    "PROPAGATION_PROPERTIES",
    "RESERVE",
    "Telemetry",
    "active",
    "in_doubt",
    "in_doubt_attributes",
    "instrument",
    "lane_wait",
    "outcome_of",
    "retried",
    "server_of",
]

OUTCOME = "sendonce.outcome"
ATTEMPTS = "sendonce.attempts"

RESERVE = 0
"""Bytes the sender's planning keeps free per message for the trace properties: 0 unless
tracing is on."""

T = TypeVar("T")
A = TypeVar("A")

# -- the switch (the core's) -----------------------------------------------------------------

_active: Telemetry | None = None
"""The sender's instruments on the core in use; None while telemetry is off (the hot check
of every hook)."""
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
    """The core changed: build (once per core) or drop the sender's instruments."""
    global _active, RESERVE
    telemetry: Telemetry | None = None if core is None else core.extension(Telemetry, Telemetry)
    _active = telemetry
    RESERVE = RESERVED_BYTES if telemetry is not None and telemetry.tracer is not None else 0


# -- what a sender's spans and points carry ---------------------------------------------------

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


def _target_of(sender: Any) -> tuple[str, str]:
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


class Target:
    """What every span and point of one sender's operation carries, worked out on first use
    and kept (a sender's backend and entity do not change): the attributes (shared: copy
    them to add to them), the span name, the attributes of each outcome's count, and the
    operation's transfers in flight (a deque: appending and popping are atomic, no lock)."""

    __slots__ = ("attributes", "flight", "name", "outcomes")

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes
        self.name = f"{attributes[OPERATION_NAME]} {attributes[DESTINATION]}"
        self.outcomes: dict[str, tuple[tuple[str, Any], ...]] = {}
        self.flight: deque[None] | None = None
        """Set by :meth:`Telemetry.flight` on the operation's first transfer."""

    def counted(self, outcome: str) -> tuple[tuple[str, Any], ...]:
        """The attributes of a ``sendonce.messages`` point of ``outcome``, as the key its
        count is kept under (built once; two senders of one entity share the key)."""
        found = self.outcomes.get(outcome)
        if found is None:
            found = self.outcomes[outcome] = tuple({**self.attributes, OUTCOME: outcome}.items())
        return found


def _attributes(sender: Any, operation: str) -> dict[str, Any]:
    system, entity = _target_of(sender)
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
    return attributes


class Telemetry:
    """The sender's metric instruments on a :class:`~sendonce.telemetry._core.Core`, built
    once per core (when OpenTelemetry turns on or changes providers)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.tracer: Any = core.tracer
        meter = core.meter
        # Counted here, read when the metrics are collected (an observable counter: the same
        # cumulative sums on export): a dict update per call instead of an SDK measurement,
        # which costs a single send as much as a quarter of its span.
        self._messages: dict[tuple[tuple[str, Any], ...], int] = {}
        self._messages_lock = threading.Lock()
        meter.create_observable_counter(
            "sendonce.messages",
            callbacks=[self._observe_messages],
            unit="{message}",
            description="Messages handed to a sender, by what became of each (sendonce.outcome)",
        )
        self.duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of one transfer to the broker, its retries included",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.retries = meter.create_counter(
            "sendonce.retries",
            unit="{retry}",
            description="Transfer attempts retried, by the failure's condition (error.type)",
        )
        # Counted here, read when the metrics are collected: an append and a pop per
        # transfer instead of two SDK measurements.
        self._flights: dict[tuple[str, str, str], deque[None]] = {}
        self._flights_lock = threading.Lock()
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
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )

    def target(self, sender: Any, operation: str) -> Target:
        """``sender``'s :class:`Target` for ``operation``: kept on the sender once it knows
        its entity (an aio sender knows it once open)."""
        kept: dict[str, Target] | None = getattr(sender, "_otel_targets", None)
        if kept is not None:
            found = kept.get(operation)
            if found is not None:
                return found
        target = Target(_attributes(sender, operation))
        if getattr(sender, "profile", None) is not None:
            if kept is None:
                kept = {}
                try:
                    sender._otel_targets = kept
                except AttributeError:  # pragma: no cover - a sender without a __dict__
                    return target
            kept[operation] = target
        return target

    def flight(self, target: Target) -> deque[None]:
        """The deque counting ``target``'s transfers in flight, registered on first use."""
        found = target.flight
        if found is None:
            a = target.attributes
            key = (a[SYSTEM], a[DESTINATION], a[OPERATION_NAME])
            with self._flights_lock:
                found = self._flights.get(key)
                if found is None:
                    found = self._flights[key] = deque()
            target.flight = found
        return found

    def _observe_in_flight(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        with self._flights_lock:
            flights = list(self._flights.items())
        return [
            Observation(len(flight), {SYSTEM: s, DESTINATION: d, OPERATION_NAME: o})
            for (s, d, o), flight in flights
        ]

    # -- sender calls ---------------------------------------------------------------

    def bind(self, operation: str, sender: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` bound to ``sender``, each call in a call span (sync or async alike)."""
        if inspect.iscoroutinefunction(method):
            wrapped: Callable[..., Awaitable[Any]] = method

            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                call = CallScope(self, operation, sender, args)
                try:
                    result = await wrapped(sender, *args, **kwargs)
                except BaseException as exc:
                    call.failed(exc)
                    raise
                call.done(result)
                return result

            return functools.update_wrapper(traced_async, method)

        def traced(*args: Any, **kwargs: Any) -> Any:
            call = CallScope(self, operation, sender, args)
            try:
                result = method(sender, *args, **kwargs)
            except BaseException as exc:
                call.failed(exc)
                raise
            call.done(result)
            return result

        return functools.update_wrapper(traced, method)

    def transfer(
        self, sender: Any, batch: Sequence[Message], operation: str = "send"
    ) -> TransferScope:
        """The scope of one transfer and its retries: a child span, in-flight and duration."""
        return TransferScope(self, sender, batch, operation)

    def count(self, target: Target, outcomes: Mapping[str, int]) -> None:
        """Count messages by outcome (``sendonce.messages``), read at the next collection."""
        counts = self._messages
        with self._messages_lock:
            for outcome, count in outcomes.items():
                if count:
                    key = target.counted(outcome)
                    counts[key] = counts.get(key, 0) + count

    def count_one(self, target: Target, outcome: str) -> None:
        """Count one message of ``outcome`` (a single send's)."""
        key = target.counted(outcome)
        with self._messages_lock:
            self._messages[key] = self._messages.get(key, 0) + 1

    def _observe_messages(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        with self._messages_lock:
            counts = list(self._messages.items())
        return [Observation(count, dict(key)) for key, count in counts]


_SINGLE = frozenset({"send", "schedule"})
"""The operations of one message: one span, the call's and its transfer's."""


class CallScope:
    """One sender call (``send``, ``send_many``, ``schedule``, a transaction's commit),
    started as it is made and ended by :meth:`done` or :meth:`failed`.

    A single-message call (``send``, ``schedule``) is one PRODUCER span that its transfer
    takes over (:class:`TransferScope` finds it in ``_current_call``): the call *is* the
    transfer, and the attributes the transfer learns late wait in ``late`` to reach the
    span in one call with the outcome. A call of several messages is a CLIENT span, each
    transfer a child of it.
    """

    __slots__ = ("call_token", "claimed", "late", "sender", "span", "target", "telemetry", "token")

    def __init__(self, telemetry: Telemetry, operation: str, sender: Any, args: Any) -> None:
        self.telemetry = telemetry
        self.sender = sender
        target = self.target = telemetry.target(sender, operation)
        self.late: dict[str, Any] | None = None
        self.claimed = False
        self.token: Any = None
        self.call_token: Any = None
        tracer = telemetry.tracer
        if tracer is None:
            self.span: Span | None = None
            return
        trace = telemetry.core.trace
        attributes = target.attributes
        if operation in _SINGLE:
            kind = trace.SpanKind.PRODUCER
            message: Any = args[0] if args else None
            message_id = getattr(message, "message_id", None)
            if isinstance(message_id, str):
                attributes = {**attributes, MESSAGE_ID: message_id}
            links = None
            if getattr(message, "application_properties", None):
                links = links_of(telemetry.core, (message,))
            span = self.span = tracer.start_span(
                target.name, kind=kind, attributes=attributes, links=links
            )
            self.late = {}
            self.call_token = _current_call.set(self)
        else:
            kind = trace.SpanKind.CLIENT
            span = self.span = tracer.start_span(target.name, kind=kind, attributes=attributes)
        self.token = telemetry.core.context.attach(trace.set_span_in_context(span))

    def claim(self, sender: Any) -> CallScope | None:
        """This single call, for its one transfer to take over its span (None once taken)."""
        if self.claimed or self.sender is not sender:
            return None
        self.claimed = True
        return self

    def done(self, result: Any) -> None:
        """Record what the call returned (a ``SendResult`` or a ``SendReport``) and end."""
        span = self.span
        outcome = getattr(result, "outcome", None)
        if isinstance(outcome, str):  # a SendResult
            self.telemetry.count_one(self.target, outcome)
            if span is not None:
                late = self.late
                if late:
                    late[OUTCOME] = outcome
                    span.set_attributes(late)
                else:
                    span.set_attribute(OUTCOME, outcome)
                self._end(span)
            return
        failures = getattr(result, "failures", None)
        if failures is not None:
            self._report(result, failures, span)
        if span is not None:
            self._end(span)

    def _report(self, result: Any, failures: Any, span: Span | None) -> None:
        outcomes: dict[str, int] = {"sent": result.sent, "duplicate": result.duplicates}
        for failure in failures:
            kind = outcome_of(failure.error)
            outcomes[kind] = outcomes.get(kind, 0) + 1
        self.telemetry.count(self.target, outcomes)
        if span is None:
            return
        total = sum(outcomes.values())
        attributes: dict[str, Any] = {
            "sendonce.sent": outcomes["sent"],
            "sendonce.duplicates": outcomes["duplicate"],
            "sendonce.failed": len(failures),
        }
        if total != 1:
            attributes[BATCH_COUNT] = total
        if failures:
            first = failures[0].error
            attributes[ERROR_TYPE] = error_type(first)
        span.set_attributes(attributes)
        if failures:
            trace = self.telemetry.core.trace
            span.set_status(
                trace.Status(
                    trace.StatusCode.ERROR,
                    f"{len(failures)} message(s) failed, first {type(first).__name__}",
                )
            )

    def failed(self, exc: BaseException) -> None:
        """The call raised ``exc``: count and mark it, and end."""
        known = isinstance(exc, SendError | ValidationError)
        if known:
            # A single send that failed, or a call refused before anything was sent (the
            # message that made it fail is counted; the others of the call were not sent).
            self.telemetry.count(self.target, {outcome_of(exc): 1})
        span = self.span
        if span is None:
            return
        if self.late:
            span.set_attributes(self.late)
        if known:
            span.set_attribute(OUTCOME, outcome_of(exc))
        fail(self.telemetry.core, span, exc)
        self._end(span)

    def _end(self, span: Span) -> None:
        if self.call_token is not None:
            _current_call.reset(self.call_token)
        self.telemetry.core.context.detach(self.token)
        span.end()


class TransferScope:
    """One transfer with its retries: a PRODUCER span whose context each message carries.

    The transfer of a single-message call takes over the call's span instead of starting
    one of its own (one span per single send); a transfer of ``send_many`` or a transaction
    is a child span of its call.
    """

    __slots__ = (
        "batch",
        "began",
        "call",
        "flight",
        "headers",
        "profile",
        "span",
        "target",
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
        self.target = telemetry.target(sender, operation)
        self.headers: dict[str, str] | None = None
        self.span: Span | None = None
        self.call: CallScope | None = None
        self.token: Any = None
        self.transfer_token: Any = None
        self.began = 0.0
        flight = self.target.flight  # an empty deque is false: compare with None
        self.flight: deque[None] = telemetry.flight(self.target) if flight is None else flight
        call = _current_call.get()
        if call is not None:
            self.call = call = call.claim(sender)
            if call is not None:
                self.span = call.span

    def __enter__(self) -> TransferScope:
        telemetry = self.telemetry
        span = self.span
        if self.call is None:
            tracer = telemetry.tracer
            if tracer is not None:
                batch = self.batch
                target = self.target
                attributes = dict(target.attributes)
                if len(batch) == 1:
                    attributes[MESSAGE_ID] = batch[0].message_id
                else:
                    attributes[BATCH_COUNT] = len(batch)
                trace = telemetry.core.trace
                span = self.span = tracer.start_span(
                    target.name,
                    kind=trace.SpanKind.PRODUCER,
                    attributes=attributes,
                    links=links_of(telemetry.core, batch),
                )
                self.token = telemetry.core.context.attach(trace.set_span_in_context(span))
        if span is not None:
            self.headers = headers_of(span)
        self.transfer_token = _current_transfer.set(self)
        self.flight.append(None)
        self.began = time.perf_counter()
        return self

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
        return stamp(batch, headers, self.profile)

    def acked(self, attempted: A) -> A:
        """Note the broker's answer (an ``Attempted[list[Ack]]``) on the span; returns it."""
        span = self.span
        if span is None:
            return attempted
        attempted_: Any = attempted
        call = self.call
        late: dict[str, Any] = {} if call is None or call.late is None else call.late
        late[ATTEMPTS] = attempted_.attempts
        if attempted_.in_doubt_before:
            # A duplicate ack now is the earlier, in-doubt attempt's copy: ours, sent.
            late["sendonce.in_doubt_before"] = True
        else:
            acks = attempted_.value
            if len(acks) == 1:
                duplicates = 1 if acks[0].outcome == "duplicate" else 0
            else:
                duplicates = sum(1 for ack in acks if ack.outcome == "duplicate")
            if duplicates:
                late["sendonce.duplicates"] = duplicates
        if call is None:
            span.set_attributes(late)  # else the call's span: set as it ends, in one call
        return attempted

    def retried(self, attempt: int, error: BaseException | None, backoff: float) -> None:
        kind = error_type(error) if error is not None else "unknown"
        self.telemetry.retries.add(1, {**self.target.attributes, ERROR_TYPE: kind})
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
        target = self.target
        self.flight.pop()
        if exc is None:
            telemetry.duration.record(elapsed, target.attributes)
        else:
            telemetry.duration.record(elapsed, {**target.attributes, ERROR_TYPE: error_type(exc)})
        span = self.span
        if span is None:
            return
        if exc is not None:
            if isinstance(exc, InDoubtError):
                span.add_event("sendonce.in_doubt", in_doubt_attributes(exc, _why(exc)))
            attempts = getattr(exc, "attempts", None)
            if isinstance(attempts, int):
                span.set_attribute(ATTEMPTS, attempts)
            fail(telemetry.core, span, exc)
        if self.call is None:  # else the call's span: the call ends it
            telemetry.core.context.detach(self.token)
            span.end()


def _why(error: InDoubtError) -> str:
    """``not_resent`` when the backend refused a resend its broker may no longer detect (an
    Artemis id cache the id may have left), else ``retries``: the attempts ran out."""
    cause = error.last_error
    if isinstance(cause, InDoubtError) or (cause is None and not error.attempts):
        return "not_resent"
    return "retries"


def in_doubt_attributes(error: InDoubtError, reason: str) -> dict[str, Any]:
    """The attributes of a ``sendonce.in_doubt`` event: why, the error, the message."""
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
    span = telemetry.core.trace.get_current_span()
    if span.is_recording():
        span.add_event("sendonce.in_doubt", in_doubt_attributes(error, reason))


def lane_wait(kind: str, entity: str, seconds: float) -> None:
    """A transfer waited ``seconds`` for its key's turn (``key``) or a free link (``link``)."""
    telemetry = _active
    if telemetry is not None:
        telemetry.lane_waits.record(seconds, {DESTINATION: entity, "sendonce.lane": kind})


# -- senders ------------------------------------------------------------------------------

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
