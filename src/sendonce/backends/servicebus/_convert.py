"""Conversion between :class:`sendonce.Message` and azure-servicebus messages.

``ServiceBusMessage`` assigns a random UUID when ``message_id`` is unset or
empty, which silently defeats duplicate detection. Conversion therefore checks,
after building the client's message, that the id it carries is exactly ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from azure.servicebus import ServiceBusMessage

from ..._message import Message, PropertyValue
from ..._telemetry import PROPAGATION_PROPERTIES, TRACEPARENT
from ...errors import MessageIdError, ValidationError

__all__ = ["from_servicebus_message", "to_servicebus_message"]


def to_servicebus_message(
    message: Message, *, scheduled_enqueue_time: datetime | None = None
) -> ServiceBusMessage:
    """The client message for ``message``, every property carried over.

    ``scheduled_enqueue_time`` overrides the message's own scheduled time
    (``schedule`` passes its ``at`` through the management call instead).
    """
    if not isinstance(message, Message):
        raise ValidationError(
            f"expected a sendonce.Message, got {type(message).__name__}", field="messages"
        )
    when = scheduled_enqueue_time or message.scheduled_enqueue_time
    props: dict[Any, Any] | None = (
        None if message.application_properties is None else dict(message.application_properties)
    )
    if props and TRACEPARENT in props:
        # Under the client's own names (bytes keys): with azure-core tracing on, the client
        # adds its trace context only where these are absent, so the sender's is kept
        # rather than sent twice under one name.
        for name in PROPAGATION_PROPERTIES:
            if name in props:
                props[name.encode("ascii")] = props.pop(name)
    try:
        converted = ServiceBusMessage(
            message.body,
            message_id=message.message_id,
            partition_key=message.partition_key,
            session_id=message.session_id,
            subject=message.subject,
            content_type=message.content_type,
            correlation_id=message.correlation_id,
            application_properties=props,
            time_to_live=message.time_to_live,
            scheduled_enqueue_time_utc=when,
        )
    except ValueError as exc:  # the client's own length and key checks
        raise ValidationError(
            f"message {message.message_id!r} cannot be converted for Service Bus: {exc}",
            field="message",
        ) from None
    # What goes on the wire, read from the AMQP properties: the ``message_id`` property
    # tries ``.decode`` first and costs a caught exception per str id.
    properties = converted.raw_amqp_message.properties
    carried = properties.message_id if properties is not None else None
    if isinstance(carried, bytes):
        carried = carried.decode("utf-8", "replace")
    if not carried or carried != message.message_id:
        # Never let the client's random UUID stand in for the deterministic id.
        raise MessageIdError(
            f"message {message.message_id!r}: the Service Bus message would carry id "
            f"{carried!r}, not ours",
            field="message_id",
        )
    return converted


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _body_bytes(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    # A DATA body is an iterable of bytes sections.
    try:
        return b"".join(bytes(part) for part in body)
    except TypeError:
        raise ValidationError(
            f"Service Bus message body of type {type(body).__name__} is not a data body",
            field="body",
        ) from None


def _properties(raw: Mapping[Any, Any] | None) -> dict[str, PropertyValue] | None:
    if raw is None:
        return None
    out: dict[str, PropertyValue] = {}
    for key, value in raw.items():
        name = key.decode("utf-8") if isinstance(key, bytes) else str(key)
        out[name] = value
    return out


def from_servicebus_message(sb_message: Any) -> Message:
    """The sendonce message a ``ServiceBusMessage`` (or a received message) carries.

    The body comes back as ``bytes`` (the wire form of a ``str`` body is UTF-8).
    Property keys are decoded to ``str``; on a *received* message the client
    returns string property values as ``bytes``, and they are kept as it gives them.
    """
    ttl: timedelta | None = sb_message.time_to_live
    when: datetime | None = sb_message.scheduled_enqueue_time_utc
    message_id = _text(sb_message.message_id)
    if not message_id:
        raise MessageIdError("the Service Bus message has no message_id", field="message_id")
    return Message(
        _body_bytes(sb_message.body),
        message_id=message_id,
        partition_key=_text(sb_message.partition_key),
        session_id=_text(sb_message.session_id),
        subject=_text(sb_message.subject),
        content_type=_text(sb_message.content_type),
        correlation_id=_text(sb_message.correlation_id),
        application_properties=_properties(sb_message.application_properties),
        time_to_live=ttl if ttl else None,
        scheduled_enqueue_time=when,
    )
