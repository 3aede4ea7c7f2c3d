"""Deterministic, injective, business-derived message ids.

A :class:`MessageIdTemplate` turns a record into an id such as
``12345.2017/payment``. Two records whose canonical field texts differ never get
the same id: every non-final field is followed by literal text, and any
character of a value that could be mistaken for the start of that literal (or
the escape character ``%`` itself) is percent-encoded. The final field runs to
the fixed suffix, so only ``%`` needs escaping there.
"""

from __future__ import annotations

import hashlib
import numbers
import string
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, Final, Literal

from .errors import MessageIdError

__all__ = [
    "MAX_ID_LENGTH",
    "MessageIdTemplate",
    "canonical_text",
    "content_message_id",
    "escape_table",
]

MAX_ID_LENGTH: Final = 128
"""Service Bus limit for MessageId, PartitionKey and SessionId (``MESSAGE_PROPERTY_MAX_LENGTH``)."""

ESCAPE: Final = "%"
_HASH_MARK: Final = "~"
_DIGEST_CHARS: Final = 32  # 128 bits of SHA-256, hex
_FORBIDDEN_SEPARATOR_START = frozenset(string.ascii_letters + string.digits + ESCAPE)

Overflow = Literal["error", "hash"]


def canonical_text(value: object, field: str) -> str:
    """The canonical text of one field value, identical on every machine.

    ``12345`` and ``"12345"`` share a text; floats, bools, ``None`` and naive
    datetimes are refused because their text is ambiguous or unstable.
    """
    kind = type(value)
    if kind is str:
        if not value.isascii():  # type: ignore[attr-defined]
            _check_encodable(value, field)  # type: ignore[arg-type]
        if "\x00" in value:  # type: ignore[operator]
            raise MessageIdError(
                f"field {field!r}: text contains a NUL character, which brokers cut ids at",
                field=field,
            )
        return value  # type: ignore[return-value]
    if kind is int:
        return _int_text(value, field)  # type: ignore[arg-type]
    formatter = _FORMATTERS.get(kind)
    if formatter is not None:
        return formatter(value, field)
    return _canonical_slow(value, field)


def _check_encodable(text: str, field: str) -> None:
    """Refuse lone surrogates: no AMQP client can encode them, so the send would fail later."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MessageIdError(
            f"field {field!r}: text contains a lone surrogate and is not valid Unicode",
            field=field,
        ) from None


def _decimal_text(value: Any, field: str) -> str:
    # Context-free: normalize()/quantize() would round to the thread's decimal precision.
    d: Decimal = value
    if not d.is_finite():
        raise MessageIdError(f"field {field!r}: Decimal {d} is not finite", field=field)
    if d and not -MAX_ID_LENGTH <= d.adjusted() <= MAX_ID_LENGTH:
        raise MessageIdError(
            f"field {field!r}: Decimal with exponent {d.adjusted()} has too many digits for an id",
            field=field,
        )
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    if text in ("-0", ""):
        text = "0"
    return text


def _int_text(value: int, field: str) -> str:
    try:
        return str(value)
    except ValueError:
        raise MessageIdError(
            f"field {field!r}: integer has too many digits for an id", field=field
        ) from None


def _datetime_text(value: Any, field: str) -> str:
    dt: datetime = value
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise MessageIdError(
            f"field {field!r}: naive datetime {dt.isoformat()} has no time zone; "
            "use a timezone-aware datetime so the id is the same on every machine",
            field=field,
        )
    try:
        utc = dt.astimezone(UTC)
    except OverflowError:
        raise MessageIdError(
            f"field {field!r}: datetime {dt.isoformat()} is out of range in UTC", field=field
        ) from None
    return utc.replace(tzinfo=None).isoformat() + "Z"


def _date_text(value: Any, field: str) -> str:
    return str(value.isoformat())


def _uuid_text(value: Any, field: str) -> str:
    return str(value)


_FORMATTERS: dict[type, Callable[[Any, str], str]] = {
    Decimal: _decimal_text,
    datetime: _datetime_text,
    date: _date_text,
    uuid.UUID: _uuid_text,
}


def _canonical_slow(value: object, field: str) -> str:
    if value is None:
        raise MessageIdError(f"field {field!r} is None; an id field must have a value", field=field)
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        raise MessageIdError(
            f"field {field!r}: bool is not an id value (True/1 would be ambiguous)", field=field
        )
    if isinstance(value, float) or (
        isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral | Decimal)
    ):
        raise MessageIdError(
            f"field {field!r}: float {value!r} has no stable text; use int, Decimal or str",
            field=field,
        )
    if isinstance(value, str):
        text = str.__str__(value)
        _check_encodable(text, field)
        return text
    if isinstance(value, numbers.Integral):
        return _int_text(int(value), field)
    if isinstance(value, Decimal):
        return _decimal_text(value, field)
    if isinstance(value, datetime):
        return _datetime_text(value, field)
    if isinstance(value, date):
        return _date_text(value, field)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise MessageIdError(
        f"field {field!r}: values of type {type(value).__name__} are not supported in ids "
        "(use str, int, Decimal, UUID, date or timezone-aware datetime)",
        field=field,
    )


def escape_table(chars: str) -> dict[int, str]:
    """A ``str.translate`` table percent-encoding each char of ``chars`` as UTF-8 bytes."""
    return {ord(c): "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in chars}


def _escaper(chars: str) -> Callable[[str], str]:
    """A function percent-encoding each char of ``chars`` (always including ``%``)."""
    table = escape_table(chars)
    probe = tuple(chars)

    def escape(text: str) -> str:
        for c in probe:
            if c in text:
                return text.translate(table)
        return text

    return escape


def _missing(record: Any, name: str) -> MessageIdError:
    """A field not found; a record that cannot be indexed by name at all says so."""
    if not hasattr(record, "__getitem__"):
        return MessageIdError(
            f"the record is a {type(record).__name__}, which cannot be read by field name: "
            f"pass a mapping (for a dataclass, dataclasses.asdict(record)) with field {name!r}",
            field=name,
        )
    return MessageIdError(f"field {name!r} is missing from the record", field=name)


class MessageIdTemplate:
    """A ``str.format``-style template over business fields, e.g. ``"{order_id}.{year}/payment"``.

    ``build(record)`` reads each field from a mapping (or a Spark ``Row``, or any
    object indexable by field name) and returns a deterministic id within
    ``max_length``. With ``overflow="hash"``, a longer id becomes a readable
    prefix, ``~`` and a 128-bit SHA-256 digest of the full id.

    A field whose text is empty (``""``, an empty CSV cell) is refused: it is
    almost always missing data, and ``{a}.{b}`` would then give ``.2017`` to
    every record lacking ``a``, so the broker would drop the second of them as
    a duplicate. ``allow_empty=True`` accepts empty values where they are real.
    """

    __slots__ = (
        "_build",
        "_fast",
        "_literals",
        "allow_empty",
        "fields",
        "max_length",
        "overflow",
        "template",
    )

    def __init__(
        self,
        template: str,
        *,
        max_length: int = MAX_ID_LENGTH,
        overflow: Overflow = "error",
        allow_empty: bool = False,
    ) -> None:
        if not isinstance(template, str) or not template:
            raise MessageIdError("template must be a non-empty str", field="template")
        _check_encodable(template, "template")
        if "\x00" in template:
            raise MessageIdError(
                "template contains a NUL character, which brokers cut ids at", field="template"
            )
        if not isinstance(max_length, int) or isinstance(max_length, bool):
            raise MessageIdError("max_length must be an int", field="max_length")
        if not 1 <= max_length <= MAX_ID_LENGTH:
            raise MessageIdError(
                f"max_length must be between 1 and {MAX_ID_LENGTH}, got {max_length}",
                field="max_length",
            )
        if overflow not in ("error", "hash"):
            raise MessageIdError(
                f"overflow must be 'error' or 'hash', got {overflow!r}", field="overflow"
            )
        if overflow == "hash" and max_length < _DIGEST_CHARS + 2:
            raise MessageIdError(
                f"overflow='hash' needs max_length >= {_DIGEST_CHARS + 2}", field="max_length"
            )
        if not isinstance(allow_empty, bool):
            raise MessageIdError("allow_empty must be a bool", field="allow_empty")
        self.template = template
        self.max_length = max_length
        self.overflow: Overflow = overflow
        self.allow_empty = allow_empty
        literals, fields = _parse(template)
        self._literals: tuple[str, ...] = tuple(literals)
        self.fields: tuple[str, ...] = tuple(fields)
        self._build = self._compile()
        self._fast = self._compile_fast()

    def _compile(self) -> Callable[[Any], str]:
        literals, fields = self._literals, self.fields
        steps = [(name, _escaper(chars)) for name, chars in zip(fields, self.escapes, strict=True)]
        head, canon = literals[0], canonical_text
        tails = literals[1:]
        allow_empty = self.allow_empty

        def build(record: Any) -> str:
            parts = [head]
            for (name, escape), tail in zip(steps, tails, strict=True):
                try:
                    value = record[name]
                except (KeyError, IndexError, ValueError, TypeError, AttributeError):
                    raise _missing(record, name) from None
                text = canon(value, name)
                if not text and not allow_empty:
                    raise MessageIdError(
                        f"field {name!r} is empty; an empty id field is almost always missing "
                        "data (allow_empty=True accepts it)",
                        field=name,
                    )
                parts.append(escape(text))
                parts.append(tail)
            return "".join(parts)

        return build

    @property
    def literals(self) -> tuple[str, ...]:
        """The literal texts around the fields (one more than there are fields)."""
        return self._literals

    @property
    def escapes(self) -> tuple[str, ...]:
        """Per field, the characters its value escapes: ``%``, and for every field but the
        last the first character of the literal that follows it (the injectivity rule)."""
        last = len(self.fields) - 1
        return tuple(
            ESCAPE if i == last else ESCAPE + self._literals[i + 1][0]
            for i in range(len(self.fields))
        )

    def build(self, record: Any) -> str:
        """The id for ``record``; raises :class:`MessageIdError` naming the field at fault."""
        return self._fast(record)

    __call__ = build

    def _compile_fast(self) -> Callable[[Any], str]:
        """Straight-line code for this template (3-4x the generic loop).

        It handles the common case only: every error, an empty id and any id not
        shorter than ``max_length`` go to :meth:`_build_checked`, which owns the
        error messages and the overflow rule, so both paths give the same result.
        """
        namespace: dict[str, Any] = {
            "canon": canonical_text,
            "slow": self._build_checked,
            "limit": self.max_length,
        }
        lines = ["def build(r):", "    try:"]
        for i, (name, chars) in enumerate(zip(self.fields, self.escapes, strict=True)):
            namespace[f"T{i}"] = escape_table(chars)
            probe = " or ".join(f"{c!r} in v{i}" for c in chars)
            lines += [
                f"        v{i} = r[{name!r}]",
                f"        k = type(v{i})",
                f"        if k is int: v{i} = str(v{i})",
                f"        elif k is not str or not v{i}.isascii(): v{i} = canon(v{i}, {name!r})",
                f"        if {probe}: v{i} = v{i}.translate(T{i})",
            ]
            if not self.allow_empty:
                lines.append(f"        if not v{i}: raise ValueError")  # slow() names it

        def literal(text: str) -> str:
            return text.replace("{", "{{").replace("}", "}}")

        shape = literal(self._literals[0]) + "".join(
            f"{{v{i}}}{literal(self._literals[i + 1])}" for i in range(len(self.fields))
        )
        lines += [
            f"        s = f{shape!r}",
            "    except Exception:",
            "        return slow(r)",
            '    return s if 0 < len(s) < limit and "\\x00" not in s else slow(r)',
        ]
        exec("\n".join(lines), namespace)  # field names are identifiers; literals are repr'd
        fast: Callable[[Any], str] = namespace["build"]
        return fast

    def _build_checked(self, record: Any) -> str:
        """The generic build: every error and the overflow rule live here."""
        message_id = self._build(record)
        if len(message_id) >= self.max_length and (
            len(message_id) > self.max_length or self.overflow == "hash"
        ):
            # Hashed ids are exactly max_length and unhashed ones strictly shorter, so a value
            # that equals another record's hashed id can never collide with it.
            return self._overflow(message_id)
        if not message_id:
            raise MessageIdError(
                f"template {self.template!r} built an empty id", field=self.fields[0]
            )
        return message_id

    def _overflow(self, message_id: str) -> str:
        if self.overflow == "error":
            raise MessageIdError(
                f"id {message_id[:40]!r}... is {len(message_id)} characters, over the limit of "
                f"{self.max_length} (template {self.template!r}); shorten the fields or use "
                "overflow='hash'",
                field="message_id",
            )
        digest = hashlib.sha256(message_id.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]
        keep = self.max_length - _DIGEST_CHARS - len(_HASH_MARK)
        return message_id[:keep] + _HASH_MARK + digest

    def __repr__(self) -> str:
        return (
            f"MessageIdTemplate({self.template!r}, max_length={self.max_length}, "
            f"overflow={self.overflow!r}" + (", allow_empty=True)" if self.allow_empty else ")")
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageIdTemplate):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[str, int, str, bool]:
        return (self.template, self.max_length, self.overflow, self.allow_empty)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, self._key())


def _rebuild(
    template: str, max_length: int, overflow: Overflow, allow_empty: bool = False
) -> MessageIdTemplate:
    return MessageIdTemplate(
        template, max_length=max_length, overflow=overflow, allow_empty=allow_empty
    )


def _parse(template: str) -> tuple[list[str], list[str]]:
    """Split a template into literals and field names, rejecting non-injective forms."""
    literals: list[str] = []
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise MessageIdError(
            f"template {template!r} is malformed: {exc}", field="template"
        ) from None
    pending = ""
    for literal, name, spec, conversion in parsed:
        pending += literal
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise MessageIdError(
                f"template {template!r}: positional field {{{name}}} is not allowed; "
                "name each field",
                field="template",
            )
        if not name.isidentifier():
            raise MessageIdError(
                f"template {template!r}: field {{{name}}} must be a plain name "
                "(no attribute or index access)",
                field="template",
            )
        if conversion is not None or spec:
            raise MessageIdError(
                f"template {template!r}: field {{{name}}} has a conversion or format spec; "
                "ids use canonical formatting only",
                field="template",
            )
        if name in fields:
            raise MessageIdError(
                f"template {template!r}: field {{{name}}} appears twice", field="template"
            )
        if fields and not pending:
            raise MessageIdError(
                f"template {template!r}: fields {{{fields[-1]}}} and {{{name}}} are not separated "
                "by literal text, so different records could build the same id",
                field="template",
            )
        if fields and pending[0] in _FORBIDDEN_SEPARATOR_START:
            raise MessageIdError(
                f"template {template!r}: the text after {{{fields[-1]}}} starts with "
                f"{pending[0]!r}; separators must start with punctuation other than '%'",
                field="template",
            )
        literals.append(pending)
        fields.append(name)
        pending = ""
    literals.append(pending)
    if not fields:
        raise MessageIdError(
            f"template {template!r} has no fields; every record would get the same id",
            field="template",
        )
    return literals, fields


def content_message_id(body: bytes | str, *, prefix: str = "") -> str:
    """An id from the SHA-256 of ``body``, for producers with no business key.

    As Amazon SQS FIFO content-based deduplication does: the same body always
    gets the same id, so only identical payloads are deduplicated.
    """
    if isinstance(body, str):
        data = body.encode("utf-8")
    elif isinstance(body, bytes | bytearray | memoryview):
        data = bytes(body)
    else:
        raise MessageIdError(f"body must be bytes or str, got {type(body).__name__}", field="body")
    if not isinstance(prefix, str):
        raise MessageIdError("prefix must be a str", field="prefix")
    message_id = prefix + hashlib.sha256(data).hexdigest()
    if len(message_id) > MAX_ID_LENGTH:
        raise MessageIdError(
            f"prefix is {len(prefix)} characters; with the 64-character digest the id "
            f"exceeds {MAX_ID_LENGTH}",
            field="prefix",
        )
    return message_id


def template_of(
    value: str | MessageIdTemplate, *, field: str, allow_empty: bool = False
) -> MessageIdTemplate:
    """Accept a template string or a template object for an option named ``field``.

    A template object keeps its own ``allow_empty``; a string gets ``allow_empty``.
    """
    if isinstance(value, MessageIdTemplate):
        return value
    if isinstance(value, str):
        try:
            return MessageIdTemplate(value, allow_empty=allow_empty)
        except MessageIdError as exc:
            raise MessageIdError(f"{field}: {exc}", field=field) from None
    raise MessageIdError(
        f"{field} must be a template string or MessageIdTemplate, got {type(value).__name__}",
        field=field,
    )


def fields_of(templates: Sequence[MessageIdTemplate | None]) -> list[str]:
    """Every field name used by ``templates``, in first-seen order."""
    seen: dict[str, None] = {}
    for t in templates:
        if t is not None:
            for f in t.fields:
                seen.setdefault(f, None)
    return list(seen)
