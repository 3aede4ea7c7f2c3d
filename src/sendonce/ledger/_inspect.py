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

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from .._names import name_key
from ..errors import ConfigurationError
from ._ledger import Ledger
from ._pgkeys import ENTITY_SQL, IN_ENTITY_SQL, KEY_ORDER_SQL, entity_range, unpack_key
from ._store import Entry, Key, LedgerStore

__all__ = [
    "EntityCounts",
    "Refusal",
    "Unconfirmed",
    "ago",
    "check_resolvable",
    "count_unconfirmed",
    "entity_counts",
    "entity_names",
    "last_activity",
    "resolve",
    "unconfirmed",
]

Resolution = Literal["sent", "release"]

STAGED = ("staged", "taken")
"""The outcome a key reads while its sender staged it (written ahead, never sent)."""


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
    """The owner token of the transfer that wrote the intent (one per ``record_intents``)."""


def entity_counts(store: LedgerStore) -> list[EntityCounts]:
    """Per entity: keys, confirmed keys, oldest and newest first attempt (by entity name)."""
    rows = _query(store, _SQLITE_COUNTS, _POSTGRES_COUNTS, ())
    counts = [
        EntityCounts(name, keys, confirmed, _time(oldest), _time(newest), _time(unconfirmed))
        for name, keys, confirmed, oldest, newest, unconfirmed in rows
    ]
    return sorted(counts, key=lambda c: c.entity)


def unconfirmed(
    store: LedgerStore,
    entity: str,
    *,
    limit: int | None = None,
    offset: int = 0,
    before: datetime | None = None,
) -> list[Unconfirmed]:
    """Keys of ``entity`` never confirmed, the oldest first: ``limit`` of them (None: all)
    from ``offset``; with ``before``, only those first attempted before it."""
    cutoff = _BEFORE_ALL if before is None else before
    if _is_sqlite(store):
        rows = _query(
            store,
            _SQLITE_UNCONFIRMED,
            "",
            (entity, _us(cutoff), -1 if limit is None else limit, offset),
        )
        return [Unconfirmed(_unpack(k), _micros(first), owner) for k, first, owner in rows]
    wanted = {**_in_entity(entity), "before": cutoff, "limit": limit, "offset": offset}
    rows = _query(store, "", _POSTGRES_UNCONFIRMED, wanted)
    return [Unconfirmed(unpack_key(k), first, owner) for k, first, owner in rows]


def count_unconfirmed(store: LedgerStore, entity: str, *, before: datetime | None = None) -> int:
    """How many keys of ``entity`` were never confirmed (first attempted before ``before``)."""
    cutoff = _BEFORE_ALL if before is None else before
    if _is_sqlite(store):
        rows = _query(store, _SQLITE_COUNT_UNCONFIRMED, "", (entity, _us(cutoff)))
    else:
        params = {**_in_entity(entity), "before": cutoff}
        rows = _query(store, "", _POSTGRES_COUNT_UNCONFIRMED, params)
    return int(rows[0][0]) if rows else 0


def entity_names(store: LedgerStore) -> list[str]:
    """The entities the ledger knows, by name."""
    return [c.entity for c in entity_counts(store)]


def last_activity(
    store: LedgerStore, entity: str, rows: Sequence[Unconfirmed]
) -> dict[str, datetime]:
    """Per owner of ``rows``: when that producer last wrote to the ledger (the intents of its
    transfer, or the confirmation of one of their keys). A recent one means it is alive."""
    found: dict[str, datetime] = {}
    for row in rows:
        if row.owner not in found or row.first_attempt > found[row.owner]:
            found[row.owner] = row.first_attempt
    if not found:
        return found
    owners = sorted(found)
    if _is_sqlite(store):
        latest = [
            (owner, None if moment is None else _micros(moment))
            for owner, moment in _query(store, _SQLITE_ACTIVITY, "", (json.dumps(owners),))
        ]
    else:
        latest = _query(store, "", _POSTGRES_ACTIVITY, {**_in_entity(entity), "owners": owners})
    for owner, moment in latest:
        if moment is not None and moment > found[owner]:
            found[owner] = moment
    return found


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why one key cannot be resolved as asked; nothing is changed when any key is refused."""

    key: Key
    reason: Literal["unknown", "confirmed", "staged", "young", "live"]
    text: str


def check_resolvable(
    ledger: Ledger,
    entity: str,
    keys: Sequence[Key],
    *,
    min_age: timedelta,
    now: datetime,
) -> tuple[dict[Key, Entry], list[Refusal]]:
    """The rows of ``keys`` and every reason not to resolve some of them by hand.

    A key must be an unconfirmed intent (a confirmed key is never released by a slip),
    and its producer must be gone: an intent younger than ``min_age``, or one whose
    producer wrote to the ledger (another key of its transfer confirmed) less than
    ``min_age`` ago, may still be in flight; resolving it could duplicate or lose it.
    """
    rows = ledger.store.lookup(entity, list(keys))
    refusals: list[Refusal] = []
    pending: list[Unconfirmed] = []
    for key in keys:
        row = rows.get(key)
        if row is None:
            refusals.append(Refusal(key, "unknown", "the ledger has no such key"))
        elif row.confirmed_at is not None:
            confirmed = f"{row.outcome} at {_utc(row.confirmed_at)}"
            refusals.append(
                Refusal(key, "confirmed", f"already confirmed ({confirmed}): nothing to resolve")
            )
        elif row.outcome in STAGED:
            text = (
                "it was written ahead and never sent (staged, not armed): it is not in doubt, "
                "the next run sends it; nothing to resolve"
            )
            refusals.append(Refusal(key, "staged", text))
        else:
            pending.append(Unconfirmed(key, row.first_attempt, row.owner))
    activity = last_activity(ledger.store, entity, pending) if min_age > timedelta(0) else {}
    for item in pending:
        age = now - item.first_attempt
        active = activity.get(item.owner, item.first_attempt)
        if age < min_age:
            text = (
                f"its intent was written {ago(age)} ago, less than {ago(min_age)}: the "
                "producer that wrote it may still be sending it"
            )
            refusals.append(Refusal(item.key, "young", text))
        elif now - active < min_age:
            text = (
                "the producer that wrote it confirmed another key of the same transfer "
                f"{ago(now - active)} ago: it is alive and may still be sending this one"
            )
            refusals.append(Refusal(item.key, "live", text))
    return rows, refusals


def resolve(
    ledger: Ledger,
    entity: str,
    rows: Mapping[Key, Entry],
    keys: Sequence[Key],
    resolution: Resolution,
) -> None:
    """Record a person's answer for unconfirmed keys (checked by :func:`check_resolvable`):
    ``sent`` (the broker has them: confirmed in one write, outcome ``resolved``) or
    ``release`` (it has not: their intents are dropped, one write per producer, and the
    next run sends them)."""
    if not keys:
        return
    if resolution == "sent":
        ledger.confirm(entity, {key: "resolved" for key in keys})
        return
    by_owner: dict[str, list[Key]] = {}
    for key in keys:
        by_owner.setdefault(rows[key].owner, []).append(key)
    for owner, owned in by_owner.items():
        ledger.release(entity, owned, owner)


def ago(value: timedelta) -> str:
    """A duration as the options write it, to the second: ``2m40s``, ``3h5m``."""
    seconds = max(0, int(value.total_seconds()))
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts[:2])


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# -- the built-in stores' tables (read only) --------------------------------------------

# Keys a sender staged (written ahead, never sent: see LedgerRun) are neither confirmed
# nor in doubt: the next writer takes them over. They are left out of every count.
_SQLITE_COUNTS = """
SELECT e.name, count(k.k),
    coalesce(sum(coalesce(k.confirmed_at, t.confirmed_at) IS NOT NULL), 0),
    min(t.first_attempt), max(t.first_attempt),
    min(CASE WHEN coalesce(k.confirmed_at, t.confirmed_at) IS NULL THEN t.first_attempt END)
FROM ledger_entities AS e
LEFT JOIN ledger_keys AS k
    ON k.k >= e.eid || ':' AND k.k < e.eid || ';'
    AND k.tid NOT IN (SELECT tid FROM ledger_transfers WHERE outcome IN ('staged', 'taken'))
LEFT JOIN ledger_transfers AS t ON t.tid = k.tid
GROUP BY e.eid
"""
_SQLITE_IN_DOUBT = """
FROM ledger_entities AS e
JOIN ledger_keys AS k ON k.k >= e.eid || ':' AND k.k < e.eid || ';'
JOIN ledger_transfers AS t ON t.tid = k.tid
WHERE e.name = ? COLLATE NOCASE AND coalesce(k.confirmed_at, t.confirmed_at) IS NULL
    AND t.first_attempt < ? AND coalesce(t.outcome, '') NOT IN ('staged', 'taken')
"""
_SQLITE_UNCONFIRMED = f"""
SELECT k.k, t.first_attempt, t.owner {_SQLITE_IN_DOUBT}
ORDER BY t.first_attempt, k.rowid
LIMIT ? OFFSET ?
"""
_SQLITE_COUNT_UNCONFIRMED = f"SELECT count(*) {_SQLITE_IN_DOUBT}"
_SQLITE_ACTIVITY = """
SELECT t.owner, max(k.confirmed_at)
FROM ledger_transfers AS t JOIN ledger_keys AS k ON k.tid = t.tid
WHERE t.owner IN (SELECT value FROM json_each(?)) AND k.outcome IS NOT 'resolved'
GROUP BY t.owner
"""
_POSTGRES_CONFIRMED = "coalesce(l.confirmed_at, t.confirmed_at)"
# Schema 3: a key is one packed bytea (``_postgres.packed_key``); an entity's keys are one
# range of it, and its name, message id and partition key are read back from it.
_POSTGRES_JOIN = (
    "LEFT JOIN sendonce_ledger_transfers AS t ON t.entity = {entity} AND t.owner = l.owner"
)
# Staged keys (see the SQLite queries) are left out where the store can stage.
_POSTGRES_NOT_STAGED = (
    "NOT EXISTS (SELECT 1 FROM sendonce_ledger_staged AS s "
    "WHERE s.entity = {entity} AND s.owner = l.owner)"
)
_POSTGRES_COUNTS = f"""
SELECT l.entity, count(*), count({_POSTGRES_CONFIRMED}), min(l.first_attempt),
    max(l.first_attempt), min(l.first_attempt) FILTER (WHERE {_POSTGRES_CONFIRMED} IS NULL)
FROM (SELECT {ENTITY_SQL} AS entity, l.* FROM sendonce_ledger AS l) AS l
{_POSTGRES_JOIN.format(entity="l.entity")}
WHERE /*staged*/ TRUE
GROUP BY l.entity
""".replace("/*staged*/", "/*staged:l.entity*/")
_POSTGRES_IN_DOUBT = f"""
FROM sendonce_ledger AS l {_POSTGRES_JOIN.format(entity="%(entity)s")}
WHERE {IN_ENTITY_SQL} AND {_POSTGRES_CONFIRMED} IS NULL AND l.first_attempt < %(before)s
    AND /*staged:%(entity)s*/ TRUE
"""
_POSTGRES_UNCONFIRMED = f"""
SELECT l.k, l.first_attempt, l.owner {_POSTGRES_IN_DOUBT}
ORDER BY l.first_attempt, {KEY_ORDER_SQL}
LIMIT %(limit)s OFFSET %(offset)s
"""
_POSTGRES_COUNT_UNCONFIRMED = f"SELECT count(*) {_POSTGRES_IN_DOUBT}"
_POSTGRES_ACTIVITY = f"""
SELECT l.owner, max(l.confirmed_at) FROM sendonce_ledger AS l
WHERE {IN_ENTITY_SQL} AND l.owner = ANY(%(owners)s) AND l.outcome IS DISTINCT FROM 'resolved'
GROUP BY l.owner
"""
_STAGED_MARK = re.compile(r"/\*staged:([^*]+)\*/ TRUE")


def _in_entity(entity: str) -> dict[str, Any]:
    """The query parameters naming ``entity``'s keys in the PostgreSQL store."""
    key = name_key(entity)
    return {"entity": key, **entity_range(key)}


def _is_sqlite(store: LedgerStore) -> bool:
    from ._sqlite import SQLiteStore

    return isinstance(store, SQLiteStore)


def _query(
    store: LedgerStore,
    sqlite_sql: str,
    postgres_sql: str,
    params: tuple[Any, ...] | dict[str, Any],
) -> list[tuple[Any, ...]]:
    if _is_sqlite(store):

        def work(conn: Any) -> list[tuple[Any, ...]]:
            return list(conn.execute(sqlite_sql, params).fetchall())

        rows: list[tuple[Any, ...]] = store.read(work)  # type: ignore[attr-defined]
        return rows
    if type(store).__name__ == "PostgresStore":
        staging = getattr(store, "stages", False)
        postgres_sql = _STAGED_MARK.sub(
            lambda m: _POSTGRES_NOT_STAGED.format(entity=m[1]) if staging else "TRUE",
            postgres_sql,
        )

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


_BEFORE_ALL = datetime(9999, 1, 1, tzinfo=UTC)


def _us(moment: datetime) -> int:
    from ._sqlite import _us as to_micros

    return to_micros(moment)


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
