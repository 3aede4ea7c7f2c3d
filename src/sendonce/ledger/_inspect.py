"""Looking into a ledger by hand: what it holds per entity, which keys were never confirmed.

An operator needs this when a run reported keys in doubt: the ledger says a send
was attempted and never confirmed, and only a person who looked at the broker
can say whether it arrived. :func:`resolve` then records the answer (``sent``:
the broker has it; ``release``: it does not, the next run sends it), through the
store's own primitives, so the ledger's rules stay in one place.

The store protocol has no listing primitive (a sender never needs one), so the
queries below read the two built-in stores' tables; they only read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from .._names import name_key
from ..errors import ConfigurationError
from ._ledger import Ledger
from ._store import Key, LedgerStore

__all__ = ["EntityCounts", "Unconfirmed", "entity_counts", "resolve", "unconfirmed"]

Resolution = Literal["sent", "release"]


@dataclass(frozen=True, slots=True)
class EntityCounts:
    """What a ledger holds for one entity."""

    entity: str
    keys: int
    confirmed: int
    oldest: datetime | None
    """The first attempt of the oldest key: retention prunes it first."""
    newest: datetime | None
    oldest_unconfirmed: datetime | None

    @property
    def unconfirmed(self) -> int:
        return self.keys - self.confirmed


@dataclass(frozen=True, slots=True)
class Unconfirmed:
    """A key whose send was attempted and never confirmed."""

    key: Key
    first_attempt: datetime
    owner: str


def entity_counts(store: LedgerStore) -> list[EntityCounts]:
    """Per entity: keys, confirmed keys, oldest and newest first attempt (by entity name)."""
    rows = _query(store, _SQLITE_COUNTS, _POSTGRES_COUNTS, ())
    counts = [
        EntityCounts(name, keys, confirmed, _time(oldest), _time(newest), _time(unconfirmed))
        for name, keys, confirmed, oldest, newest, unconfirmed in rows
    ]
    return sorted(counts, key=lambda c: c.entity)


def unconfirmed(store: LedgerStore, entity: str, *, limit: int) -> list[Unconfirmed]:
    """At most ``limit`` keys of ``entity`` never confirmed, the oldest first."""
    if _is_sqlite(store):
        rows = _query(store, _SQLITE_UNCONFIRMED, "", (entity, limit))
        return [
            Unconfirmed(_unpack(packed), _micros(first), owner) for packed, first, owner in rows
        ]
    rows = _query(store, "", _POSTGRES_UNCONFIRMED, (name_key(entity), limit))
    return [Unconfirmed(Key(mid, pk), first, owner) for mid, pk, first, owner in rows]


def resolve(ledger: Ledger, entity: str, key: Key, resolution: Resolution) -> None:
    """Record a person's answer for an unconfirmed key: ``sent`` (the broker has it) or
    ``release`` (it has not: the next run sends it). Refused for a key that is not
    unconfirmed, so a confirmed key is never released by a slip."""
    row = ledger.store.lookup(entity, [key]).get(key)
    if row is None:
        raise ConfigurationError(
            f"the ledger has no key {_shown(key)} for entity {entity!r}", field="key"
        )
    if row.confirmed_at is not None:
        raise ConfigurationError(
            f"key {_shown(key)} of entity {entity!r} is already confirmed "
            f"({row.outcome} at {row.confirmed_at.isoformat()}): nothing to resolve",
            field="key",
        )
    if resolution == "sent":
        ledger.confirm(entity, {key: "sent"})
    else:
        ledger.release(entity, [key], row.owner)


def _shown(key: Key) -> str:
    mid, pk = key
    return repr(mid) if not pk else f"{mid!r} (partition key {pk!r})"


# -- the built-in stores' tables (read only) --------------------------------------------

_SQLITE_COUNTS = """
SELECT e.name, count(k.k),
    coalesce(sum(coalesce(k.confirmed_at, t.confirmed_at) IS NOT NULL), 0),
    min(t.first_attempt), max(t.first_attempt),
    min(CASE WHEN coalesce(k.confirmed_at, t.confirmed_at) IS NULL THEN t.first_attempt END)
FROM ledger_entities AS e
LEFT JOIN ledger_keys AS k
    ON k.k >= e.eid || ':' AND k.k < e.eid || ';'
LEFT JOIN ledger_transfers AS t ON t.tid = k.tid
GROUP BY e.eid
"""
_SQLITE_UNCONFIRMED = """
SELECT k.k, t.first_attempt, t.owner
FROM ledger_entities AS e
JOIN ledger_keys AS k ON k.k >= e.eid || ':' AND k.k < e.eid || ';'
JOIN ledger_transfers AS t ON t.tid = k.tid
WHERE e.name = ? COLLATE NOCASE AND coalesce(k.confirmed_at, t.confirmed_at) IS NULL
ORDER BY t.first_attempt, k.rowid
LIMIT ?
"""
_POSTGRES_CONFIRMED = "coalesce(l.confirmed_at, t.confirmed_at)"
_POSTGRES_JOIN = (
    "LEFT JOIN sendonce_ledger_transfers AS t ON t.entity = l.entity AND t.owner = l.owner"
)
_POSTGRES_COUNTS = f"""
SELECT l.entity, count(*), count({_POSTGRES_CONFIRMED}), min(l.first_attempt),
    max(l.first_attempt), min(l.first_attempt) FILTER (WHERE {_POSTGRES_CONFIRMED} IS NULL)
FROM sendonce_ledger AS l {_POSTGRES_JOIN}
GROUP BY l.entity
"""
_POSTGRES_UNCONFIRMED = f"""
SELECT l.message_id, l.partition_key, l.first_attempt, l.owner
FROM sendonce_ledger AS l {_POSTGRES_JOIN}
WHERE l.entity = %s AND {_POSTGRES_CONFIRMED} IS NULL
ORDER BY l.first_attempt
LIMIT %s
"""


def _is_sqlite(store: LedgerStore) -> bool:
    from ._sqlite import SQLiteStore

    return isinstance(store, SQLiteStore)


def _query(
    store: LedgerStore, sqlite_sql: str, postgres_sql: str, params: tuple[Any, ...]
) -> list[tuple[Any, ...]]:
    if _is_sqlite(store):

        def work(conn: Any) -> list[tuple[Any, ...]]:
            return list(conn.execute(sqlite_sql, params).fetchall())

        rows: list[tuple[Any, ...]] = store._tx(work)  # type: ignore[attr-defined]
        return rows
    if type(store).__name__ == "PostgresStore":

        def pg(conn: Any) -> list[tuple[Any, ...]]:
            with conn.cursor() as cursor:
                cursor.execute(postgres_sql, params)
                return list(cursor.fetchall())

        result: list[tuple[Any, ...]] = store._run(pg)  # type: ignore[attr-defined]
        return result
    raise ConfigurationError(
        f"a {type(store).__name__} cannot be inspected: only the built-in sqlite and "
        "postgresql stores can",
        field="ledger",
    )


def _time(value: int | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return _micros(value)


def _micros(value: int) -> datetime:
    from ._sqlite import _time as from_micros

    return from_micros(value)


def _unpack(packed: str) -> Key:
    """A SQLite key back into its parts: ``eid:NNN<partition key><message id>``."""
    rest = packed.partition(":")[2]
    length = int(rest[:3])
    return Key(rest[3 + length :], rest[3 : 3 + length])
