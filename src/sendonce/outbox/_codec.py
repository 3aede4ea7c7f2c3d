"""A ``Message`` as an outbox row and back: every field kept, the body byte for byte.

Application properties are stored as JSON text with a type tag per value, so an ``int``
stays an ``int``, ``bytes`` stay ``bytes`` (base64) and a float keeps its exact value
(``repr``), whatever the JSON reader would make of them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .._message import Message, MessageFactory, PropertyValue
from ..errors import ConfigurationError

__all__ = [
    "COLUMNS",
    "MessageDecoder",
    "decode_properties",
    "encode_properties",
    "message_of",
    "order_key",
]

COLUMNS = (
    "message_id",
    "body",
    "body_is_text",
    "partition_key",
    "session_id",
    "subject",
    "content_type",
    "correlation_id",
    "properties",
    "time_to_live_us",
)
"""The message's columns, in the order ``message_of`` reads them."""


def order_key(message: Message) -> str | None:
    """The key messages are published in commit order by: the session id, else the
    partition key (equal when both are set); None: no order is promised."""
    return message.session_id if message.session_id is not None else message.partition_key


def _tagged(value: PropertyValue) -> list[Any]:
    if value is None:
        return ["n", None]
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", str(value)]
    if isinstance(value, float):
        return ["f", repr(value)]
    if isinstance(value, bytes):
        return ["y", base64.b64encode(value).decode("ascii")]
    return ["s", value]


def _untagged(tag: str, value: Any) -> PropertyValue:
    if tag == "n":
        return None
    if tag == "b":
        return bool(value)
    if tag == "i":
        return int(value)
    if tag == "f":
        return float(value)
    if tag == "y":
        return base64.b64decode(value)
    if tag == "s":
        return str(value)
    raise ConfigurationError(f"outbox row: unknown property type tag {tag!r}", field="properties")


def encode_properties(props: Mapping[str, PropertyValue] | None) -> str | None:
    if props is None:
        return None
    return json.dumps([[name, *_tagged(value)] for name, value in props.items()])


def decode_properties(text: str | None) -> dict[str, PropertyValue] | None:
    if text is None:
        return None
    return {name: _untagged(tag, value) for name, tag, value in json.loads(text)}


def row_values(message: Message) -> tuple[Any, ...]:
    """The message's column values, in ``COLUMNS`` order."""
    ttl = message.time_to_live
    return (
        message.message_id,
        message.body_bytes,
        isinstance(message.body, str),
        message.partition_key,
        message.session_id,
        message.subject,
        message.content_type,
        message.correlation_id,
        encode_properties(message.application_properties),
        None if ttl is None else ttl // timedelta(microseconds=1),
    )


def message_of(values: tuple[Any, ...] | list[Any]) -> Message:
    """The message a row holds (its ``COLUMNS`` values, in order)."""
    mid, body, is_text, pk, sid, subject, ctype, corr, props, ttl_us = values
    data = bytes(body)
    return Message(
        data.decode("utf-8") if is_text else data,
        message_id=mid,
        partition_key=pk,
        session_id=sid,
        subject=subject,
        content_type=ctype,
        correlation_id=corr,
        application_properties=decode_properties(props),
        time_to_live=None if ttl_us is None else timedelta(microseconds=ttl_us),
    )


class MessageDecoder:
    """``message_of`` for many rows, at a fraction of its cost per row.

    A relay turns thousands of rows into messages per round; checking each one as
    ``Message()`` does cost ~60 µs a row, a third of what the local broker spends storing it.
    Rows read back what ``enqueue`` wrote from valid messages, and most share their subject,
    content type and properties: those go through one :class:`MessageFactory` per such shape
    (its shared fields checked once; each message's id, keys and body still checked by the
    factory, which hands anything unusual to ``Message()``). Rows with a correlation id or a
    time to live, which a factory does not set, take ``message_of``. Equal messages either way.
    """

    __slots__ = ("_factories",)
    _MAX_SHAPES = 256

    def __init__(self) -> None:
        self._factories: dict[tuple[str | None, str | None, str | None], MessageFactory] = {}

    def __call__(
        self,
        mid: str,
        body: bytes,
        is_text: bool,
        pk: str | None,
        sid: str | None,
        subject: str | None,
        ctype: str | None,
        corr: str | None,
        props: str | None,
        ttl_us: int | None,
    ) -> Message:
        if corr is not None or ttl_us is not None:
            return message_of((mid, body, is_text, pk, sid, subject, ctype, corr, props, ttl_us))
        shape = (subject, ctype, props)
        factory = self._factories.get(shape)
        if factory is None:
            if len(self._factories) >= self._MAX_SHAPES:
                self._factories.clear()
            factory = MessageFactory(
                subject=subject,
                content_type=ctype,
                application_properties=decode_properties(props),
            )
            self._factories[shape] = factory
        data = body if type(body) is bytes else bytes(body)
        return factory(data.decode("utf-8") if is_text else data, mid, pk, sid)
