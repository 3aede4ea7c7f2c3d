"""The outbox's telemetry, declared at its own edge on the featureless core
(``sendonce.telemetry._core``): the producer's trace context carried through the table, the
relay's batch span and the backlog gauges. docs/observability.md lists what is emitted.

- :func:`captured`: at ``enqueue``, the W3C trace context of the span current in the
  producer (a web request's), written by the core's propagator; stored with the rows in their
  ``trace_context`` column, never in the message, so the message is stored as given and the
  size rule at enqueue is untouched. Nothing (NULL) while telemetry is off.
- :func:`forwarded`: at the relay, the message carrying that context as its trace properties
  (``traceparent``, ``Diagnostic-Id``, ``tracestate``, the names the sender stamps), so a
  consumer that extracts them lands in the producer's trace. Done whether or not the relay
  itself is traced: the context is the producer's, and the relay only passes it on. A message
  the properties would push over the entity's limits goes as it was enqueued (the relay's
  span still links to the context).
- :func:`relay_batch`: the ``relay {entity}`` span, with one link per distinct stored
  context among its rows (the messaging conventions' link from a send to each message's
  creation context); it stays the parent of the sender's calls.
- :func:`relay_backlog`: the ``sendonce.outbox.lag`` and ``sendonce.outbox.rows_pending``
  gauges.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._message import with_properties
from .._telemetry import PROPAGATION_PROPERTIES
from ..errors import ValidationError
from ..telemetry import _core

if TYPE_CHECKING:
    from .._entity import EntityProfile
    from .._message import Message
    from ..telemetry._core import Core

__all__ = [
    "MAX_LINKS",
    "OFF",
    "captured",
    "forwarded",
    "observed",
    "relay_backlog",
    "relay_batch",
    "trace_headers",
]

TRACEPARENT, DIAGNOSTIC_ID, TRACESTATE = PROPAGATION_PROPERTIES
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")

MAX_LINKS = 128
"""Links a relay batch span carries at most: OpenTelemetry's default span link limit
(``OTEL_SPAN_LINK_COUNT_LIMIT``), past which the SDK would drop them anyway. The distinct
contexts beyond it are counted in ``sendonce.links_dropped``, not parsed."""


# -- the producer's context, through the table ---------------------------------------------


def captured() -> str | None:
    """The trace context current at ``enqueue``, as the row stores it (JSON of the W3C
    headers the propagator writes: ``traceparent``, ``tracestate`` when there is one);
    None when telemetry is off, tracing is not, or no span is current."""
    headers = _core.carrier()  # None while telemetry (or tracing) is off
    if not headers or TRACEPARENT not in headers:
        return None
    return json.dumps(headers, separators=(",", ":"))


def trace_headers(stored: str | None) -> dict[str, str] | None:
    """The W3C headers a row's ``trace_context`` holds; None for none (or a value that is
    not one sendonce wrote: it is ignored, never fatal to the row)."""
    if not stored:
        return None
    try:
        found = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    parent = found.get(TRACEPARENT)
    if not isinstance(parent, str) or not _TRACEPARENT.fullmatch(parent):
        return None
    if parent[3:35] == "0" * 32 or parent[36:52] == "0" * 16:  # W3C: invalid ids
        return None
    headers = {TRACEPARENT: parent}
    state = found.get(TRACESTATE)
    if isinstance(state, str) and state:
        headers[TRACESTATE] = state
    return headers


def forwarded(
    message: Message,
    stored: str | None,
    profile: EntityProfile,
    seen: dict[str, dict[str, str] | None] | None = None,
) -> Message | None:
    """``message`` carrying the producer's context as its trace properties; ``message``
    itself when there is none or it carries trace properties of its own (they are kept);
    None when the properties would push it over the entity's limits (size, property
    quotas): the caller sends it as it was enqueued. ``seen``: the properties of each
    stored context decoded so far (a request's rows share one: decoded once)."""
    if stored is None:
        return message
    wire = seen.get(stored, _UNSEEN) if seen is not None else _UNSEEN
    if wire is _UNSEEN:
        wire = _wire(stored)
        if seen is not None:
            seen[stored] = wire
    if wire is None:
        return message
    props = message.application_properties
    if props is not None and any(name in props for name in PROPAGATION_PROPERTIES):
        return message
    traced = with_properties(message, wire)
    if traced.size > profile._check_above:
        try:
            profile.check(traced)
        except ValidationError:
            return None
    return traced


_UNSEEN: dict[str, str] = {}


def _wire(stored: str) -> dict[str, str] | None:
    """The trace properties a stored context puts on a message, as the sender names them."""
    headers = trace_headers(stored)
    if headers is None:
        return None
    wire = {TRACEPARENT: headers[TRACEPARENT], DIAGNOSTIC_ID: headers[TRACEPARENT]}
    if TRACESTATE in headers:
        wire[TRACESTATE] = headers[TRACESTATE]
    return wire


# -- the relay's batch span -------------------------------------------------------------------


class RelayBatch:
    """One relay batch (the rows of one entity a round claimed): an INTERNAL span linked to
    its rows' producers, current while the batch is sent (the sender's calls are its
    children)."""

    __slots__ = ("core", "span", "token")

    def __init__(self, core: Core, span: Any) -> None:
        self.core = core
        self.span = span
        self.token: Any = None

    def __enter__(self) -> RelayBatch:
        core = self.core
        self.token = core.context.attach(core.trace.set_span_in_context(self.span))
        return self

    def set(self, **attributes: Any) -> None:
        """Add ``sendonce.<name>`` attributes (counts known at the end)."""
        for name, value in attributes.items():
            self.span.set_attribute(f"sendonce.{name}", value)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span, trace = self.span, self.core.trace
        if exc is not None:  # the relay's own failure (its database, an interrupt): no
            kind = type(exc)  # broker condition, so error.type is the exception's full name
            span.set_attribute("error.type", f"{kind.__module__}.{kind.__qualname__}")
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
        self.core.context.detach(self.token)
        span.end()


OFF = _core.OFF
"""The scope while the relay is not traced: the core's shared no-op scope."""


def relay_batch(
    entity: str | None,
    rows: int,
    *,
    system: str | None = None,
    contexts: Iterable[str | None] = (),
) -> RelayBatch | _core.Scope:
    """The span of one relay batch of ``rows`` claimed rows, linked to the distinct
    ``contexts`` stored with them (at most :data:`MAX_LINKS`); :data:`OFF` when untraced."""
    core = _core.active()
    if core is None or core.tracer is None:
        return OFF
    attributes: dict[str, Any] = {
        "messaging.operation.type": "send",
        "messaging.operation.name": "relay",
    }
    if entity is not None:
        attributes["messaging.destination.name"] = entity
    if system is not None:
        attributes["messaging.system"] = system
    attributes["sendonce.rows"] = rows
    links, dropped = _links(core, contexts)
    if dropped:
        attributes["sendonce.links_dropped"] = dropped
    span = core.tracer.start_span(
        f"relay {entity or 'outbox'}",
        kind=core.trace.SpanKind.INTERNAL,
        attributes=attributes,
        links=links,
    )
    return RelayBatch(core, span)


def _links(core: Core, contexts: Iterable[str | None]) -> tuple[list[Any], int]:
    """One link per distinct valid stored context (the first :data:`MAX_LINKS`), and how many
    distinct ones were left out."""
    distinct = dict.fromkeys(c for c in contexts if c)
    if not distinct:
        return [], 0
    trace = core.trace
    links: list[Any] = []
    dropped = 0
    for stored in distinct:
        if len(links) >= MAX_LINKS:
            dropped += 1
            continue
        headers = trace_headers(stored)
        if headers is None:
            continue
        context = trace.get_current_span(core.propagator.extract(headers)).get_span_context()
        if context.is_valid:
            links.append(trace.Link(context))
    return links, dropped


# -- the backlog ----------------------------------------------------------------------------


class _Gauges:
    """The outbox's gauges on one core (built once per core, ``Core.extension``)."""

    def __init__(self, core: Core) -> None:
        meter = core.meter
        self.lag = meter.create_gauge(
            "sendonce.outbox.lag",
            unit="s",
            description="Age of the oldest outbox row not yet published",
        )
        self.pending = meter.create_gauge(
            "sendonce.outbox.rows_pending",
            unit="{row}",
            description="Outbox rows not yet published",
        )


def observed() -> bool:
    """Whether telemetry is on (the backlog is worth a query)."""
    return _core.active() is not None


def relay_backlog(lag_seconds: float, rows_pending: int, *, outbox: str | None = None) -> None:
    """The outbox's backlog: the oldest unpublished row's age and how many rows wait."""
    core = _core.active()
    if core is None:
        return
    gauges: _Gauges = core.extension(_Gauges, _Gauges)
    attributes = {} if outbox is None else {"sendonce.outbox.name": outbox}
    gauges.lag.set(lag_seconds, attributes)
    gauges.pending.set(rows_pending, attributes)
