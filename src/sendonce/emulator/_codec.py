"""AMQP message bytes as the emulator keeps them: split, unbatch, read, re-stamp.

The emulator stores each message's encoded bytes unchanged and delivers them
back as they came, so every property the client set survives the round trip.
Only the sections the broker owns (header delivery count, message
annotations) are rebuilt on delivery. Bodies are never decoded and re-encoded.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from proton import Data, Described, Message, symbol, timestamp, ulong

from .._message import Message as SendOnceMessage

__all__ = [
    "ANNOTATIONS",
    "APPLICATION_PROPERTIES",
    "DATA",
    "HEADER",
    "PROPERTIES",
    "Section",
    "body_bytes",
    "encode_fields",
    "is_batch",
    "restamp",
    "split_sections",
    "to_message",
    "unbatch",
]

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
SEQUENCE = 0x76
VALUE = 0x77
FOOTER = 0x78

_SYMBOLIC = {
    b"amqp:header:list": HEADER,
    b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": ANNOTATIONS,
    b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES,
    b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": SEQUENCE,
    b"amqp:amqp-value:*": VALUE,
    b"amqp:footer:map": FOOTER,
}

PARTITION_KEY = symbol("x-opt-partition-key")
SCHEDULED_TIME = symbol("x-opt-scheduled-enqueue-time")
SEQUENCE_NUMBER = symbol("x-opt-sequence-number")
ENQUEUED_TIME = symbol("x-opt-enqueued-time")
LOCKED_UNTIL = symbol("x-opt-locked-until")
LOCK_TOKEN = symbol("x-opt-lock-token")


class CodecError(ValueError):
    """The bytes are not a well-formed AMQP message."""


@dataclass(frozen=True, slots=True)
class Section:
    """One top-level section of an encoded message: its code and byte span."""

    code: int
    start: int
    value_start: int
    end: int


def _skip(buf: bytes, pos: int) -> int:
    """The offset just past the AMQP value that starts at ``pos``."""
    if pos >= len(buf):
        raise CodecError("truncated value")
    ctor = buf[pos]
    pos += 1
    if ctor == 0x00:  # described: descriptor, then value
        return _skip(buf, _skip(buf, pos))
    width = ctor >> 4
    if width == 0x4:
        end = pos
    elif width == 0x5:
        end = pos + 1
    elif width == 0x6:
        end = pos + 2
    elif width == 0x7:
        end = pos + 4
    elif width == 0x8:
        end = pos + 8
    elif width == 0x9:
        end = pos + 16
    elif width in (0xA, 0xC, 0xE):
        if pos >= len(buf):
            raise CodecError("truncated size")
        end = pos + 1 + buf[pos]
    elif width in (0xB, 0xD, 0xF):
        if pos + 4 > len(buf):
            raise CodecError("truncated size")
        end = pos + 4 + struct.unpack_from(">I", buf, pos)[0]
    else:
        raise CodecError(f"unknown constructor 0x{ctor:02x}")
    if end > len(buf):
        raise CodecError("truncated value")
    return end


def _descriptor(buf: bytes, pos: int) -> tuple[int, int]:
    """The section code of the descriptor at ``pos`` and the offset after it."""
    ctor = buf[pos]
    if ctor == 0x53:
        return buf[pos + 1], pos + 2
    if ctor == 0x80:
        return struct.unpack_from(">Q", buf, pos + 1)[0], pos + 9
    if ctor in (0xA3, 0xB3):
        end = _skip(buf, pos)
        head = 2 if ctor == 0xA3 else 5
        return _SYMBOLIC.get(bytes(buf[pos + head : end]), -1), end
    raise CodecError(f"unexpected descriptor constructor 0x{ctor:02x}")


def split_sections(payload: bytes) -> list[Section]:
    """Split an encoded message into its top-level sections."""
    sections: list[Section] = []
    pos = 0
    while pos < len(payload):
        if payload[pos] != 0x00:
            raise CodecError(f"section at offset {pos} is not a described type")
        code, value_start = _descriptor(payload, pos + 1)
        end = _skip(payload, value_start)
        sections.append(Section(code, pos, value_start, end))
        pos = end
    return sections


def _binary(buf: bytes, section: Section) -> bytes:
    ctor = buf[section.value_start]
    if ctor == 0xA0:
        return bytes(buf[section.value_start + 2 : section.end])
    if ctor == 0xB0:
        return bytes(buf[section.value_start + 5 : section.end])
    raise CodecError("data section does not hold a binary")


def is_batch(payload: bytes, sections: list[Section] | None = None) -> bool:
    """Whether ``payload`` is the client's batch wrapper (format 0x80013700).

    Proton does not expose the transfer's message format, so the wrapper is
    recognised by its shape: no body but data sections, and each data section
    itself a whole encoded message with a properties section (the client
    copies the first message's properties onto the wrapper). A single message
    whose body is exactly such encoded messages would be taken for a batch.
    """
    sections = split_sections(payload) if sections is None else sections
    data = [s for s in sections if s.code == DATA]
    if not data or any(s.code in (SEQUENCE, VALUE) for s in sections):
        return False
    for s in data:
        inner = _binary(payload, s)
        try:
            inner_sections = split_sections(inner)
        except (CodecError, IndexError, struct.error):
            return False
        if not any(x.code == PROPERTIES for x in inner_sections):
            return False
    return True


def unbatch(payload: bytes) -> list[bytes]:
    """The encoded messages a transfer carries: the inner messages of a batch, or itself."""
    sections = split_sections(payload)
    if is_batch(payload, sections):
        return [_binary(payload, s) for s in sections if s.code == DATA]
    return [bytes(payload)]


def _decode(buf: bytes, section: Section) -> Any:
    data = Data()
    data.decode(bytes(buf[section.start : section.end]))
    data.rewind()
    data.next()
    described = _get(data)
    return described.value if isinstance(described, Described) else described


def _get(data: Data) -> Any:
    """The value at the cursor, as proton's ``get_object`` but safe for binary map keys.

    Proton builds a dict keyed by a writable memoryview for a binary key, which
    cannot be hashed (a map body ``{b"k": ...}`` made every send fail).
    """
    kind = data.type()
    if kind == Data.MAP:
        result: dict[Any, Any] = {}
        if data.enter():
            try:
                while data.next():
                    key = _get(data)
                    result[key] = _get(data) if data.next() else None
            finally:
                data.exit()
        return result
    if kind == Data.LIST:
        items: list[Any] = []
        if data.enter():
            try:
                while data.next():
                    items.append(_get(data))
            finally:
                data.exit()
        return items
    if kind == Data.DESCRIBED:
        data.enter()
        try:
            data.next()
            descriptor = _get(data)
            data.next()
            value = _get(data)
        finally:
            data.exit()
        return Described(descriptor, value)
    return _copy(data.get_object())


def _copy(value: Any) -> Any:
    """A deep copy holding no buffer that proton may free (binary values dangle)."""
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, dict):
        return {_copy(k): _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _encode(code: int, value: Any) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), value))
    return bytes(data.encode())


def body_bytes(payload: bytes, sections: list[Section] | None = None) -> bytes:
    """The body as bytes: data sections joined; a str or binary value as is.

    Other bodies (sequences, maps) are returned as their encoded section bytes:
    the raw bytes still carry them exactly.
    """
    sections = split_sections(payload) if sections is None else sections
    data = [s for s in sections if s.code == DATA]
    if data:
        return b"".join(_binary(payload, s) for s in data)
    for s in sections:
        if s.code == VALUE:
            # Only a binary or string value is read; any other value stays encoded.
            ctor = payload[s.value_start]
            if ctor in (0xA0, 0xA1):
                return bytes(payload[s.value_start + 2 : s.end])
            if ctor in (0xB0, 0xB1):
                return bytes(payload[s.value_start + 5 : s.end])
            return bytes(payload[s.start : s.end])
        if s.code == SEQUENCE:
            return bytes(payload[s.start : s.end])
    return b""


def _to_datetime(ms: Any) -> datetime | None:
    if ms is None:
        return None
    if isinstance(ms, datetime):
        return ms if ms.tzinfo else ms.replace(tzinfo=UTC)
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=int(ms))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _property(value: Any) -> str | int | float | bool | bytes | None:
    if value is None or isinstance(value, str | int | float | bool | bytes):
        if isinstance(value, str):
            return str(value)  # drop proton's symbol/char subclasses
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        return value
    return str(value)


@dataclass(frozen=True, slots=True)
class Decoded:
    """What the store needs of one encoded message, plus the bytes themselves."""

    message: SendOnceMessage
    raw: bytes
    has_message_id: bool


def to_message(raw: bytes, *, default_id: str | None = None) -> Decoded:
    """The ``sendonce.Message`` view of an encoded message (the raw bytes stay the truth).

    A message without a message id gets ``default_id`` (or a random one): the
    emulator accepts it as Service Bus does, and duplicate detection cannot
    apply to it.
    """
    sections = split_sections(raw)
    props: list[Any] = []
    annotations: dict[Any, Any] = {}
    app: dict[Any, Any] = {}
    header: list[Any] = []
    for s in sections:
        if s.code == PROPERTIES:
            props = list(_decode(raw, s) or [])
        elif s.code == ANNOTATIONS:
            annotations = dict(_decode(raw, s) or {})
        elif s.code == APPLICATION_PROPERTIES:
            app = dict(_decode(raw, s) or {})
        elif s.code == HEADER:
            header = list(_decode(raw, s) or [])
    props += [None] * (13 - len(props))
    message_id = _text(props[0])
    has_id = bool(message_id)
    if not message_id:
        message_id = default_id or str(uuid.uuid4())
    ttl_ms = header[2] if len(header) > 2 else None
    keys = {str(k): v for k, v in annotations.items()}
    partition_key = _text(keys.get("x-opt-partition-key"))
    session_id = _text(props[10])
    if partition_key is not None and session_id is not None and partition_key != session_id:
        partition_key = session_id  # Service Bus rule: the session id is the partition key
    message = SendOnceMessage(
        body_bytes(raw, sections),
        message_id=message_id,
        partition_key=partition_key or None,
        session_id=session_id or None,
        scheduled_enqueue_time=_to_datetime(keys.get("x-opt-scheduled-enqueue-time")),
        subject=_text(props[3]),
        content_type=_text(props[6]),
        correlation_id=_text(props[5]),
        application_properties={str(k): _property(v) for k, v in app.items()} or None,
        time_to_live=timedelta(milliseconds=int(ttl_ms)) if ttl_ms else None,
    )
    return Decoded(message, _without_delivery_annotations(raw, sections), has_id)


def _without_delivery_annotations(raw: bytes, sections: list[Any]) -> bytes:
    """``raw`` minus its delivery-annotations section.

    AMQP 1.0 (section 3.2.2): delivery annotations carry information for one hop,
    the sender to the broker; they are not part of the bare message the broker
    stores and forwards, so receivers never see a sender's delivery annotations.
    """
    cut = [s for s in sections if s.code == DELIVERY_ANNOTATIONS]
    if not cut:
        return bytes(raw)
    out = bytearray()
    at = 0
    for s in cut:
        out += raw[at : s.start]
        at = s.end
    out += raw[at:]
    return bytes(out)


def encode_fields(
    *,
    message_id: str,
    body: bytes,
    subject: str | None = None,
    content_type: str | None = None,
    correlation_id: str | None = None,
    session_id: str | None = None,
    application_properties: Mapping[str, Any] | None = None,
    time_to_live: timedelta | None = None,
) -> bytes:
    """Encode a message that arrived without raw bytes (sent through ``local://``)."""
    m = Message()
    m.id = message_id
    m.body = bytes(body)
    m.inferred = True  # a binary body goes in a data section, as the client expects
    if subject is not None:
        m.subject = subject
    if content_type is not None:
        m.content_type = content_type
    if correlation_id is not None:
        m.correlation_id = correlation_id
    if session_id is not None:
        m.group_id = session_id
    if application_properties:
        m.properties = dict(application_properties)  # type: ignore[assignment]
    if time_to_live is not None:
        m.ttl = time_to_live.total_seconds()
    return bytes(m.encode())


def with_application_properties(raw: bytes, extra: Mapping[str, Any]) -> bytes:
    """``raw`` with ``extra`` merged into its application properties (other sections kept)."""
    merged: dict[Any, Any] = {}
    head = bytearray()
    tail = bytearray()
    for s in split_sections(raw):
        if s.code == APPLICATION_PROPERTIES:
            merged = dict(_decode(raw, s) or {})
        elif s.code in (DATA, SEQUENCE, VALUE, FOOTER) or tail:
            tail += raw[s.start : s.end]
        else:
            head += raw[s.start : s.end]
    merged.update(extra)
    return bytes(head) + _encode(APPLICATION_PROPERTIES, merged) + bytes(tail)


def _ms(when: datetime) -> timestamp:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return timestamp(int(when.timestamp() * 1000))


def _items(buf: bytes, pos: int) -> list[tuple[int, int]]:
    """The byte spans of the elements of the list or map at ``pos``."""
    ctor = buf[pos]
    if ctor == 0x45:
        return []
    small = ctor in (0xC0, 0xC1)
    count_at = pos + (2 if small else 5)
    count = buf[count_at] if small else struct.unpack_from(">I", buf, count_at)[0]
    cursor = count_at + (1 if small else 4)
    end = _skip(buf, pos)
    spans: list[tuple[int, int]] = []
    for _ in range(count):
        nxt = _skip(buf, cursor)
        spans.append((cursor, nxt))
        cursor = nxt
    if cursor != end:
        raise CodecError("compound size does not match its elements")
    return spans


def _compound(ctor32: int, chunks: list[bytes]) -> bytes:
    """A list (0xD0) or map (0xD1) of already-encoded elements, in 32-bit form."""
    payload = b"".join(chunks)
    return bytes([ctor32]) + struct.pack(">II", len(payload) + 4, len(chunks)) + payload


def _key(buf: bytes, start: int, end: int) -> str | bytes:
    """A map key as text when it is a symbol or string, else its encoded bytes."""
    ctor = buf[start]
    if ctor in (0xA1, 0xA3):
        return bytes(buf[start + 2 : end]).decode("utf-8", "replace")
    if ctor in (0xB1, 0xB3):
        return bytes(buf[start + 5 : end]).decode("utf-8", "replace")
    return bytes(buf[start:end])


def _symbol(name: str) -> bytes:
    data = name.encode("ascii")
    return bytes([0xA3, len(data)]) + data


def _annotation(value: Any) -> bytes:
    """One broker-owned annotation value, encoded as Service Bus sends it."""
    if isinstance(value, datetime):
        ms = int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp() * 1000)
        return b"\x83" + struct.pack(">q", ms)
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, int):
        return b"\x81" + struct.pack(">q", value)
    data = str(value).encode("utf-8")
    return (
        b"\xa1" + bytes([len(data)]) if len(data) < 256 else b"\xb1" + struct.pack(">I", len(data))
    ) + data


_MAX_UINT = 0xFFFFFFFF
# Positions in the properties list (AMQP 1.0, section 3.2.4).
_ABSOLUTE_EXPIRY_TIME = 8
_CREATION_TIME = 9
_OWNED = frozenset(
    {"x-opt-sequence-number", "x-opt-enqueued-time", "x-opt-locked-until", "x-opt-lock-token"}
)


def restamp(
    raw: bytes,
    *,
    sequence_number: int,
    enqueued_time: datetime | None,
    locked_until: datetime | None = None,
    lock_token: str | None = None,
    partition_key: str | None = None,
    delivery_count: int | None = None,
    time_to_live: timedelta | None = None,
    extra_annotations: Mapping[str, Any] | None = None,
) -> bytes:
    """``raw`` with the broker-owned annotations and header fields replaced.

    The header's delivery count, and its time to live when ``time_to_live`` is given (the
    one the message has on its entity: the entity's default when it came without one).

    Everything else is copied byte for byte: every other section, every other
    header field, and each of the sender's own message annotations (key and
    value bytes), so any AMQP type the sender used comes back unchanged. The
    sender's delivery annotations are dropped: they were for the hop to the
    broker (AMQP 1.0, section 3.2.2), and messages stored before the broker
    dropped them on arrival may still hold them.
    """
    sections = split_sections(raw)
    header: list[bytes] | None = None
    entries: list[tuple[Any, bytes, bytes]] = []
    rest: list[bytes] = []
    ttl_ms = None if time_to_live is None else time_to_live // timedelta(milliseconds=1)
    if ttl_ms is not None and not 0 < ttl_ms <= _MAX_UINT:
        ttl_ms = None  # the header's uint cannot carry it: the sender's header stays
    for s in sections:
        if s.code == PROPERTIES and ttl_ms is not None:
            rest.append(_with_expiry(raw, s, ttl_ms))
        elif s.code == HEADER:
            header = [bytes(raw[a:b]) for a, b in _items(raw, s.value_start)]
        elif s.code == DELIVERY_ANNOTATIONS:
            continue  # per hop: not forwarded
        elif s.code == ANNOTATIONS:
            spans = _items(raw, s.value_start)
            for (ka, kb), (va, vb) in zip(spans[::2], spans[1::2], strict=True):
                key = _key(raw, ka, kb)
                entries.append((key, bytes(raw[ka:kb]), bytes(raw[va:vb])))
        else:
            rest.append(bytes(raw[s.start : s.end]))
    owned: dict[str, Any] = {"x-opt-sequence-number": int(sequence_number)}
    if enqueued_time is not None:
        owned["x-opt-enqueued-time"] = enqueued_time
    if locked_until is not None:
        owned["x-opt-locked-until"] = locked_until
    if lock_token is not None:
        owned["x-opt-lock-token"] = uuid.UUID(lock_token) if _is_uuid(lock_token) else lock_token
    if partition_key is not None and not any(k == "x-opt-partition-key" for k, _, _ in entries):
        owned["x-opt-partition-key"] = partition_key
    owned.update(extra_annotations or {})
    replaced = _OWNED | set(owned)
    chunks: list[bytes] = []
    for key, key_bytes, value_bytes in entries:
        if not (isinstance(key, str) and key in replaced):
            chunks += [key_bytes, value_bytes]
    for name, value in owned.items():
        chunks += [_symbol(name), _annotation(value)]
    out = bytearray()
    if header is not None or delivery_count is not None or ttl_ms is not None:
        fields = list(header or [])
        if ttl_ms is not None:
            fields += [b"\x40"] * (3 - len(fields))
            fields[2] = b"\x70" + struct.pack(">I", ttl_ms)
        if delivery_count is not None:
            fields += [b"\x40"] * (5 - len(fields))
            fields[4] = b"\x70" + struct.pack(">I", max(0, delivery_count))
        out += b"\x00\x53\x70" + _compound(0xD0, fields)
    out += b"\x00\x53\x72" + _compound(0xD1, chunks)
    for chunk in rest:
        out += chunk
    return bytes(out)


def _with_expiry(raw: bytes, section: Section, ttl_ms: int) -> bytes:
    """The properties section with absolute-expiry-time = creation-time + ``ttl_ms``.

    Clients that set both (the JavaScript one does, with a time to live) read the time to
    live back as their difference, so it must tell the one the message has on its entity.
    A section without both timestamps is kept as it is.
    """
    items = _items(raw, section.value_start)
    if len(items) <= _CREATION_TIME or any(
        raw[items[i][0]] != 0x83 for i in (_ABSOLUTE_EXPIRY_TIME, _CREATION_TIME)
    ):
        return bytes(raw[section.start : section.end])
    created = struct.unpack_from(">q", raw, items[_CREATION_TIME][0] + 1)[0]
    fields = [bytes(raw[a:b]) for a, b in items]
    fields[_ABSOLUTE_EXPIRY_TIME] = b"\x83" + struct.pack(">q", created + ttl_ms)
    return b"\x00\x53\x73" + _compound(0xD0, fields)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def lock_token_tag(lock_token: str) -> bytes:
    """The 16-byte delivery tag the client reads as a lock token (``UUID(bytes_le=tag)``)."""
    try:
        return uuid.UUID(lock_token).bytes_le
    except ValueError:
        return uuid.uuid5(uuid.NAMESPACE_URL, lock_token).bytes_le


def _binary_at(buf: bytes, pos: int) -> bytes:
    ctor = buf[pos]
    if ctor == 0xA0:
        return bytes(buf[pos + 2 : _skip(buf, pos)])
    if ctor == 0xB0:
        return bytes(buf[pos + 5 : _skip(buf, pos)])
    raise CodecError("expected a binary value")


def _map_value(buf: bytes, pos: int, key: str) -> int | None:
    """Where the value of ``key`` starts in the map at ``pos`` (None when absent)."""
    if buf[pos] not in (0xC1, 0xD1):
        raise CodecError("expected a map")
    spans = _items(buf, pos)
    for (k_start, k_end), (v_start, _) in zip(spans[::2], spans[1::2], strict=True):
        if _key(buf, k_start, k_end) == key:
            return v_start
    return None


def scheduled_messages(payload: bytes) -> list[bytes]:
    """The encoded messages of a ``schedule-message`` request, read straight from its bytes.

    Proton's ``Data`` holds at most 65,535 nodes: a request with 20,000 messages
    decoded truncated (one entry cut short, "'message'" missing).
    """
    value = next((s for s in split_sections(payload) if s.code == VALUE), None)
    if value is None:
        raise CodecError("the request has no amqp-value body")
    at = _map_value(payload, value.value_start, "messages")
    if at is None:
        return []
    if payload[at] not in (0x45, 0xC0, 0xD0):
        raise CodecError("'messages' is not a list")
    encoded = []
    for start, _ in _items(payload, at):
        message_at = _map_value(payload, start, "message")
        if message_at is None:
            raise CodecError("a scheduled entry has no 'message'")
        encoded.append(_binary_at(payload, message_at))
    return encoded
