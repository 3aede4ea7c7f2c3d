"""``enqueue``: messages into the outbox on the caller's open transaction.

The business write and its messages commit together or not at all: ``enqueue`` only runs
statements on the connection it is given and never commits, begins or rolls back. It takes
a psycopg 3 connection, or a SQLAlchemy ``Session`` / ``Connection`` (its DB-API connection
is used, inside the transaction SQLAlchemy has begun).

The trace context of the span current at the call (when telemetry is on) is stored with
the rows in their own column (``trace_context``), not in the messages: what is written is the
message as given, checked against the entity as given.

One round trip per call: the per-key counters (``sendonce_outbox_keys``), the rows and the
``NOTIFY`` that wakes the relays are one statement. The counter rows stay locked until the
caller's transaction ends, which is what makes a key's sequence numbers follow commit order
(see ``_schema``): a second transaction enqueueing on the same key waits for the first.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from .._entity import EntityProfile
from .._message import Message
from .._names import name_key
from ..errors import ConfigurationError, ValidationError
from ._codec import COLUMNS, order_key, row_values
from ._schema import check_version, read_version
from ._telemetry import captured

__all__ = ["CHANNEL", "aenqueue", "dbapi_connection", "enqueue"]

CHANNEL = "sendonce_outbox"
"""The LISTEN/NOTIFY channel; the payload is the entity name."""

_TYPES = {
    "message_id": "text",
    "body": "bytea",
    "body_is_text": "boolean",
    "partition_key": "text",
    "session_id": "text",
    "subject": "text",
    "content_type": "text",
    "correlation_id": "text",
    "properties": "text",
    "time_to_live_us": "bigint",
}
_UNNEST = ", ".join(f"%({c})s::{_TYPES[c]}[]" for c in COLUMNS)
_INSERT = f"""
WITH counters AS (
    INSERT INTO sendonce_outbox_keys AS k (entity, okey, last_seq)
    SELECT %(entity)s, u.okey, u.n
    FROM unnest(%(counter_keys)s::text[], %(counter_adds)s::bigint[]) AS u(okey, n)
    ORDER BY u.okey COLLATE "C"
    ON CONFLICT (entity, okey) DO UPDATE SET last_seq = k.last_seq + excluded.last_seq
    RETURNING k.okey, k.last_seq
), written AS (
    INSERT INTO sendonce_outbox (entity, okey, seq, {", ".join(COLUMNS)}, trace_context)
    SELECT %(entity)s, u.okey, c.last_seq - u.back, {", ".join("u." + c for c in COLUMNS)},
        %(trace_context)s::text
    FROM unnest(%(okeys)s::text[], %(backs)s::bigint[], {_UNNEST})
        WITH ORDINALITY AS u(okey, back, {", ".join(COLUMNS)}, ord)
    LEFT JOIN counters AS c ON c.okey = u.okey
    ORDER BY u.ord
    RETURNING 1
)
SELECT (SELECT count(*) FROM written){{notify}}
"""
_WITH_NOTIFY = _INSERT.replace("{notify}", ", pg_notify(%(channel)s, %(entity)s)")
_WITHOUT_NOTIFY = _INSERT.replace("{notify}", "")

_checked: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_checked_lock = threading.Lock()


def dbapi_connection(conn: Any) -> Any:
    """The DB-API connection under a psycopg connection or a SQLAlchemy session/connection."""
    module = type(conn).__module__
    if module.startswith("sqlalchemy"):
        if callable(getattr(conn, "get_bind", None)) and callable(
            getattr(conn, "connection", None)
        ):
            conn = conn.connection()  # a Session: its connection, in its transaction
        pooled = getattr(conn, "connection", None)
        raw = getattr(pooled, "dbapi_connection", None)
        if raw is None:
            raise ConfigurationError(
                f"enqueue takes a SQLAlchemy Session or Connection, not a {type(conn).__name__}",
                field="conn",
            )
        conn = raw
    if not callable(getattr(conn, "cursor", None)) or not hasattr(conn, "autocommit"):
        raise ConfigurationError(
            "enqueue takes a psycopg connection or a SQLAlchemy Session/Connection on "
            f"PostgreSQL, not a {type(conn).__name__}",
            field="conn",
        )
    return conn


def _in_transaction(raw: Any) -> bool:
    """Whether statements run now are part of a transaction the caller will end.

    A connection that is not in autocommit mode opens one at the first statement (and the
    caller commits it); one in autocommit mode only inside an explicit transaction block.
    """
    if not raw.autocommit:
        return True
    status = getattr(getattr(raw, "info", None), "transaction_status", None)
    return status is not None and int(status) == 2  # INTRANS: in conn.transaction()


def _check_schema(raw: Any, cursor: Any) -> None:
    with _checked_lock:
        try:
            known = _checked.get(raw)
        except TypeError:
            known = None
    if known is not None:
        return
    version = read_version(cursor)
    check_version(version, "this database")
    with _checked_lock:
        with contextlib.suppress(TypeError):  # a connection that takes no weak reference
            _checked[raw] = version  # type: ignore[assignment]


def _validated(messages: Iterable[Message], profile: EntityProfile | None) -> list[Message]:
    items = list(messages)
    for index, message in enumerate(items):
        if not isinstance(message, Message):
            raise ValidationError(
                f"messages[{index}] is a {type(message).__name__}, not a sendonce.Message; "
                "nothing was enqueued",
                field="messages",
            )
        if message.scheduled_enqueue_time is not None:
            raise ValidationError(
                f"messages[{index}] ({message.message_id!r}) has a scheduled_enqueue_time: the "
                "outbox publishes messages as they come and does not schedule them; nothing "
                "was enqueued",
                field="scheduled_enqueue_time",
            )
        if profile is not None:
            try:
                profile.check(message)
            except ValidationError as exc:
                raise type(exc)(
                    f"{exc} (messages[{index}]; nothing was enqueued)", field=exc.field
                ) from None
    return items


def enqueue(
    conn: Any,
    messages: Iterable[Message],
    *,
    entity: str | EntityProfile,
    notify: bool = True,
) -> int:
    """Write ``messages`` for ``entity`` into the outbox, in the caller's open transaction.

    ``conn`` is a psycopg 3 connection (not in autocommit mode, or inside
    ``conn.transaction()``) or a SQLAlchemy ``Session``/``Connection`` on PostgreSQL. Nothing
    is committed here: the messages become visible to the relays when the caller commits, and
    vanish with a rollback. Messages sharing a session id (else partition key) are published
    in the order their transactions commit, and in input order within one call. An
    ``EntityProfile`` checks each message against the entity first (size, session rules),
    so a message the broker would refuse is refused here instead. ``notify=False`` leaves
    the relays to find the rows at their next poll (no ``NOTIFY`` at commit).

    Returns the number of rows written. A bad message raises a ``ValidationError`` naming its
    index before anything is written.
    """
    profile = entity if isinstance(entity, EntityProfile) else None
    name = entity.name if isinstance(entity, EntityProfile) else entity
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            "entity must be a non-empty entity name or an EntityProfile", field="entity"
        )
    items = _validated(messages, profile)
    raw = dbapi_connection(conn)
    if not _in_transaction(raw):
        raise ConfigurationError(
            "enqueue must run in the caller's transaction, and this connection is in "
            "autocommit mode outside any: use `with conn.transaction():` (psycopg) or a "
            "connection/session that is not autocommit; nothing was enqueued",
            field="conn",
        )
    if not items:
        return 0
    params = _parameters(name_key(name), items)  # stored as Service Bus compares names
    with raw.cursor() as cursor:
        _check_schema(raw, cursor)
        cursor.execute(_WITH_NOTIFY if notify else _WITHOUT_NOTIFY, params)
        row = cursor.fetchone()
    return int(row[0])


def _parameters(entity: str, items: list[Message]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    okeys: list[str | None] = []
    for message in items:
        key = order_key(message)
        okeys.append(key)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    # Within a call a key's messages get consecutive numbers in input order: the i-th of n
    # gets last_seq - (n - i), where last_seq is the counter after adding n.
    seen: dict[str, int] = {}
    backs: list[int | None] = []
    for key in okeys:
        if key is None:
            backs.append(None)
            continue
        seen[key] = seen.get(key, 0) + 1
        backs.append(counts[key] - seen[key])
    columns = list(zip(*(row_values(m) for m in items), strict=True))
    params: dict[str, Any] = {
        "entity": entity,
        "channel": CHANNEL,
        "counter_keys": list(counts),
        "counter_adds": list(counts.values()),
        "okeys": okeys,
        "backs": backs,
        # The span current now (the web request's): every row of the call shares it.
        "trace_context": captured(),
    }
    for name, values in zip(COLUMNS, columns, strict=True):
        params[name] = list(values)
    return params


async def _adbapi_connection(conn: Any) -> Any:
    """The psycopg ``AsyncConnection`` under ``conn`` (itself, or a SQLAlchemy
    ``AsyncSession``/``AsyncConnection`` over ``postgresql+psycopg``)."""
    if type(conn).__module__.startswith("sqlalchemy"):
        if callable(getattr(conn, "get_bind", None)):
            conn = await conn.connection()  # an AsyncSession: its connection, in its transaction
        get_raw = getattr(conn, "get_raw_connection", None)
        if get_raw is None:
            raise ConfigurationError(
                "aenqueue takes a SQLAlchemy AsyncSession or AsyncConnection, not a "
                f"{type(conn).__name__}",
                field="conn",
            )
        pooled = await get_raw()
        conn = getattr(pooled, "driver_connection", None)
    if (
        conn is None
        or not hasattr(conn, "autocommit")
        or not callable(getattr(conn, "cursor", None))
    ):
        raise ConfigurationError(
            "aenqueue takes a psycopg AsyncConnection or a SQLAlchemy AsyncSession/"
            f"AsyncConnection over postgresql+psycopg, not a {type(conn).__name__}",
            field="conn",
        )
    return conn


async def aenqueue(
    conn: Any,
    messages: Iterable[Message],
    *,
    entity: str | EntityProfile,
    notify: bool = True,
) -> int:
    """:func:`enqueue` for asyncio applications: a psycopg ``AsyncConnection``, or a
    SQLAlchemy ``AsyncSession``/``AsyncConnection`` (``postgresql+psycopg``), in its open
    transaction. Same rules, same single round trip; nothing is committed here."""
    profile = entity if isinstance(entity, EntityProfile) else None
    name = entity.name if isinstance(entity, EntityProfile) else entity
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            "entity must be a non-empty entity name or an EntityProfile", field="entity"
        )
    items = _validated(messages, profile)
    raw = await _adbapi_connection(conn)
    if not _in_transaction(raw):
        raise ConfigurationError(
            "aenqueue must run in the caller's transaction, and this connection is in "
            "autocommit mode outside any: use `async with conn.transaction():` or a "
            "connection/session that is not autocommit; nothing was enqueued",
            field="conn",
        )
    if not items:
        return 0
    params = _parameters(name_key(name), items)
    async with raw.cursor() as cursor:
        with _checked_lock:
            known = _checked.get(raw)
        if known is None:
            await cursor.execute("SELECT to_regclass('sendonce_outbox_meta') IS NOT NULL")
            exists = await cursor.fetchone()
            version = None
            if exists and exists[0]:
                await cursor.execute(
                    "SELECT value FROM sendonce_outbox_meta WHERE key = 'schema_version'"
                )
                found = await cursor.fetchone()
                version = None if found is None else int(found[0])
            check_version(version, "this database")
            with _checked_lock, contextlib.suppress(TypeError):
                _checked[raw] = version  # type: ignore[assignment]
        await cursor.execute(_WITH_NOTIFY if notify else _WITHOUT_NOTIFY, params)
        row = await cursor.fetchone()
    return int(row[0])
