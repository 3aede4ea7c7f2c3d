"""Service Bus's message property quotas: 32 KB for each property, 64 KB for all of them.

The quotas doc ("Message property size for a queue, topic, or subscription entity"): each
property at most 32 KB, and all properties together at most 64 KB, a limit on "the entire
header of the brokered message, which has both user properties and system properties, such
as sequence number, label, and message ID". The service refuses the message as too large
(`amqp:link:message-size-exceeded`; .NET reports a serialization error of the header stream
as MessageSizeExceededException), whatever the entity's maximum message size.

A property's size here is its name and its value as UTF-8 (binary values by their length,
numbers and booleans by their encoded width): the doc does not say whether the name counts,
so it is counted, and a property is refused only when even that generous measure is over.
"""

from __future__ import annotations

from collections.abc import Iterator

from ._message import Message, PropertyValue
from .errors import MessageSizeError

__all__ = [
    "MAX_PROPERTIES_SIZE",
    "MAX_PROPERTY_SIZE",
    "QUOTA_SAFE_SIZE",
    "check_property_quotas",
    "property_size",
]

MAX_PROPERTY_SIZE = 32 * 1024
MAX_PROPERTIES_SIZE = 64 * 1024
# Message.size counts text in characters, and UTF-8 takes at most 4 bytes for one: a message
# no larger than this cannot break either quota, so the check can be skipped for it.
QUOTA_SAFE_SIZE = MAX_PROPERTY_SIZE // 4

_SYSTEM_PROPERTIES = (
    "message_id",
    "partition_key",
    "session_id",
    "subject",
    "content_type",
    "correlation_id",
)


def _value_size(value: PropertyValue) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, bool):
        return 1
    return 8  # int (long) and float (double)


def property_size(name: str, value: PropertyValue) -> int:
    """The bytes one property takes against the 32 KB quota: name and value."""
    return len(name.encode("utf-8")) + _value_size(value)


def _properties(message: Message) -> Iterator[tuple[str, str, int]]:
    """(field, property name, size) of each property the message carries."""
    for name in _SYSTEM_PROPERTIES:
        value = getattr(message, name)
        if value is not None:
            yield name, name, property_size(name, value)
    for key, value in (message.application_properties or {}).items():
        yield "application_properties", key, property_size(key, value)


def check_property_quotas(message: Message, entity: str) -> None:
    """Raise ``MessageSizeError`` naming the property when ``message`` breaks a quota."""
    total = 0
    for field, name, size in _properties(message):
        if size > MAX_PROPERTY_SIZE:
            what = f"application property {name!r}" if field != name else name
            raise MessageSizeError(
                f"message {message.message_id!r}: {what} is {size} bytes (name and value), "
                f"over the {MAX_PROPERTY_SIZE}-byte limit for one property of entity {entity!r}",
                field=field,
            )
        total += size
    if total > MAX_PROPERTIES_SIZE:
        raise MessageSizeError(
            f"message {message.message_id!r}: its properties take {total} bytes together, "
            f"over the {MAX_PROPERTIES_SIZE}-byte limit for all properties of entity {entity!r}",
            field="application_properties",
        )
