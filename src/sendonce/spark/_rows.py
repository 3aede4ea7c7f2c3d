"""Turning Spark rows into messages, column by column, identically on both row paths.

Rows reach Python two ways: as Arrow record batches (``mapInArrow``, the fast
path inside :func:`sendonce.spark.publish`) and as ``Row`` objects
(``df.foreachPartition``). The two disagree on a few value types: a
``timestamp`` arrives timezone-aware through Arrow but naive (in the worker
process's local time zone) through ``Row``; a ``map`` arrives as a list of
pairs through Arrow but as a dict through ``Row``; a struct arrives as a dict
or as a ``Row``. Both paths normalise to the same values here, then share one
builder, so a row gets the same message id and body whichever path sent it.
A retried attempt on the other path would otherwise resend under another id.

This module runs on executors; it does not import pyspark.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from itertools import repeat
from json.encoder import encode_basestring
from typing import Any, cast

from .._ids import MessageIdTemplate, canonical_text, escape_table
from .._message import Message, MessageFactory, MessageSpec, canonical_json
from .._message_columns import MessageColumns
from ..errors import MessageIdError, ValidationError
from ._columns import Columns, naive_utc_column

__all__ = [
    "BatchEncoder",
    "ColumnPlan",
    "Encoded",
    "IdKind",
    "Shape",
    "columns_of_rows",
    "encode_columns",
    "normalize_columns",
    "normalizer",
]

Shape = tuple[Any, ...] | None
"""How a column's values must be normalised: None (as they come), ("ts",), ("struct",
((name, shape), ...)), ("array", shape) or ("map", shape)."""

IdKind = str
"""The canonical-text strategy of an id column: "str", "int", "any"."""


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """What the executors need to know about the columns, decided on the driver.

    ``columns`` are the columns read, in order; ``shapes`` say how to normalise
    each; ``id_kinds`` map template fields to their fast canonical-text path;
    ``whole_record`` is True when the body needs every column (JSON or callable).
    """

    columns: tuple[str, ...]
    shapes: tuple[Shape, ...]
    id_kinds: tuple[tuple[str, IdKind], ...]
    whole_record: bool
    dynamic: bool = False
    """No schema was given (``partition_publisher`` without ``schema=``): read every
    column of the rows and normalise values by their Python type."""


def _to_utc(value: Any) -> Any:
    if isinstance(value, datetime):
        # A naive value came through a Row: pyspark built it with the worker's
        # local time zone, and astimezone() reads a naive value in that same zone.
        return value.astimezone(UTC)
    return value


def utc_values(values: list[Any]) -> list[Any]:
    """A timestamp column as aware UTC datetimes (naive values are local time).

    Values already in UTC (the Arrow path attaches it) are kept as they are, with one
    pass over the column; any other goes through ``astimezone(UTC)``.
    """
    first = next((v for v in values if v is not None), None)
    if first is None:
        return values
    if first.tzinfo is UTC and {v.tzinfo for v in values if v is not None} == {UTC}:
        return values
    if set(map(type, values)) == {datetime}:  # no None, no subclass: one C-level map
        return list(map(datetime.astimezone, values, repeat(UTC)))
    return [None if v is None else _to_utc(v) for v in values]


def normalizer(shape: Shape) -> Callable[[Any], Any] | None:
    """A function normalising one value of a column of this shape (None: leave as is)."""
    if shape is None:
        return None
    kind = shape[0]
    if kind == "ts":
        return _to_utc
    if kind == "array":
        inner = normalizer(shape[1])
        if inner is None:
            return None
        item = inner

        def array(value: Any) -> Any:
            return None if value is None else [None if v is None else item(v) for v in value]

        return array
    if kind == "map":
        inner_map = normalizer(shape[1])

        def mapping(value: Any) -> Any:
            if value is None:
                return None
            pairs = value.items() if isinstance(value, dict) else value
            if inner_map is None:
                return dict(pairs)
            return {k: None if v is None else inner_map(v) for k, v in pairs}

        return mapping
    if kind == "struct":
        fields = [(name, normalizer(sub)) for name, sub in shape[1]]

        def struct(value: Any) -> Any:
            if value is None:
                return None
            if hasattr(value, "asDict"):
                value = value.asDict(recursive=False)
            out = {}
            for name, norm in fields:
                v = value[name]
                out[name] = v if norm is None or v is None else norm(v)
            return out

        return struct
    raise ValueError(f"unknown column shape {shape!r}")


_LEAVES = frozenset({Decimal, date, bool, type(None)})


def _dynamic(value: Any) -> Any:
    """Normalise by Python type, for rows that came without a schema."""
    if type(value) in _LEAVES:  # the common scalar columns, without the checks below
        return value
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if hasattr(value, "asDict"):
        return {k: _dynamic(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, list):
        return [_dynamic(v) for v in value]
    if isinstance(value, dict):
        return {k: _dynamic(v) for k, v in value.items()}
    return value


_PLAIN = (str, int, float, bytes, bytearray)
_LEAVES_AND_PLAIN = _LEAVES | {str, int, float, bytes, bytearray}


def normalize_columns(plan: ColumnPlan, columns: dict[str, list[Any]]) -> Columns:
    """Normalise every column in place of its raw values (see the module docstring).

    A timestamp column of naive UTC times (a worker in UTC) stays naive inside the
    returned :class:`Columns` until read, when it becomes aware.
    """
    names = list(columns)
    naive: dict[str, list[datetime]] = {}

    def timestamps(name: str, values: list[Any]) -> None:
        if naive_utc_column(values):
            naive[name] = columns.pop(name)
        else:
            columns[name] = utc_values(values)

    if plan.dynamic:
        for name, values in list(columns.items()):
            kinds = set(map(type, values))
            if kinds <= _LEAVES_AND_PLAIN:
                continue  # every value stays as it is (what _dynamic returns for it)
            if kinds == {datetime} or kinds == {datetime, type(None)}:
                timestamps(name, values)
            elif any(v is not None and not isinstance(v, _PLAIN) for v in values):
                columns[name] = [_dynamic(v) for v in values]
        return Columns(names, columns, naive)
    for name, shape in zip(plan.columns, plan.shapes, strict=True):
        if shape == ("ts",):
            timestamps(name, columns[name])
            continue
        norm = normalizer(shape)
        if norm is not None:
            columns[name] = [None if v is None else norm(v) for v in columns[name]]
    return Columns(names, columns, naive)


class _ColumnTemplate:
    """A :class:`MessageIdTemplate` applied to whole columns at once.

    It produces exactly what ``template.build`` produces for each row (the
    escaping rule of :mod:`sendonce._ids`); every batch re-checks its first row
    against ``template.build`` and falls back to per-row building on any
    difference, so the fast path can never send a row under another id.
    Rows whose id is too long go through ``template.build`` (hash or error).
    """

    def __init__(self, template: MessageIdTemplate, kinds: dict[str, IdKind]) -> None:
        self.template = template
        self.head = template.literals[0]
        self.tails = template.literals[1:]
        self.steps: list[tuple[str, IdKind, str, dict[int, str]]] = [
            (name, kinds.get(name, "any"), chars, escape_table(chars))
            for name, chars in zip(template.fields, template.escapes, strict=True)
        ]
        self.trusted = True

    def build(
        self, columns: Mapping[str, list[Any]], rows: int, failed: dict[int, ValidationError]
    ) -> list[str]:
        """Ids for ``rows`` rows (non-null id fields); a row refused goes to ``failed``, id ""."""
        ids: list[str] | None = None
        if self.trusted:
            try:
                ids = self._columns(columns)
            except (ValidationError, ValueError):  # ValueError: an int too long for str()
                ids = None  # some value has no canonical text: find which, row by row
        if ids is None:
            return self._rows(columns, rows, failed)
        limit = self.template.max_length
        for i, message_id in enumerate(ids):
            if len(message_id) > limit or not message_id:
                try:
                    ids[i] = self.template.build(_row(columns, i))
                except ValidationError as exc:
                    failed.setdefault(i, exc)
                    ids[i] = ""
        check = next((i for i in range(rows) if i not in failed), None)
        if check is not None and self.template.build(_row(columns, check)) != ids[check]:
            self.trusted = False  # pragma: no cover - a safety net
            return self._rows(columns, rows, failed)  # pragma: no cover
        return ids

    def _rows(
        self, columns: Mapping[str, list[Any]], rows: int, failed: dict[int, ValidationError]
    ) -> list[str]:
        out: list[str] = []
        for i in range(rows):
            try:
                out.append(self.template.build(_row(columns, i)))
            except ValidationError as exc:
                failed.setdefault(i, exc)
                out.append("")
        return out

    def _columns(self, columns: Mapping[str, list[Any]]) -> list[str]:
        ids: list[str] | None = None
        for (name, kind, chars, table), tail in zip(self.steps, self.tails, strict=True):
            values = columns[name]
            if kind == "any":
                # No schema said (partition_publisher without schema=): a column of
                # plain str or int values takes the fast path canonical_text would match.
                types = set(map(type, values))
                if types == {str} or types == {int}:
                    kind = "str" if str in types else "int"
            if kind == "str":
                texts: list[str] = values
            elif kind == "int":
                texts = list(map(str, values))
            else:
                texts = [canonical_text(v, name) for v in values]
            if kind != "int" and not self.template.allow_empty and "" in texts:
                raise MessageIdError(f"field {name!r} is empty", field=name)  # rows name it
            if kind != "int" or "-" in chars:
                if len(chars) == 1:
                    c = chars
                    texts = [t.translate(table) if c in t else t for t in texts]
                else:
                    c1, c2 = chars[0], chars[1]
                    texts = [t.translate(table) if c1 in t or c2 in t else t for t in texts]
            if ids is None:
                head = self.head
                ids = [head + t + tail for t in texts] if head else [t + tail for t in texts]
            elif tail:
                ids = [a + t + tail for a, t in zip(ids, texts, strict=True)]
            else:
                ids = [a + t for a, t in zip(ids, texts, strict=True)]
        assert ids is not None
        return ids


def _short_repr(value: Any) -> str:
    """``repr`` for an error message, even of an int too long to print."""
    try:
        return repr(value)
    except ValueError:
        return f"<{type(value).__name__} of {getattr(value, 'bit_length', lambda: '?')()} bits>"


def _row(columns: Mapping[str, list[Any]], index: int) -> dict[str, Any]:
    if isinstance(columns, Columns):
        return columns.row(index)  # without making whole timestamp columns aware
    return {name: values[index] for name, values in columns.items()}


def _json_fallback(value: Any) -> str:
    text: str = canonical_json(value).decode("utf-8")
    return text


def _json_float(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError("NaN and Infinity are not JSON")
    return float.__repr__(value)


def _json_quoted_text(value: date) -> str:
    return '"' + value.isoformat() + '"'


_JSON_TEXT: dict[type, Callable[[Any], str]] = {
    str: encode_basestring,
    int: int.__repr__,
    float: _json_float,
    bool: lambda v: "true" if v else "false",
    Decimal: lambda v: '"' + str(v) + '"',
    datetime: _json_quoted_text,
    date: _json_quoted_text,
}


# A column whose values all have one of these exact types (no None) is encoded by one
# C-level map, with the same text as _JSON_TEXT gives each value. The texts of the
# quoted kinds come without their quotes: the row template carries them.
_JSON_COLUMN: dict[type, Callable[[list[Any]], list[str]]] = {
    str: lambda values: list(map(encode_basestring, values)),
    int: lambda values: list(map(int.__repr__, values)),
}
_JSON_QUOTED_COLUMN: dict[type, Callable[[list[Any]], list[str]]] = {
    Decimal: lambda values: list(map(str, values)),
    datetime: lambda values: list(map(datetime.isoformat, values)),
    date: lambda values: list(map(date.isoformat, values)),
}


def _json_column(values: list[Any]) -> tuple[list[str], bool]:
    """The JSON text of every value of a column (as ``_JSON_TEXT`` gives it).

    The flag says the texts still need their quotes (Decimal, datetime and date
    columns of one type: the row template adds them, saving a pass per column).
    """
    kinds = set(map(type, values))
    if len(kinds) == 1:
        kind = kinds.pop()
        whole = _JSON_COLUMN.get(kind)
        if whole is not None:
            return whole(values), False
        bare = _JSON_QUOTED_COLUMN.get(kind)
        if bare is not None:
            return bare(values), True
    texts = ["null" if v is None else _JSON_TEXT.get(type(v), _json_fallback)(v) for v in values]
    return texts, False


class _JsonColumns:
    """Canonical JSON bodies of whole rows, built column by column.

    Produces the bytes :func:`sendonce._message.canonical_json` produces for
    the row's dict (sorted keys, compact, UTF-8). Each batch re-checks its
    first row against ``spec.body_of``; on any difference, or on a value it
    cannot encode, the batch falls back to ``spec.body_of`` row by row.
    """

    def __init__(self) -> None:
        self.trusted = True

    def build(self, columns: Mapping[str, list[Any]], rows: int) -> list[bytes | str | None] | None:
        if not self.trusted:
            return None
        names = sorted(columns)
        texts: list[list[str]] = []
        slots: list[str] = []
        try:
            for name in names:
                naive = columns.naive(name) if isinstance(columns, Columns) else None
                if naive is not None:  # naive UTC times: the aware text minus its offset
                    texts.append(list(map(datetime.isoformat, naive)))
                    slots.append('"%s+00:00"')
                    continue
                column, quote = _json_column(columns[name])
                texts.append(column)
                slots.append('"%s"' if quote else "%s")
        except (TypeError, ValueError):
            return None  # a value canonical_json refuses: let body_of report it per row
        template = (
            "{"
            + ",".join(
                encode_basestring(n).replace("%", "%%") + ":" + slot
                for n, slot in zip(names, slots, strict=True)
            )
            + "}"
        )
        # One C-level pipeline: format each row's texts into the template, then UTF-8.
        rows_texts = zip(*texts, strict=True)
        bodies: list[bytes | str | None] = list(map(str.encode, map(template.__mod__, rows_texts)))
        return bodies


@dataclass(slots=True)
class Encoded:
    """The messages of one batch of rows, and the rows that could not become one."""

    messages: Sequence[Message]
    """A list, or :class:`MessageColumns` when every message of the batch is plain."""
    errors: list[tuple[str, ValidationError]]
    """(a description of the row, the error) for rows the spec refused."""


class BatchEncoder:
    """Builds the messages of batches of rows for one spec and column plan."""

    def __init__(self, spec: MessageSpec, plan: ColumnPlan) -> None:
        self.spec = spec
        self.plan = plan
        kinds = dict(plan.id_kinds)
        self.id = _ColumnTemplate(spec.message_id, kinds)
        self.pk = None if spec.partition_key is None else _ColumnTemplate(spec.partition_key, kinds)
        self.sid = None if spec.session_id is None else _ColumnTemplate(spec.session_id, kinds)
        self.id_fields = [
            f
            for f in dict.fromkeys(
                [
                    *spec.message_id.fields,
                    *(spec.partition_key.fields if spec.partition_key else ()),
                    *(spec.session_id.fields if spec.session_id else ()),
                ]
            )
        ]
        self.body_field = spec.body if isinstance(spec.body, str) else None
        self.json = _JsonColumns() if spec.body is None else None
        self._make: MessageFactory | Callable[..., Message] | None = None

    def encode(self, columns: Mapping[str, list[Any]], rows: int) -> Encoded:
        """Messages for ``rows`` rows given as normalised columns."""
        errors: list[tuple[str, ValidationError]] = []
        bad = self._bad_rows(columns, rows)
        if bad:
            errors = [(self._describe(columns, i), self._error_of(columns, i)) for i in bad]
            keep = [i for i in range(rows) if i not in bad]
            columns = {name: [values[i] for i in keep] for name, values in columns.items()}
            rows = len(keep)
        if not rows:
            return Encoded([], errors)
        failed: dict[int, ValidationError] = {}
        ids = self.id.build(columns, rows, failed)
        pks = None if self.pk is None else self.pk.build(columns, rows, failed)
        sids = None if self.sid is None else self.sid.build(columns, rows, failed)
        if sids is not None and pks is None:
            pks = sids
        for i, exc in sorted(failed.items()):
            errors.append((ids[i] or self._describe(columns, i), exc))
        bodies = self._bodies(columns, rows, ids, errors, failed)
        make = self._factory()
        if not failed and isinstance(make, MessageFactory):
            whole = MessageColumns.of(make, cast(list[Any], bodies), ids, pks, sids)
            if whole is not None:
                return Encoded(whole, errors)
        messages: list[Message] = []
        append = messages.append
        for i in range(rows):
            body = bodies[i]
            if body is None:
                continue
            try:
                append(
                    make(
                        body,
                        ids[i],
                        None if pks is None else pks[i],
                        None if sids is None else sids[i],
                    )
                )
            except ValidationError as exc:
                errors.append((ids[i], exc))
        return Encoded(messages, errors)

    def _factory(self) -> MessageFactory | Callable[..., Message]:
        """A fast builder for this spec's messages (plain ``Message()`` if the spec's
        shared fields are refused, so each row reports the error)."""
        if self._make is None:
            spec = self.spec
            try:
                self._make = MessageFactory(
                    subject=spec.subject,
                    content_type=spec.content_type,
                    application_properties=spec.application_properties,
                )
            except ValidationError:
                self._make = self._plain
        return self._make

    def _plain(
        self, body: bytes | str, message_id: str, pk: str | None, sid: str | None
    ) -> Message:
        spec = self.spec
        return Message(
            body,
            message_id=message_id,
            partition_key=pk,
            session_id=sid,
            subject=spec.subject,
            content_type=spec.content_type,
            application_properties=spec.application_properties,
        )

    def _bad_rows(self, columns: Mapping[str, list[Any]], rows: int) -> set[int]:
        """Rows with a null id field or an unusable body field."""
        bad: set[int] = set()
        for name in self.id_fields:
            values = columns[name]
            if None in values:
                bad.update(i for i, v in enumerate(values) if v is None)
        if self.body_field is not None:
            values = columns[self.body_field]
            if None in values:
                bad.update(i for i, v in enumerate(values) if v is None)
        return bad

    def _error_of(self, columns: Mapping[str, list[Any]], index: int) -> ValidationError:
        try:
            self.spec.to_message(_row(columns, index))
        except ValidationError as exc:
            return exc
        return ValidationError("row was refused", field=None)  # pragma: no cover

    def _describe(self, columns: Mapping[str, list[Any]], index: int) -> str:
        try:
            return self.spec.message_id.build(_row(columns, index))
        except MessageIdError:
            fields = ", ".join(
                f"{name}={_short_repr(columns[name][index])}"[:60]
                for name in self.spec.message_id.fields
            )
            return f"row ({fields})"

    def _bodies(
        self,
        columns: Mapping[str, list[Any]],
        rows: int,
        ids: list[str],
        errors: list[tuple[str, ValidationError]],
        failed: dict[int, ValidationError],
    ) -> Sequence[bytes | str | None]:
        """Every row's body; None for a row refused (its error is in ``errors``)."""
        body = self.spec.body
        if isinstance(body, str):
            values = columns[body]
            out_field: list[bytes | str | None] = [
                bytes(v) if isinstance(v, bytearray | memoryview) else v for v in values
            ]
            for i in failed:
                out_field[i] = None
            return out_field
        body_of = self.spec.body_of
        if self.json is not None:
            fast = self.json.build(columns, rows)
            if fast is not None:
                if rows and fast[0] != body_of(_row(columns, 0)):  # pragma: no cover - safety net
                    self.json.trusted = False
                else:
                    for i in failed:
                        fast[i] = None
                    return fast
        out: list[bytes | str | None] = []
        for i in range(rows):
            if i in failed:
                out.append(None)
                continue
            try:
                out.append(body_of(_row(columns, i)))
            except ValidationError as exc:
                out.append(None)
                errors.append((ids[i], exc))
        return out


def encode_columns(encoder: BatchEncoder, columns: dict[str, list[Any]], rows: int) -> Encoded:
    """Normalise then encode: the one entry point both row paths use."""
    return encoder.encode(normalize_columns(encoder.plan, columns), rows)


def columns_of_rows(plan: ColumnPlan, rows: Sequence[Any]) -> dict[str, list[Any]]:
    """Columns from ``Row`` objects (the foreachPartition path): one C-speed transpose."""
    names = list(rows[0].__fields__) if rows else []
    wanted = names if plan.dynamic and plan.whole_record else plan.columns
    if not rows:
        return {name: [] for name in wanted}
    transposed = list(zip(*rows, strict=True))
    missing = [name for name in wanted if name not in names]
    if missing:
        raise ValidationError(
            f"column {missing[0]!r} is not in the rows (columns: {', '.join(names)})",
            field=missing[0],
        )
    return {name: list(transposed[names.index(name)]) for name in wanted}
