"""Driver-side checks: the spec against the schema, conflicting rows, where the broker lives.

A problem caused by a row's content that surfaces inside a task is retried by
Spark up to its max-failures count before the job aborts, and by then some
rows may be sent. So everything that can be decided on the driver is decided
there, before any task runs, and raises a ``ValidationError`` naming the column.
"""

from __future__ import annotations

import warnings
from typing import Any
from urllib.parse import urlencode

from .._entity import EntityProfile
from .._message import MessageSpec
from ..backends._url import LOCAL_SCHEME, local_path
from ..errors import ConfigurationError, MessageIdError, ValidationError
from ._rows import ColumnPlan, IdKind, Shape

__all__ = [
    "ConflictingRowsError",
    "SchemaError",
    "check_backend_fits",
    "find_conflicts",
    "is_local_master",
    "master_of",
    "plan_for",
    "quoted",
    "resolve_local_url",
]

CONFLICTS_SHOWN = 5


class SchemaError(ValidationError):
    """The DataFrame's schema cannot feed the spec: a missing column or an unusable type."""


class ConflictingRowsError(ValidationError):
    """Rows with different payloads map to the same message id.

    The broker compares ids only: it would keep one of them and silently drop
    the others. Nothing was sent.
    """

    def __init__(self, message: str, *, message_ids: list[str] | None = None) -> None:
        super().__init__(message, field="message_id")
        self.message_ids = list(message_ids or ())


def quoted(name: str) -> Any:
    """A column reference that survives dots and backticks in the name."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _types() -> Any:
    from pyspark.sql import types

    return types


def _id_kind(data_type: Any, column: str, role: str) -> IdKind:
    t = _types()
    if isinstance(data_type, t.StringType | t.VarcharType | t.CharType):
        return "str"
    if isinstance(data_type, t.ByteType | t.ShortType | t.IntegerType | t.LongType):
        return "int"
    if isinstance(data_type, t.DecimalType | t.DateType) or type(data_type) is t.TimestampType:
        return "any"
    why = {
        "FloatType": "a float has no stable text (1e16 and 1e16+1 collide); cast it to decimal",
        "DoubleType": "a double has no stable text (1e16 and 1e16+1 collide); cast it to decimal",
        "BooleanType": "a boolean would make True and 1 ambiguous; cast it to string",
        "TimestampNTZType": "a timestamp without time zone means a different instant on "
        "each machine; cast it to timestamp",
    }.get(type(data_type).__name__, "use string, integer, decimal, date or timestamp columns")
    raise SchemaError(
        f"column {column!r} used in the {role} template has type {data_type.simpleString()}, "
        f"which cannot build a deterministic id: {why}. Nothing was sent.",
        field=column,
    )


def _shape(data_type: Any) -> Shape:
    """How values of this type must be normalised so both row paths agree (None: as is)."""
    t = _types()
    if type(data_type) is t.TimestampType:
        return ("ts",)
    if isinstance(data_type, t.ArrayType):
        inner = _shape(data_type.elementType)
        return None if inner is None else ("array", inner)
    if isinstance(data_type, t.MapType):
        return ("map", _shape(data_type.valueType))
    if isinstance(data_type, t.StructType):
        return ("struct", tuple((f.name, _shape(f.dataType)) for f in data_type.fields))
    return None


def plan_for(schema: Any, spec: MessageSpec) -> ColumnPlan:
    """Check ``spec`` against ``schema`` and decide which columns the tasks read."""
    if not isinstance(spec, MessageSpec):
        raise ConfigurationError("spec must be a sendonce.MessageSpec", field="spec")
    t = _types()
    by_name = {f.name: f for f in schema.fields}
    available = ", ".join(by_name) or "(none)"
    roles = [("message_id", spec.message_id)]
    if spec.partition_key is not None:
        roles.append(("partition_key", spec.partition_key))
    if spec.session_id is not None:
        roles.append(("session_id", spec.session_id))
    kinds: dict[str, IdKind] = {}
    for role, template in roles:
        for name in template.fields:
            if name not in by_name:
                raise SchemaError(
                    f"column {name!r} of the {role} template {template.template!r} is not in "
                    f"the DataFrame (columns: {available}). Nothing was sent.",
                    field=name,
                )
            kinds[name] = _id_kind(by_name[name].dataType, name, role)
    body = spec.body
    if isinstance(body, str):
        if body not in by_name:
            raise SchemaError(
                f"body column {body!r} is not in the DataFrame (columns: {available}). "
                "Nothing was sent.",
                field=body,
            )
        if not isinstance(by_name[body].dataType, t.StringType | t.BinaryType):
            raise SchemaError(
                f"body column {body!r} has type {by_name[body].dataType.simpleString()}; a body "
                "column must be string or binary (or use body=None for JSON of the row). "
                "Nothing was sent.",
                field=body,
            )
        columns = list(dict.fromkeys([*kinds, body]))
        whole = False
    else:
        columns = list(by_name)
        whole = True
    shapes = tuple(_shape(by_name[name].dataType) for name in columns)
    return ColumnPlan(tuple(columns), shapes, tuple(kinds.items()), whole)


def _key_columns(spec: MessageSpec, profile: EntityProfile | None) -> list[str]:
    """The columns that decide the broker's dedup key (id; plus keys when partitioned)."""
    templates = [spec.message_id]
    if profile is not None and profile.partitioned:
        templates += [t for t in (spec.partition_key, spec.session_id) if t is not None]
    return list(dict.fromkeys(f for t in templates for f in t.fields))


def find_conflicts(
    df: Any, spec: MessageSpec, plan: ColumnPlan, profile: EntityProfile | None
) -> None:
    """Raise if some id field is null, or if rows with different payloads share an id.

    One distributed aggregation; only a few offending groups reach the driver.
    Template ids are injective on canonical values, and one column has one
    type, so rows share an id exactly when they share the template columns.
    """
    from pyspark.sql import functions as F

    keys = _key_columns(spec, profile)
    id_fields = list(dict(plan.id_kinds))
    null_fields = list(
        dict.fromkeys([*id_fields, *([spec.body] if isinstance(spec.body, str) else [])])
    )
    # A 64-bit hash of the payload per row; a key whose smallest and largest hash
    # differ has two payloads. min/max aggregate map-side, unlike count(distinct).
    if isinstance(spec.body, str):
        payload = F.xxhash64(quoted(spec.body))
        source = df.select(*[quoted(c) for c in plan.columns])
    elif spec.body is None:
        by_name = {f.name: f.dataType for f in df.schema.fields}
        payload = F.xxhash64(
            *[F.to_json(quoted(c)) if _has_map(by_name[c]) else quoted(c) for c in plan.columns]
        )
        source = df
    else:
        source, payload = _digests(df, spec, plan)
    flags = [
        F.max(quoted(c).isNull().cast("int")).alias(f"__null_{i}")
        for i, c in enumerate(null_fields)
    ]
    grouped = source.groupBy(*[quoted(k) for k in keys]).agg(
        (F.min(payload) != F.max(payload)).alias("__conflict"), *flags
    )
    condition = F.col("__conflict")
    for i in range(len(null_fields)):
        condition = condition | (F.col(f"__null_{i}") > 0)
    offenders = grouped.where(condition).limit(CONFLICTS_SHOWN * 4).collect()
    if not offenders:
        return
    for i, name in enumerate(null_fields):
        if any(row[f"__null_{i}"] for row in offenders):
            role = "body" if name == spec.body else "id template"
            raise (MessageIdError if role != "body" else ValidationError)(
                f"column {name!r} used in the {role} is null in some rows; every row needs a "
                "value there (filter or fill those rows first). Nothing was sent.",
                field=name,
            )
    ids = []
    for row in offenders[:CONFLICTS_SHOWN]:
        record = {k: _driver_value(row[k]) for k in keys}
        try:
            ids.append(spec.message_id.build(record))
        except MessageIdError:
            ids.append(repr(record))
    more = "" if len(offenders) <= CONFLICTS_SHOWN else " and more"
    raise ConflictingRowsError(
        f"rows with different payloads map to the same message id: {', '.join(map(repr, ids))}"
        f"{more}. The broker compares ids only and would silently keep one payload per id. "
        "Add the distinguishing columns to the message_id template, or deduplicate the "
        "DataFrame first. Nothing was sent.",
        message_ids=ids,
    )


def _has_map(data_type: Any) -> bool:
    t = _types()
    if isinstance(data_type, t.MapType):
        return True
    if isinstance(data_type, t.ArrayType):
        return _has_map(data_type.elementType)
    if isinstance(data_type, t.StructType):
        return any(_has_map(f.dataType) for f in data_type.fields)
    return False


def _driver_value(value: Any) -> Any:
    from datetime import UTC, datetime

    return value.astimezone(UTC) if isinstance(value, datetime) else value


def _digests(df: Any, spec: MessageSpec, plan: ColumnPlan) -> tuple[Any, Any]:
    """For a callable body: the key columns plus a SHA-256 of each row's body, on executors."""
    from pyspark.sql import functions as F

    keys = list(dict(plan.id_kinds))
    t = _types()
    by_name = {f.name: f for f in df.schema.fields}
    out_schema = t.StructType(
        [by_name[k] for k in keys] + [t.StructField("__digest", t.StringType(), True)]
    )
    digest_fn = _DigestFn(spec, plan, tuple(keys))
    return df.mapInArrow(digest_fn, out_schema), F.col("__digest")


class _DigestFn:
    """mapInArrow function: key columns as they came, plus the digest of the built body."""

    def __init__(self, spec: MessageSpec, plan: ColumnPlan, keys: tuple[str, ...]) -> None:
        self.spec, self.plan, self.keys = spec, plan, keys

    def __call__(self, batches: Any) -> Any:
        import hashlib

        import pyarrow as pa

        from ._rows import normalize_columns

        body_of = self.spec.body_of
        for batch in batches:
            raw = {name: batch.column(name).to_pylist() for name in self.plan.columns}
            columns = normalize_columns(self.plan, dict(raw))
            digests: list[str | None] = []
            for i in range(batch.num_rows):
                try:
                    body = body_of({name: values[i] for name, values in columns.items()})
                except ValidationError:
                    digests.append(None)
                    continue
                data = body.encode("utf-8") if isinstance(body, str) else body
                digests.append(hashlib.sha256(data).hexdigest())
            arrays = [batch.column(k) for k in self.keys] + [pa.array(digests, pa.string())]
            yield pa.RecordBatch.from_arrays(arrays, names=[*self.keys, "__digest"])


def master_of(spark: Any) -> str | None:
    """The session's master url, on a classic or a Spark Connect session; None if unknown."""
    try:
        master = spark.conf.get("spark.master", None)
        if master:
            return str(master)
    except Exception:  # Spark Connect servers may refuse to show it
        pass
    try:
        return str(spark.sparkContext.master)
    except Exception:  # no sparkContext under Spark Connect
        return None


def is_local_master(master: str) -> bool:
    """True when every executor runs on this machine (local, local[n], local-cluster[...])."""
    return master.strip().lower().startswith("local")


def check_backend_fits(url: str, master: str | None) -> None:
    """Refuse the one-machine local broker when executors run on other machines."""
    if not url.strip().startswith(LOCAL_SCHEME):
        return
    if master is None:
        warnings.warn(
            "could not read spark.master: the local:// broker is one SQLite file on this "
            "machine and works only when every executor runs here",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    if not is_local_master(master):
        raise ConfigurationError(
            f"the local:// broker is one SQLite file on one machine, but this session's master "
            f"is {master!r}: executors on other machines would each write their own file (or "
            "fail to reach it). Use an Azure Service Bus connection string (Endpoint=sb://...) "
            "for clusters; local:// is for local[...] sessions, tests and demos.",
            field="url",
        )


def resolve_local_url(url: str) -> str:
    """A ``local:`` url with its path made absolute on the driver, so executors agree."""
    if not url.strip().startswith(LOCAL_SCHEME):
        return url
    path, query = local_path(url.strip())
    return f"local://{path}" + (f"?{urlencode(query)}" if query else "")
