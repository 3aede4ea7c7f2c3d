"""What a traced transfer's messages carry: its W3C trace context in their application
properties, and the links its span makes to contexts messages bring of their own.

The messaging conventions (1.27.0) want each message to carry its creation context: with
no per-message "create" span, the context of the span that publishes it. So every message
of a transfer carries the transfer's context (``traceparent`` and ``Diagnostic-Id``, as the
azure-servicebus client writes them), formatted once per transfer and shared by all its
messages as one mapping; a message that brings a context of its own keeps it, and the span
links to it. Copying each message to carry the mapping is the one per-message cost of a
traced ``send_many``: :func:`with_shared` keeps it as small as Python allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from . import _message
from ._message import with_properties
from .errors import ValidationError
from .telemetry import _core

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ._entity import EntityProfile
    from ._message import Message
    from .telemetry._core import Core

__all__ = [
    "DIAGNOSTIC_ID",
    "PAIR_SIZE",
    "PROPAGATION_PROPERTIES",
    "RESERVED_BYTES",
    "TRACEPARENT",
    "TRACESTATE",
    "headers_of",
    "links_of",
    "stamp",
    "with_shared",
]

TRACEPARENT = "traceparent"
DIAGNOSTIC_ID = "Diagnostic-Id"
TRACESTATE = "tracestate"
PROPAGATION_PROPERTIES = (TRACEPARENT, DIAGNOSTIC_ID, TRACESTATE)
"""The application properties a producer's trace context travels in (azure-servicebus's
names: its consumers read ``traceparent``, then ``Diagnostic-Id``)."""

RESERVED_BYTES = 160
"""What the trace properties add to a message at most, as ``Message.size`` counts:
``traceparent`` and ``Diagnostic-Id`` (55 characters each) with their names, and room for
a short ``tracestate``. The sender plans transfers with it while tracing is on."""
_MAX_TRACESTATE = RESERVED_BYTES - 2 * 55 - len(TRACEPARENT) - len(DIAGNOSTIC_ID) - len(TRACESTATE)

PAIR_SIZE = len(TRACEPARENT) + len(DIAGNOSTIC_ID) + 2 * 55
"""``traceparent`` and ``Diagnostic-Id`` with their 55-character values."""


def headers_of(span: Span) -> dict[str, str] | None:
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


def _size_of(headers: Mapping[str, str]) -> int:
    """What ``headers`` add to a message's size, as ``Message.size`` counts."""
    if len(headers) == 2:  # traceparent and Diagnostic-Id: always this long
        return PAIR_SIZE
    return sum(len(k) + len(v) for k, v in headers.items())


def stamp(
    batch: Sequence[Message], headers: dict[str, str], profile: EntityProfile | None
) -> Sequence[Message]:
    """``batch`` as it goes on the wire: each message carrying ``headers``, the transfer's
    context.

    The id, keys and body are untouched, so duplicate detection and the payload checks see
    the same message. A message that already carries trace properties keeps its own; one
    the entity (``profile``) would refuse with them goes without.
    """
    kind = type(batch)
    if kind is not tuple and kind is not list:
        from ._message_columns import MessageColumns

        if isinstance(batch, MessageColumns):
            constant = batch.factory._constant or {}
            if any(name in constant for name in PROPAGATION_PROPERTIES):
                return batch
            return batch.with_properties(headers)
    limit = profile._check_above if profile is not None else None
    grow = _size_of(headers)
    shared = MappingProxyType(headers)  # one mapping for the transfer: encoded once
    copy = with_shared
    if len(batch) == 1:  # a single send: no pass over the batch
        message = batch[0]
        if message.application_properties is None and (
            limit is None or message._size + grow <= limit
        ):
            return [copy(message, shared, grow)]
    elif not any(map(_PROPERTIES, batch)) and (
        limit is None or max(map(_SIZE, batch), default=0) + grow <= limit
    ):  # the common case, checked in C: no message has properties, none grows too big
        return [copy(message, shared, grow) for message in batch]
    wire: list[Message] = []
    append = wire.append
    for message in batch:
        props = message.application_properties
        if props is None:
            traced = copy(message, shared, grow)
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


_PROPERTIES = attrgetter("application_properties")
_SIZE = attrgetter("_size")


def links_of(core: Core, batch: Sequence[Message]) -> list[Any] | None:
    """Links to the creation contexts messages of ``batch`` carry of their own (``traceparent``
    or a W3C ``Diagnostic-Id``): the conventions want a publish span linked to each custom
    creation context, which the message keeps. None, after one C-level pass, when no
    message has properties (the common case)."""
    from ._message_columns import MessageColumns

    if isinstance(batch, MessageColumns):
        constant = batch.factory._constant
        found = [constant] if constant else []
    elif not any(map(_PROPERTIES, batch)):
        return None
    else:
        found = [props for props in map(_PROPERTIES, batch) if props]
    links: list[Any] = []
    seen: set[str] = set()
    for props in found:
        parent = props.get(TRACEPARENT) or props.get(DIAGNOSTIC_ID)
        if not isinstance(parent, str) or parent in seen:
            continue
        seen.add(parent)
        carrier = {TRACEPARENT: parent}
        state = props.get(TRACESTATE)
        if isinstance(state, str):
            carrier[TRACESTATE] = state
        context = core.trace.get_current_span(core.propagator.extract(carrier)).get_span_context()
        if context.is_valid:
            links.append(core.trace.Link(context))
    return links or None


class _Twin:
    """A mutable twin of :class:`~sendonce.Message`: the same slots, so an instance filled by
    plain attribute stores becomes a Message by ``__class__`` assignment. A traced
    ``send_many`` copies every message; this copy costs half of twelve frozen-slot setter
    calls."""

    __slots__ = _message.Message.__slots__


def with_shared(
    message: Message,
    shared: Mapping[str, str],
    grow: int,
    twin: type[_Twin] = _Twin,
    kind: type[Message] = _message.Message,
) -> Message:
    """A copy of ``message`` (which has no application properties) carrying ``shared``, the
    transfer's one trace-properties mapping: the local broker encodes it once per transfer
    (it keys its encodings on the mapping), and no dict is built per message. Every field
    of ``Message`` is copied (tests/unit/test_sender_telemetry_copy.py checks none is missed)."""
    copy: Any = twin()
    copy.body = message.body
    copy.message_id = message.message_id
    copy.partition_key = message.partition_key
    copy.session_id = message.session_id
    copy.scheduled_enqueue_time = message.scheduled_enqueue_time
    copy.subject = message.subject
    copy.content_type = message.content_type
    copy.correlation_id = message.correlation_id
    copy.application_properties = shared
    copy.time_to_live = message.time_to_live
    copy._size = message._size + grow
    copy._body_hash = message._body_hash
    copy.__class__ = kind
    result: Message = copy
    return result
