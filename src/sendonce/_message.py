"""Messages as immutable values, and specs that turn records into messages."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any
from uuid import UUID

from ._ids import MAX_ID_LENGTH, MessageIdTemplate, fields_of, template_of
from .errors import KeyRuleError, MessageIdError, ValidationError

__all__ = ["Message", "MessageSpec", "PropertyValue"]

PropertyValue = str | int | float | bool | bytes | None
_PROPERTY_TYPES = (str, int, float, bool, bytes, type(None))


def _valid_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Brokers and their stores treat NUL as a string terminator in places (SQLite's JSON
# functions cut text there), so "order\x00A" and "order" could share a dedup key.
_NUL_WHY = "ids and keys with NUL are cut short by brokers and would collide"


def _check_key(value: object, name: str) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise KeyRuleError(f"{name} must be a str, got {type(value).__name__}", field=name)
    if not value.isascii() and not _valid_text(value):
        raise KeyRuleError(f"{name} contains a lone surrogate (not valid Unicode)", field=name)
    if not value:
        raise KeyRuleError(f"{name} must not be empty (use None for no {name})", field=name)
    if len(value) > MAX_ID_LENGTH:
        raise KeyRuleError(
            f"{name} {value[:40]!r}... is {len(value)} characters, over {MAX_ID_LENGTH}", field=name
        )
    if "\x00" in value:
        raise KeyRuleError(f"{name} {value!r} contains a NUL character ({_NUL_WHY})", field=name)


@dataclass(frozen=True, slots=True, eq=True)
class Message:
    """One message to send, with an explicit deterministic id. Immutable and picklable.

    Construction checks everything that needs no knowledge of the entity: a
    non-empty ``message_id`` of at most 128 characters, key lengths, and that
    ``partition_key`` equals ``session_id`` when both are set.
    """

    body: bytes | str
    message_id: str = field(kw_only=True)
    partition_key: str | None = field(default=None, kw_only=True)
    session_id: str | None = field(default=None, kw_only=True)
    scheduled_enqueue_time: datetime | None = field(default=None, kw_only=True)
    subject: str | None = field(default=None, kw_only=True)
    content_type: str | None = field(default=None, kw_only=True)
    correlation_id: str | None = field(default=None, kw_only=True)
    application_properties: Mapping[str, PropertyValue] | None = field(
        default=None, kw_only=True, compare=True, hash=False
    )
    time_to_live: timedelta | None = field(default=None, kw_only=True)
    _size: int = field(default=0, init=False, repr=False, compare=False)
    _body_hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.body, bytes | str):
            raise ValidationError(
                f"message {self.message_id!r}: body must be bytes or str, "
                f"got {type(self.body).__name__}",
                field="body",
            )
        if not isinstance(self.message_id, str):
            raise MessageIdError(
                f"message_id must be a str, got {type(self.message_id).__name__}",
                field="message_id",
            )
        if not self.message_id:
            raise MessageIdError(
                "message_id must not be empty: an empty id gets a random one from the client "
                "and defeats duplicate detection",
                field="message_id",
            )
        if len(self.message_id) > MAX_ID_LENGTH:
            raise MessageIdError(
                f"message_id {self.message_id[:40]!r}... is {len(self.message_id)} characters, "
                f"over {MAX_ID_LENGTH}",
                field="message_id",
            )
        if "\x00" in self.message_id:
            raise MessageIdError(
                f"message_id {self.message_id!r} contains a NUL character ({_NUL_WHY})",
                field="message_id",
            )
        if not self.message_id.isascii() and not _valid_text(self.message_id):
            raise MessageIdError(
                "message_id contains a lone surrogate (not valid Unicode)", field="message_id"
            )
        if isinstance(self.body, str) and not self.body.isascii() and not _valid_text(self.body):
            raise ValidationError(
                f"message {self.message_id!r}: body contains a lone surrogate (not valid Unicode)",
                field="body",
            )
        _check_key(self.partition_key, "partition_key")
        _check_key(self.session_id, "session_id")
        if (
            self.partition_key is not None
            and self.session_id is not None
            and self.partition_key != self.session_id
        ):
            raise KeyRuleError(
                f"message {self.message_id!r}: partition_key {self.partition_key!r} must equal "
                f"session_id {self.session_id!r}",
                field="partition_key",
            )
        for name in ("subject", "content_type", "correlation_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValidationError(
                    f"message {self.message_id!r}: {name} must be a str", field=name
                )
        when = self.scheduled_enqueue_time
        if when is not None and (not isinstance(when, datetime) or when.tzinfo is None):
            raise ValidationError(
                f"message {self.message_id!r}: scheduled_enqueue_time must be a timezone-aware "
                "datetime",
                field="scheduled_enqueue_time",
            )
        ttl = self.time_to_live
        if ttl is not None and (not isinstance(ttl, timedelta) or ttl <= timedelta(0)):
            raise ValidationError(
                f"message {self.message_id!r}: time_to_live must be a positive timedelta",
                field="time_to_live",
            )
        props = self.application_properties
        if props is not None:
            if not isinstance(props, Mapping):
                raise ValidationError(
                    f"message {self.message_id!r}: application_properties must be a mapping",
                    field="application_properties",
                )
            for k, v in props.items():
                if not isinstance(k, str) or not isinstance(v, _PROPERTY_TYPES):
                    raise ValidationError(
                        f"message {self.message_id!r}: application property {k!r} must map a "
                        f"str to str/int/float/bool/bytes/None, got {type(v).__name__}",
                        field="application_properties",
                    )
            object.__setattr__(self, "application_properties", MappingProxyType(dict(props)))
        data = self.body if isinstance(self.body, bytes) else self.body.encode("utf-8")
        object.__setattr__(self, "_size", self._measure(len(data)))
        # Per-process hash of the payload, for payload-conflict checks; recomputed on unpickle.
        object.__setattr__(self, "_body_hash", hash(data))

    @property
    def body_bytes(self) -> bytes:
        """The body as bytes (UTF-8 for a str body)."""
        return self.body.encode("utf-8") if isinstance(self.body, str) else self.body

    @property
    def size(self) -> int:
        """Approximate encoded size: body plus ids and properties, as brokers count it."""
        return self._size

    def _measure(self, body_length: int) -> int:
        size = body_length + len(self.message_id)
        for extra in (
            self.partition_key,
            self.session_id,
            self.subject,
            self.content_type,
            self.correlation_id,
        ):
            if extra:
                size += len(extra)
        if self.application_properties:
            for k, v in self.application_properties.items():
                size += len(k) + (len(v) if isinstance(v, str | bytes) else 8)
        return size

    def __reduce__(self) -> tuple[Any, ...]:
        props = None if self.application_properties is None else dict(self.application_properties)
        return (
            _rebuild_message,
            (
                self.body,
                self.message_id,
                self.partition_key,
                self.session_id,
                self.scheduled_enqueue_time,
                self.subject,
                self.content_type,
                self.correlation_id,
                props,
                self.time_to_live,
            ),
        )

    def __hash__(self) -> int:
        return hash((self.message_id, self.partition_key, self.body))


class MessageFactory:
    """Builds many messages that share ``subject``, ``content_type`` and properties, fast.

    A frozen dataclass spends most of its construction in ``__init__`` and
    ``__post_init__``; Spark tasks build a million messages. The shared fields
    are checked once here. A message whose id, keys and body are plain (an
    ASCII id or key of 1-128 characters without NUL, a ``bytes`` body or an
    ASCII ``str`` body) is assembled directly -- every check ``Message()``
    would make on it passes by construction; anything else goes through
    ``Message()``, which raises the usual error. Both give equal messages.
    """

    __slots__ = ("_constant", "_content_type", "_fixed_size", "_props", "_subject")

    def __init__(
        self,
        *,
        subject: str | None = None,
        content_type: str | None = None,
        application_properties: Mapping[str, PropertyValue] | None = None,
    ) -> None:
        probe = Message(
            b"",
            message_id="x",
            subject=subject,
            content_type=content_type,
            application_properties=application_properties,
        )  # checks the shared fields once (raises ValidationError like Message())
        self._subject = subject
        self._content_type = content_type
        self._props = probe.application_properties
        self._fixed_size = probe.size - 1  # what the shared fields add to every size
        self._constant = application_properties

    @property
    def fixed_size(self) -> int:
        """What the shared fields add to every message's size (``Message.size``)."""
        return self._fixed_size

    def __call__(
        self,
        body: bytes | str,
        message_id: str,
        partition_key: str | None = None,
        session_id: str | None = None,
    ) -> Message:
        if (
            type(message_id) is str
            and 0 < len(message_id) <= MAX_ID_LENGTH
            and message_id.isascii()
            and "\x00" not in message_id
            and (partition_key is None or _plain_key(partition_key))
            and (session_id is None or _plain_key(session_id))
            and (partition_key is None or session_id is None or partition_key == session_id)
        ):
            data: bytes | None = None
            if type(body) is bytes:
                data = body
            elif type(body) is str and body.isascii():
                data = body.encode("ascii")
            if data is not None:
                size = len(data) + len(message_id) + self._fixed_size
                if partition_key:
                    size += len(partition_key)
                if session_id:
                    size += len(session_id)
                message = _new(Message)
                _SET_BODY(message, body)
                _SET_ID(message, message_id)
                _SET_PK(message, partition_key)
                _SET_SID(message, session_id)
                _SET_WHEN(message, None)
                _SET_SUBJECT(message, self._subject)
                _SET_CONTENT_TYPE(message, self._content_type)
                _SET_CORRELATION(message, None)
                _SET_PROPS(message, self._props)
                _SET_TTL(message, None)
                _SET_SIZE(message, size)
                _SET_HASH(message, hash(data))
                return message
        return Message(
            body,
            message_id=message_id,
            partition_key=partition_key,
            session_id=session_id,
            subject=self._subject,
            content_type=self._content_type,
            application_properties=self._constant,
        )


def _plain_key(value: object) -> bool:
    return (
        type(value) is str
        and 0 < len(value) <= MAX_ID_LENGTH
        and value.isascii()
        and "\x00" not in value
    )


_new = object.__new__
(
    _SET_BODY,
    _SET_ID,
    _SET_PK,
    _SET_SID,
    _SET_WHEN,
    _SET_SUBJECT,
    _SET_CONTENT_TYPE,
    _SET_CORRELATION,
    _SET_PROPS,
    _SET_TTL,
    _SET_SIZE,
    _SET_HASH,
) = (
    getattr(Message, name).__set__
    for name in (
        "body",
        "message_id",
        "partition_key",
        "session_id",
        "scheduled_enqueue_time",
        "subject",
        "content_type",
        "correlation_id",
        "application_properties",
        "time_to_live",
        "_size",
        "_body_hash",
    )
)


_FIELDS = tuple(f for f in Message.__slots__ if f != "__weakref__")


def with_properties(message: Message, extra: Mapping[str, str]) -> Message:
    """A copy of ``message`` that also carries the text properties ``extra`` (trace context).

    The id, keys and body are the same objects, so the payload and duplicate-detection
    checks see the same message; only its properties and size grow. ``extra`` must not
    name a property the message already has (the caller checks).
    """
    copy = _new(Message)
    for name in _FIELDS:
        object.__setattr__(copy, name, getattr(message, name))
    props = dict(message.application_properties or ())
    props.update(extra)
    _SET_PROPS(copy, MappingProxyType(props))
    _SET_SIZE(copy, message._size + sum(len(k) + len(v) for k, v in extra.items()))
    return copy


def _rebuild_message(*args: Any) -> Message:
    (
        body,
        message_id,
        partition_key,
        session_id,
        when,
        subject,
        content_type,
        correlation_id,
        props,
        ttl,
    ) = args
    return Message(
        body,
        message_id=message_id,
        partition_key=partition_key,
        session_id=session_id,
        scheduled_enqueue_time=when,
        subject=subject,
        content_type=content_type,
        correlation_id=correlation_id,
        application_properties=props,
        time_to_live=ttl,
    )


def _json_default(value: object) -> object:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if hasattr(value, "asDict"):  # a nested Spark Row
        return value.asDict(recursive=True)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_JSON = json.JSONEncoder(
    sort_keys=True,
    separators=(",", ":"),
    ensure_ascii=False,
    allow_nan=False,  # NaN/Infinity are not JSON: strict consumers reject the body
    default=_json_default,
)


def canonical_json(record: Any) -> bytes:
    """Canonical JSON of a whole record: sorted keys, compact, UTF-8."""
    if hasattr(record, "asDict"):
        record = record.asDict(recursive=True)
    return _JSON.encode(record).encode("utf-8")


def _build_key(template: MessageIdTemplate | None, record: Any, name: str) -> str | None:
    """Build a partition key or session id, reporting failures under the key's own name."""
    if template is None:
        return None
    try:
        return template.build(record)
    except MessageIdError as exc:
        if exc.field not in ("message_id", "template"):
            raise  # a missing or bad record field: the field is named already
        raise KeyRuleError(f"{name}: {exc}", field=name) from None


BodySource = str | Callable[[Any], bytes | str] | None


class MessageSpec:
    """How a record becomes a :class:`Message`. Picklable, so Spark can ship it.

    ``message_id``, ``partition_key`` and ``session_id`` take a template string
    or a :class:`MessageIdTemplate`. ``body`` is a field name, a callable
    ``record -> bytes | str``, or ``None`` for canonical JSON of the whole record.

    An empty value (``""``) in a field of a template string is refused with
    :class:`MessageIdError` naming the field, as missing data; ``allow_empty=True``
    accepts it for the templates given as strings (a :class:`MessageIdTemplate`
    keeps its own setting).
    """

    __slots__ = (
        "application_properties",
        "body",
        "content_type",
        "message_id",
        "partition_key",
        "session_id",
        "subject",
    )

    def __init__(
        self,
        message_id: str | MessageIdTemplate,
        *,
        body: BodySource = None,
        partition_key: str | MessageIdTemplate | None = None,
        session_id: str | MessageIdTemplate | None = None,
        subject: str | None = None,
        content_type: str | None = None,
        application_properties: Mapping[str, PropertyValue] | None = None,
        allow_empty: bool = False,
    ) -> None:
        if not isinstance(allow_empty, bool):
            raise ValidationError("allow_empty must be a bool", field="allow_empty")
        self.message_id = template_of(message_id, field="message_id", allow_empty=allow_empty)
        self.partition_key = (
            None
            if partition_key is None
            else template_of(partition_key, field="partition_key", allow_empty=allow_empty)
        )
        self.session_id = (
            None
            if session_id is None
            else template_of(session_id, field="session_id", allow_empty=allow_empty)
        )
        if body is not None and not isinstance(body, str) and not callable(body):
            raise ValidationError("body must be a field name, a callable or None", field="body")
        if isinstance(body, str) and not body:
            raise ValidationError("body field name must not be empty", field="body")
        self.body = body
        for name, value in (("subject", subject), ("content_type", content_type)):
            if value is not None and not isinstance(value, str):
                raise ValidationError(f"{name} must be a str", field=name)
        self.subject = subject
        self.content_type = content_type
        if content_type is None and body is None:
            self.content_type = "application/json"
        self.application_properties = (
            None if application_properties is None else dict(application_properties)
        )

    @property
    def fields(self) -> list[str]:
        """Every record field the spec reads (template fields, then the body field)."""
        names = fields_of([self.message_id, self.partition_key, self.session_id])
        if isinstance(self.body, str) and self.body not in names:
            names.append(self.body)
        return names

    def body_of(self, record: Any) -> bytes | str:
        """The body the spec builds for ``record``."""
        source = self.body
        if source is None:
            try:
                return canonical_json(record)
            except (TypeError, ValueError) as exc:
                raise ValidationError(
                    f"record cannot be encoded as JSON for the body: {exc}", field="body"
                ) from None
        if isinstance(source, str):
            try:
                value = record[source]
            except (KeyError, IndexError, ValueError, TypeError):
                raise ValidationError(
                    f"body field {source!r} is missing from the record", field=source
                ) from None
            if isinstance(value, bytearray | memoryview):
                value = bytes(value)
            if not isinstance(value, bytes | str):
                raise ValidationError(
                    f"body field {source!r} must hold bytes or str, got {type(value).__name__}",
                    field=source,
                )
            return value
        value = source(record)
        if not isinstance(value, bytes | str):
            raise ValidationError(
                f"body callable must return bytes or str, got {type(value).__name__}",
                field="body",
            )
        return value

    def to_message(self, record: Any) -> Message:
        """Build the message for ``record``; raises a ``ValidationError`` naming the field."""
        message_id = self.message_id.build(record)
        partition_key = _build_key(self.partition_key, record, "partition_key")
        session_id = _build_key(self.session_id, record, "session_id")
        if session_id is not None and partition_key is None:
            partition_key = session_id
        return Message(
            self.body_of(record),
            message_id=message_id,
            partition_key=partition_key,
            session_id=session_id,
            subject=self.subject,
            content_type=self.content_type,
            application_properties=self.application_properties,
        )

    __call__ = to_message

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return (
            f"MessageSpec({self.message_id.template!r}, body={self.body!r}, "
            f"partition_key={getattr(self.partition_key, 'template', None)!r}, "
            f"session_id={getattr(self.session_id, 'template', None)!r})"
        )
