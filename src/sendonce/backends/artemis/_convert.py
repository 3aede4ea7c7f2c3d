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
a message proton cannot encode is refused with nothing sent.
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
