"""What the local broker hands to a receiver, and how message properties are stored."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Literal

from ..._message import _PROPERTY_TYPES, Message, PropertyValue
from ...errors import ValidationError
from ._store import from_us

__all__ = [
    "MessageState",
    "ReceivedMessage",
    "check_properties_to_modify",
    "decode_extra",
    "effective_ttl",
    "encode_extra",
    "modify_extra",
]

# Service Bus's ServiceBusReceivedMessage.State: deferred messages and scheduled ones not yet
# due read differently from active ones, in a peek too.
MessageState = Literal["active", "deferred", "scheduled"]


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message as the broker stored it, plus its delivery state."""

    message_id: str
    body: bytes
    partition_key: str | None
    session_id: str | None
    sequence_number: int
    enqueued_time: datetime
    scheduled_enqueue_time: datetime | None
    subject: str | None
    content_type: str | None
    correlation_id: str | None
    application_properties: Mapping[str, PropertyValue] | None
    time_to_live: timedelta | None
    lock_token: str | None
    locked_until: datetime | None
    delivery_count: int
    raw: bytes | None
    # Set on messages of a dead-letter subqueue (Service Bus's DeadLetterReason
    # and DeadLetterErrorDescription application properties).
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None
    state: MessageState = "active"
    # The application properties settlements changed (properties_to_modify of abandon,
    # defer and dead_letter): the emulator writes them over the sender's encoded ones.
    modified_properties: tuple[str, ...] = ()

    @property
    def expires_at(self) -> datetime | None:
        """When the message expires (None: never): its time to live after it became due."""
        if self.time_to_live is None:
            return None
        return (self.scheduled_enqueue_time or self.enqueued_time) + self.time_to_live


def _tag(value: PropertyValue) -> list[Any]:
    # Application properties may hold bytes, which JSON cannot: tag every value.
    if isinstance(value, bytes):
        return ["x", value.hex()]
    if isinstance(value, bool):
        return ["b", bool(value)]
    if isinstance(value, int):
        return ["i", int(value)]
    if isinstance(value, float):
        return ["f", float(value)]
    return ["s", str(value)]


def encode_extra(message: Message) -> str | None:
    """The optional properties of ``message`` as compact JSON, or None when it has none."""
    if (
        message.subject is None
        and message.content_type is None
        and message.correlation_id is None
        and message.time_to_live is None
        and message.application_properties is None
    ):
        return None
    extra: dict[str, Any] = {}
    for name in ("subject", "content_type", "correlation_id"):
        value = getattr(message, name)
        if value is not None:
            extra[name] = value
    if message.time_to_live is not None:
        extra["ttl_us"] = message.time_to_live // timedelta(microseconds=1)
    props = message.application_properties
    if props is not None:
        encoded: dict[str, Any] = {}
        for key, value in props.items():
            encoded[key] = None if value is None else _tag(value)
        extra["props"] = encoded
    if not extra:
        return None
    return json.dumps(extra, separators=(",", ":"), ensure_ascii=False)


def check_properties_to_modify(value: object) -> dict[str, PropertyValue] | None:
    """``properties_to_modify`` as a dict, or a ``ValidationError`` naming the field."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError(
            f"properties_to_modify must be a mapping, got {type(value).__name__}",
            field="properties_to_modify",
        )
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ValidationError(
                f"properties_to_modify keys must be non-empty str, got {key!r}",
                field="properties_to_modify",
            )
        if not isinstance(item, _PROPERTY_TYPES):
            raise ValidationError(
                f"properties_to_modify[{key!r}] must be str/int/float/bool/bytes/None, "
                f"got {type(item).__name__}",
                field="properties_to_modify",
            )
    return dict(value)


def modify_extra(text: str | None, changes: Mapping[str, PropertyValue]) -> str:
    """The stored optional properties with ``changes`` applied to the application properties."""
    extra: dict[str, Any] = json.loads(text) if text else {}
    props = extra.setdefault("props", {})
    modified = extra.setdefault("mod", [])
    for key, value in changes.items():
        props[key] = None if value is None else _tag(value)
        if key not in modified:
            modified.append(key)
    return json.dumps(extra, separators=(",", ":"), ensure_ascii=False)


def decode_extra(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    extra: dict[str, Any] = json.loads(text)
    if "mod" in extra:
        extra["modified_properties"] = tuple(extra.pop("mod"))
    if "ttl_us" in extra:
        extra["time_to_live"] = timedelta(microseconds=extra.pop("ttl_us"))
    if "props" in extra:
        props: dict[str, PropertyValue] = {}
        for key, value in extra.pop("props").items():
            if value is None:
                props[key] = None
            else:
                tag, payload = value
                props[key] = bytes.fromhex(payload) if tag == "x" else payload
        extra["application_properties"] = MappingProxyType(props)
    return extra


def effective_ttl(own: timedelta | None, default: timedelta | None) -> timedelta | None:
    """The time to live a message has on its entity, as Service Bus reports it.

    Without its own it takes the entity's default, and one longer than the default is
    cut to it ("the message's TTL is silently adjusted", message expiration doc).
    """
    if default is None:
        return own
    return default if own is None else min(own, default)


def received_from_row(
    row: tuple[Any, ...], *, default_ttl: timedelta | None = None, now: int | None = None
) -> ReceivedMessage:
    """Build from a ``messages`` row selected with :data:`ROW_COLUMNS`.

    ``default_ttl`` is the entity's default time to live; ``now`` (µs) is given by a peek,
    whose messages may be scheduled ones not due yet.
    """
    (
        seq,
        message_id,
        partition_key,
        session_id,
        body,
        extra,
        enqueued,
        scheduled,
        locked_until,
        lock_token,
        delivery_count,
        raw,
        dl_reason,
        dl_description,
        deferred,
    ) = row
    fields = decode_extra(extra)
    state: MessageState = "active"
    if deferred:
        state = "deferred"
    elif now is not None and scheduled is not None and scheduled > now:
        state = "scheduled"
    return ReceivedMessage(
        message_id=message_id,
        body=bytes(body),
        partition_key=partition_key,
        session_id=session_id,
        sequence_number=seq,
        enqueued_time=from_us(enqueued),
        scheduled_enqueue_time=None if scheduled is None else from_us(scheduled),
        subject=fields.get("subject"),
        content_type=fields.get("content_type"),
        correlation_id=fields.get("correlation_id"),
        application_properties=fields.get("application_properties"),
        time_to_live=effective_ttl(fields.get("time_to_live"), default_ttl),
        lock_token=lock_token,
        locked_until=None if locked_until is None else from_us(locked_until),
        delivery_count=delivery_count,
        raw=None if raw is None else bytes(raw),
        dead_letter_reason=dl_reason,
        dead_letter_error_description=dl_description,
        state=state,
        modified_properties=fields.get("modified_properties", ()),
    )


ROW_COLUMNS = (
    "seq, message_id, partition_key, session_id, body, extra, enqueued, scheduled, "
    "locked_until, lock_token, delivery_count, raw, dl_reason, dl_description, deferred"
)
