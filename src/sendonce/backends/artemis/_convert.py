"""A :class:`sendonce.Message` as the AMQP 1.0 message Artemis receives.

- ``_AMQ_DUPL_ID`` (application property, a **string**: the same text as binary is another
  id) and the AMQP ``message-id`` both carry the business id;
- ``durable`` is set: Artemis keeps a non-durable message in memory only, so a broker
  restart would lose an acknowledged message;
- ``session_id`` becomes the AMQP ``group-id`` (an Artemis message group: one consumer at a
  time per group, in order); ``partition_key`` is not sent: Artemis has no partitions, the
  sender only keeps its transfers in order per key;
- a ``bytes`` body is one Data section (a JMS ``BytesMessage``), a ``str`` body an
  AmqpValue string (a ``TextMessage``);
- a scheduled time is the ``x-opt-delivery-time`` annotation (milliseconds since the epoch).

Messages are encoded in the caller's thread, before anything is handed to the event loop:
a message proton cannot encode is refused with nothing sent. The common message (a ``str`` or
``bytes`` body, string application properties, nothing else) is written here directly, the
same bytes proton writes (a unit test compares them), at a tenth of the cost of building a
proton ``Message`` per delivery; any other goes through proton.
"""

from __future__ import annotations

from datetime import datetime

from proton import Message as ProtonMessage
from proton import symbol

from ..._message import Message
from ...errors import ValidationError

__all__ = ["DUPLICATE_ID_PROPERTY", "encode"]

DUPLICATE_ID_PROPERTY = "_AMQ_DUPL_ID"
_DELIVERY_TIME = symbol("x-opt-delivery-time")


def encode(message: Message, *, at: datetime | None = None) -> bytes:
    """The wire bytes of ``message`` (``at`` overrides its scheduled time)."""
    if at is None:
        plain = _plain(message)
        if plain is not None:
            return plain
    props: dict[str, object] = {}
    if message.application_properties:
        props.update(message.application_properties)
        given = props.get(DUPLICATE_ID_PROPERTY)
        if given is not None and given != message.message_id:
            raise ValidationError(
                f"message {message.message_id!r}: application property {DUPLICATE_ID_PROPERTY} "
                f"is {given!r}; sendonce sets it to the message id (a different value would "
                "make Artemis compare another id). Nothing was sent.",
                field="application_properties",
            )
    props[DUPLICATE_ID_PROPERTY] = message.message_id
    body = message.body
    converted = ProtonMessage(
        body=body,
        inferred=isinstance(body, bytes),  # bytes: a Data section, not an AmqpValue binary
        id=message.message_id,
        durable=True,
        properties=props,
    )
    if message.session_id is not None:
        converted.group_id = message.session_id
    if message.subject is not None:
        converted.subject = message.subject
    if message.content_type is not None:
        converted.content_type = symbol(message.content_type)
    if message.correlation_id is not None:
        converted.correlation_id = message.correlation_id
    if message.time_to_live is not None:
        converted.ttl = message.time_to_live.total_seconds()
    when = at or message.scheduled_enqueue_time
    if when is not None:
        converted.annotations = {_DELIVERY_TIME: int(when.timestamp() * 1000)}
    try:
        return bytes(converted.encode())
    except Exception as exc:  # proton's EncodeException, or a type it cannot put
        raise ValidationError(
            f"message {message.message_id!r} cannot be encoded as AMQP: {exc}; nothing was sent",
            field="message",
        ) from None


# AMQP 1.0 sections as proton writes them: a durable header; properties with the message id;
# application properties as a map32; the body as an AmqpValue string or one Data section.
_HEADER_PROPERTIES = b"\x00Sp\xc0\x02\x01A\x00Ss"
_APPLICATION_PROPERTIES = b"\x00St\xd1"
_DUPLICATE_KEY = b"\xa1\x0c_AMQ_DUPL_ID"
_AMQP_VALUE = b"\x00Sw"
_DATA = b"\x00Su"


def _plain(message: Message) -> bytes | None:
    """``message``'s bytes when it has only an id, a ``str``/``bytes`` body and string
    application properties; None for anything else (proton encodes it)."""
    if (
        message.session_id is not None
        or message.scheduled_enqueue_time is not None
        or message.subject is not None
        or message.content_type is not None
        or message.correlation_id is not None
        or message.time_to_live is not None
    ):
        return None
    body = message.body
    kind = type(body)
    if kind is not str and kind is not bytes:
        return None
    message_id = message.message_id
    if type(message_id) is not str:
        return None
    wire_id = _string(message_id.encode())
    entries = [_DUPLICATE_KEY + wire_id]
    given = message.application_properties
    if given:
        entries = []
        placed = False
        for key, value in given.items():
            if type(key) is not str or type(value) is not str:
                return None
            if key == DUPLICATE_ID_PROPERTY:
                if value != message_id:
                    return None  # refused by the general path, with its message
                entries.append(_DUPLICATE_KEY + wire_id)
                placed = True
            else:
                entries.append(_string(key.encode()) + _string(value.encode()))
        if not placed:
            entries.append(_DUPLICATE_KEY + wire_id)
    count = len(entries) * 2
    application = b"".join(entries)
    if kind is str:
        section = _AMQP_VALUE + _string(body.encode())  # type: ignore[union-attr]
    else:
        size = len(body)
        section = _DATA + (
            b"\xa0" + bytes((size,)) if size < 256 else b"\xb0" + size.to_bytes(4, "big")
        )
        section += body  # type: ignore[operator]
    return b"".join(
        (
            _HEADER_PROPERTIES,
            _list_of_one(wire_id),
            _APPLICATION_PROPERTIES,
            (len(application) + 4).to_bytes(4, "big"),
            count.to_bytes(4, "big"),
            application,
            section,
        )
    )


def _string(data: bytes) -> bytes:
    """An AMQP string (str8, or str32 past 255 bytes) of UTF-8 ``data``."""
    size = len(data)
    if size < 256:
        return b"\xa1" + bytes((size,)) + data
    return b"\xb1" + size.to_bytes(4, "big") + data


def _list_of_one(element: bytes) -> bytes:
    """An AMQP list holding ``element`` (list8, or list32 when it does not fit)."""
    if len(element) < 255:
        return b"\xc0" + bytes((len(element) + 1, 1)) + element
    return b"\xd0" + (len(element) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + element
