"""The relay's side of the outbox table: claim, renew, finish, prune, count.

Every primitive is one statement on an autocommit connection (one round trip, one short
transaction), retried on a fresh connection when the connection is lost (tenacity).

Claiming keeps the order per key. A keyed row may be claimed only as its key's **head**:
the pending row with the lowest sequence number of its (entity, order key). Heads are
claimed with ``FOR UPDATE SKIP LOCKED`` and a lease (``lease_owner``, ``lease_until`` on the
database's clock), so a second relay skips a key while the first holds its head, and takes
it over once the lease has expired. The rows that follow a claimed head are read in
sequence order and leased with it: nobody else claims them while the head is held. A
sequence number is handed out under the key's counter-row lock (see ``_schema``), so a
committed row is never preceded by an uncommitted one of its key: the head a relay sees is
the next row to publish.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import tenacity

from .._extras import requires_extra
from ..errors import ConfigurationError, redact
from ._codec import COLUMNS, MessageDecoder
from ._schema import ensure_schema

with requires_extra("the transactional outbox", "outbox"):
    import psycopg

__all__ = ["ClaimedRow", "DeadRow", "EntityStats", "RelayStore", "Settled", "check_url"]

T = TypeVar("T")
logger = logging.getLogger("sendonce.outbox")

_ROW = (
    "o.id, o.entity, o.okey, o.seq, o.first_attempt, o.attempts, "
    + ", ".join("o." + c for c in COLUMNS)
    + ", o.trace_context"
)
# One statement claims a round: up to ``limit`` heads (and unordered rows) locked with SKIP
# LOCKED, the rows following each head in sequence order (not written: nobody else claims a
# key's rows while its head is leased), and the heads' leases. A head records the last row
# of its key claimed with it (``claimed_through``), so a relay taking over a dead relay's
# key knows which followers may have been sent, and since when (the head's first attempt).
#
# Heads are found by walking the heads index one key at a time (a recursive "loose index
# scan": one probe per key, whatever the rows per key), from where this relay's last claim
# stopped (``cursors``, per entity) round to it again, and only until ``limit`` keys whose
# head is free were found: a claim costs about ``limit`` probes, not one per key or per
# pending row, and every key is reached within one turn. (Testing every pending row for
# being its key's first was one subquery per row: 280 ms of a 370 ms claim of 5,000 rows
# over 1,000 keys; walking every key, 20 ms a claim however few keys it took.) Entities
# take turns in the walk. Unordered rows come from their own index in id order. The
# candidates are then locked; the lock re-reads each row, so one published or leased since
# the walk's snapshot is skipped. Each head's reach (its last follower) is read per head
# through the index, as the followers are: a join of the heads with the followers grouped
# by key was planned as a nested loop on a table without statistics yet (88 ms). The last
# key claimed per entity comes back on the head rows (``next``): the next claim's cursor.
_NEXT_KEY = """
        SELECT * FROM (
            (SELECT p.okey, p.id, p.lease_until, {wrapped} AS wrapped
             FROM sendonce_outbox AS p
             WHERE p.entity = {w}.entity AND p.published_at IS NULL AND p.okey IS NOT NULL
               AND {after}
             ORDER BY p.okey, p.seq LIMIT 1)
            UNION ALL
            (SELECT p.okey, p.id, p.lease_until, true
             FROM sendonce_outbox AS p
             WHERE {may_wrap} AND p.entity = {w}.entity AND p.published_at IS NULL
               AND p.okey IS NOT NULL AND p.okey <= {w}.start
             ORDER BY p.okey, p.seq LIMIT 1)) AS found
        LIMIT 1"""
_FIRST_KEY = _NEXT_KEY.format(
    w="e", wrapped="false", after="(e.start IS NULL OR p.okey > e.start)",
    may_wrap="e.start IS NOT NULL",
)  # fmt: skip
_FOLLOWING_KEY = _NEXT_KEY.format(
    w="w", wrapped="w.wrapped", after="p.okey > w.okey AND (NOT w.wrapped OR p.okey <= w.start)",
    may_wrap="NOT w.wrapped AND w.start IS NOT NULL",
)  # fmt: skip
# Each claimed row comes with the time a row of its entity was published under the same
# id (and, on a partitioned entity, the same partition key) with another body, if one is
# kept (retention): the broker holds that body, and drops this one as a duplicate (or the
# ledger skips it), so the relay moves it aside as a payload conflict instead of counting
# it published. One probe of the published-ids index per row, none found in the usual case.
_PUBLISHED_OTHER = """(
    SELECT min(p.published_at) FROM sendonce_outbox AS p
    WHERE p.entity = {x}.entity AND p.message_id = {x}.message_id
      AND p.published_at IS NOT NULL AND p.body <> {x}.body
      AND (NOT ({x}.entity = ANY(%(partitioned)s::text[]))
           OR coalesce(p.partition_key, p.session_id)
              IS NOT DISTINCT FROM coalesce({x}.partition_key, {x}.session_id)))"""
_CLAIM = f"""
WITH RECURSIVE cursors AS (
    SELECT * FROM unnest(%(entities)s::text[], %(cursors)s::text[]) AS e(entity, start)
), walk AS (
    SELECT e.entity, e.start, k.okey, k.id, k.lease_until, k.wrapped
    FROM cursors AS e CROSS JOIN LATERAL ({_FIRST_KEY}) AS k
    UNION ALL
    SELECT w.entity, w.start, k.okey, k.id, k.lease_until, k.wrapped
    FROM walk AS w CROSS JOIN LATERAL ({_FOLLOWING_KEY}) AS k
), candidates AS (
    (SELECT id FROM walk WHERE lease_until IS NULL OR lease_until < now() LIMIT %(limit)s)
    UNION ALL
    SELECT u.id FROM cursors AS e
    CROSS JOIN LATERAL (
        SELECT p.id FROM sendonce_outbox AS p
        WHERE p.entity = e.entity AND p.published_at IS NULL AND p.okey IS NULL
          AND (p.lease_until IS NULL OR p.lease_until < now())
        ORDER BY p.id LIMIT %(limit)s) AS u
), heads AS (
    SELECT {_ROW}, o.claimed_through AS through_before
    FROM sendonce_outbox AS o
    WHERE o.id = ANY(ARRAY(SELECT id FROM candidates)) AND o.published_at IS NULL
      AND (o.lease_until IS NULL OR o.lease_until < now())
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), followers AS (
    SELECT f.*, NULL::bigint AS through_before, h.first_attempt AS head_attempt,
        h.through_before AS head_through
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT {_ROW} FROM sendonce_outbox AS o
        WHERE h.okey IS NOT NULL AND o.entity = h.entity AND o.okey = h.okey
          AND o.published_at IS NULL AND o.seq > h.seq
        ORDER BY o.seq LIMIT %(per_key)s) AS f
), leased AS (
    UPDATE sendonce_outbox AS o
    SET lease_owner = %(owner)s, lease_until = now() + %(lease)s * interval '1 second',
        first_attempt = coalesce(o.first_attempt, %(now)s), attempts = o.attempts + 1,
        claimed_through = greatest(o.claimed_through, r.through, o.seq)
    FROM heads AS h CROSS JOIN LATERAL (
        SELECT max(x.seq) AS through FROM (
            SELECT p.seq FROM sendonce_outbox AS p
            WHERE h.okey IS NOT NULL AND p.entity = h.entity AND p.okey = h.okey
              AND p.published_at IS NULL AND p.seq > h.seq
            ORDER BY p.seq LIMIT %(per_key)s) AS x) AS r
    WHERE o.id = h.id
), next AS (
    SELECT h.entity, coalesce(
        max(h.okey) FILTER (WHERE e.start IS NOT NULL AND h.okey <= e.start), max(h.okey)
    ) AS okey
    FROM heads AS h JOIN cursors AS e ON e.entity = h.entity
    WHERE h.okey IS NOT NULL
    GROUP BY h.entity
)
SELECT h.*, NULL::timestamptz, NULL::bigint, true, n.okey, {_PUBLISHED_OTHER.format(x="h")}
FROM heads AS h LEFT JOIN next AS n ON n.entity = h.entity
UNION ALL
SELECT f.*, false, NULL::text, {_PUBLISHED_OTHER.format(x="f")} FROM followers AS f
"""
_RENEW = """
UPDATE sendonce_outbox SET lease_until = now() + %(lease)s * interval '1 second'
WHERE id = ANY(%(ids)s::bigint[]) AND lease_owner = %(owner)s AND published_at IS NULL
RETURNING id
"""
_DEAD_COLUMNS = (
    "id, entity, okey, seq, "
    + ", ".join(COLUMNS)
    + ", enqueued_at, first_attempt, attempts, reason, error, trace_context"
)
# One statement settles a round: published rows marked (or deleted with no retention), rows
# that can never be sent moved to sendonce_outbox_dead, the rest released for a later round
# (only those still leased by this relay: a row another relay took over is left to it).
# Each update finds its rows through the primary key (``id = ANY``) as well as joining the
# values: joined alone, a settlement of 500 rows was planned as a scan of the whole table.
_SETTLE = f"""
WITH published AS (
    UPDATE sendonce_outbox AS o
    SET published_at = now(), outcome = u.outcome, sequence_number = u.number,
        lease_owner = NULL, lease_until = NULL, last_error = NULL
    FROM unnest(%(published)s::bigint[], %(outcomes)s::text[], %(numbers)s::bigint[])
        AS u(id, outcome, number)
    WHERE o.id = ANY(%(published)s::bigint[]) AND o.id = u.id AND NOT %(delete_published)s
), deleted AS (
    DELETE FROM sendonce_outbox WHERE %(delete_published)s AND id = ANY(%(published)s::bigint[])
), moved AS (
    DELETE FROM sendonce_outbox WHERE id = ANY(%(dead)s::bigint[])
    RETURNING id, entity, okey, seq, {", ".join(COLUMNS)}, enqueued_at, first_attempt, attempts,
        trace_context
), buried AS (
    INSERT INTO sendonce_outbox_dead ({_DEAD_COLUMNS})
    SELECT m.id, m.entity, m.okey, m.seq, {", ".join("m." + c for c in COLUMNS)},
        m.enqueued_at, m.first_attempt, m.attempts, u.reason, u.error, m.trace_context
    FROM moved AS m
    JOIN unnest(%(dead)s::bigint[], %(reasons)s::text[], %(errors)s::text[])
        AS u(id, reason, error) ON u.id = m.id
    ON CONFLICT (id) DO NOTHING
), released AS (
    UPDATE sendonce_outbox AS o
    SET lease_owner = NULL, lease_until = NULL,
        first_attempt = CASE WHEN u.keep THEN coalesce(o.first_attempt, u.attempted)
                             ELSE u.prior END,
        claimed_through = CASE WHEN u.keep THEN o.claimed_through ELSE u.through END,
        attempts = CASE WHEN u.tried OR NOT u.head THEN o.attempts ELSE o.attempts - 1 END,
        last_error = coalesce(u.error, o.last_error)
    FROM unnest(%(released)s::bigint[], %(keeps)s::boolean[], %(priors)s::timestamptz[],
        %(tried)s::boolean[], %(release_errors)s::text[], %(attempted)s::timestamptz[],
        %(throughs)s::bigint[], %(heads)s::boolean[])
        AS u(id, keep, prior, tried, error, attempted, through, head)
    WHERE o.id = ANY(%(released)s::bigint[]) AND o.id = u.id
      AND (o.lease_owner = %(owner)s OR NOT u.head)
)
SELECT 1
"""
_PRUNE_PUBLISHED = """
DELETE FROM sendonce_outbox WHERE id IN (
    SELECT id FROM sendonce_outbox
    WHERE published_at < now() - %(retention)s * interval '1 second'
    ORDER BY published_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""
# A key's counter row may go once the key has no pending row. Two statements in one
# transaction: lock the candidates first (skipping those a producer holds), then look for
# pending rows in a snapshot taken after the locks are held, so a producer that committed
# rows for the key before we locked it is seen (its rows keep the counter).
_LOCK_IDLE_KEYS = """
SELECT k.entity, k.okey FROM sendonce_outbox_keys AS k
WHERE NOT EXISTS (SELECT 1 FROM sendonce_outbox AS o
                  WHERE o.entity = k.entity AND o.okey = k.okey AND o.published_at IS NULL)
LIMIT %(limit)s FOR UPDATE SKIP LOCKED
"""
_DROP_IDLE_KEYS = """
DELETE FROM sendonce_outbox_keys AS k
USING unnest(%(entities)s::text[], %(okeys)s::text[]) AS u(entity, okey)
WHERE k.entity = u.entity AND k.okey = u.okey AND NOT EXISTS (
    SELECT 1 FROM sendonce_outbox AS o
    WHERE o.entity = k.entity AND o.okey = k.okey AND o.published_at IS NULL)
"""
_STATS = """
SELECT entity,
    count(*) FILTER (WHERE published_at IS NULL
                     AND (lease_until IS NULL OR lease_until < now())) AS pending,
    count(*) FILTER (WHERE published_at IS NULL AND lease_until >= now()) AS leased,
    count(*) FILTER (WHERE published_at IS NOT NULL) AS published,
    extract(epoch FROM now() - min(enqueued_at) FILTER (WHERE published_at IS NULL)) AS lag,
    max(published_at) AS last_published
FROM sendonce_outbox GROUP BY entity
"""
_DEAD_STATS = "SELECT entity, count(*) FROM sendonce_outbox_dead GROUP BY entity"
_DEAD_ROWS = """
SELECT id, entity, message_id, partition_key, session_id, reason, error, dead_at, attempts
FROM sendonce_outbox_dead
WHERE (%(entity)s::text IS NULL OR entity = %(entity)s) ORDER BY id LIMIT %(limit)s
"""
# Back to the end of its key's queue: a fresh sequence number under the key's counter lock.
_REQUEUE = f"""
WITH chosen AS (
    DELETE FROM sendonce_outbox_dead AS d
    WHERE d.entity = %(entity)s AND (%(all)s OR d.message_id = ANY(%(ids)s::text[]))
    RETURNING d.*
), counted AS (
    SELECT okey, count(*) AS n FROM chosen WHERE okey IS NOT NULL GROUP BY okey
), counters AS (
    INSERT INTO sendonce_outbox_keys AS k (entity, okey, last_seq)
    SELECT %(entity)s, okey, n FROM counted ORDER BY okey COLLATE "C"
    ON CONFLICT (entity, okey) DO UPDATE SET last_seq = k.last_seq + excluded.last_seq
    RETURNING k.okey, k.last_seq
), numbered AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.okey ORDER BY c.seq, c.id) AS rank,
        count(*) OVER (PARTITION BY c.okey) AS n
    FROM chosen AS c
), written AS (
    INSERT INTO sendonce_outbox (entity, okey, seq, {", ".join(COLUMNS)}, trace_context)
    SELECT %(entity)s, m.okey, k.last_seq - m.n + m.rank, {", ".join("m." + c for c in COLUMNS)},
        m.trace_context
    FROM numbered AS m LEFT JOIN counters AS k ON k.okey = m.okey
    ORDER BY m.id
    RETURNING message_id
)
SELECT message_id, pg_notify('sendonce_outbox', %(entity)s) FROM written
"""


def check_url(url: object) -> str:
    """The outbox url, if it names PostgreSQL; a ``ConfigurationError`` otherwise."""
    if not isinstance(url, str) or not url.strip().startswith(("postgresql://", "postgres://")):
        shown = redact(url) if isinstance(url, str) else type(url).__name__
        raise ConfigurationError(
            f"the outbox lives in PostgreSQL: its url starts with postgresql://, not {shown!r}",
            field="outbox",
        )
    return url.strip()


class ClaimedRow(NamedTuple):
    """A row leased by this relay: its message, key, number, and when it was first tried.

    A named tuple: a claim builds thousands, and a tuple costs a fraction of a frozen
    dataclass to build."""

    id: int
    entity: str
    okey: str | None
    seq: int | None
    prior_attempt: datetime | None
    """The first attempt before this claim (None: never attempted); a follower of a head
    that a relay claimed before inherits that head's first attempt."""
    attempts: int
    message: Any
    head: bool
    """Claimed as its key's head (or an unordered row): the row holding the lease."""
    through_before: int | None
    """A head's ``claimed_through`` before this claim (restored if nothing was tried)."""
    conflict_at: datetime | None = None
    """When a row with this id and another body was published (kept for the retention);
    None: no such row is kept."""
    trace_context: str | None = None
    """The producer's trace context stored at enqueue (``_telemetry.captured``); None: none."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What one round did with its rows: published, moved aside, released for later."""

    published: list[tuple[int, str, int | None]]
    dead: list[tuple[int, str, str]]
    released: list[tuple[int, bool, datetime | None, bool, str | None, datetime, int | None, bool]]
    """(id, keep the first attempt, prior first attempt, tried, last error, this round's
    attempt time, the head's claimed_through before, head)"""


@dataclass(frozen=True, slots=True)
class EntityStats:
    """One entity's rows (see ``sendonce outbox stats``)."""

    entity: str
    pending: int
    leased: int
    published: int
    dead: int
    lag: float | None
    """Age in seconds of the oldest row not yet published (None: none pending)."""
    last_published: datetime | None


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A row moved aside: it was never published, and says why."""

    id: int
    entity: str
    message_id: str
    partition_key: str | None
    session_id: str | None
    reason: str
    error: str
    dead_at: datetime
    attempts: int


_WIDTH = 7 + len(COLUMNS)  # the row's own columns, its message's and its trace context


def claimed_rows(rows: Sequence[tuple[Any, ...]], decode: MessageDecoder) -> list[ClaimedRow]:
    """The claim's result rows as ``ClaimedRow``s (one tight pass: a claim returns thousands)."""
    out: list[ClaimedRow] = []
    append = out.append
    width = _WIDTH
    for row in rows:
        rid, entity, okey, seq, first, attempts = row[:6]
        through_before, head_attempt, head_through, head, _, conflict_at = row[width:]
        if not head and first is None and head_through is not None and seq <= head_through:
            first = head_attempt  # claimed with its head by a relay that then died
        append(
            ClaimedRow(
                rid,
                entity,
                okey,
                seq,
                first,
                attempts,
                decode(*row[6 : width - 1]),
                head,
                through_before,
                conflict_at,
                row[width - 1],
            )
        )
    return out


class RelayStore:
    """The relay's connection to the outbox (autocommit; reconnected when lost)."""

    def __init__(self, url: str, *, attempts: int = 3, install: bool = True) -> None:
        self.url = check_url(url)
        self.attempts = attempts
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._decode = MessageDecoder()
        self._cursors: dict[str, str] = {}  # per entity: the last key claimed
        self.found_version = self._run(lambda c: self._open_schema(c, install))

    def __repr__(self) -> str:
        return f"RelayStore({redact(self.url)!r})"

    def _open_schema(self, conn: psycopg.Connection[Any], install: bool) -> int:
        with conn.transaction(), conn.cursor() as cursor:
            if install:
                return ensure_schema(cursor, f"outbox {redact(self.url)!r}")
            from ._schema import check_version, read_version

            version = read_version(cursor)
            check_version(version, f"outbox {redact(self.url)!r}")
            assert version is not None
            return version

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            self._conn = None
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
            # The relay runs the same few statements for ever: prepared at once (``prepare``
            # below), and planned once (each is driven by an index whatever its arrays
            # hold). Planning the claim cost 1.1 ms each time against 0.4 ms to run it on a
            # small table: most of a round's database time while a relay keeps up with a
            # trickle of commits. Plans are still redone when the table's statistics change.
            conn.execute("SET plan_cache_mode = force_generic_plan")
            self._conn = conn
        return conn

    def _run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        def attempt() -> T:
            with self._lock:
                conn = self._connect()
                try:
                    return work(conn)
                except psycopg.OperationalError:
                    conn.close()
                    self._conn = None
                    raise

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(psycopg.OperationalError),
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )
        return retrying(attempt)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- the relay's primitives ----------------------------------------------------

    def claim(
        self,
        entities: Sequence[str],
        owner: str,
        *,
        limit: int,
        per_key: int,
        lease: timedelta,
        now: datetime,
        partitioned: Sequence[str] = (),
    ) -> list[ClaimedRow]:
        """Lease up to ``limit`` heads (and unordered rows), then up to ``per_key`` rows
        following each claimed head; in (key, sequence) order for keyed rows. Keys are
        taken in turn: each claim goes on from the key where this store's last one ended.
        ``partitioned``: the entities whose duplicate detection keys on the partition key
        too (a published row conflicts only with rows of its partition key there)."""
        names = list(entities)
        params = {
            "partitioned": list(partitioned),
            "owner": owner,
            "lease": lease.total_seconds(),
            "now": now,
            "entities": names,
            "cursors": [self._cursors.get(name) for name in names],
            "limit": limit,
            "per_key": per_key,
        }
        # Binary results: no hex text to decode for the bodies, nor timestamps to parse.
        rows = self._run(
            lambda conn: conn.execute(_CLAIM, params, binary=True, prepare=True).fetchall()
        )
        for row in rows:  # where the next claim's walk starts, per entity
            if row[_WIDTH + 4] is not None:
                self._cursors[row[1]] = row[_WIDTH + 4]
        claimed = claimed_rows(rows, self._decode)
        claimed.sort(key=lambda r: (r.okey is None, r.entity, r.okey or "", r.seq or r.id))
        return claimed

    def renew(self, ids: Sequence[int], owner: str, lease: timedelta) -> set[int]:
        """Extend this relay's leases; returns the ids it still holds."""
        params = {"ids": list(ids), "owner": owner, "lease": lease.total_seconds()}
        return self._run(lambda conn: {r[0] for r in conn.execute(_RENEW, params, prepare=True)})

    def settle(self, settled: Settled, owner: str, *, delete_published: bool) -> None:
        published, dead, released = settled.published, settled.dead, settled.released
        params = {
            "owner": owner,
            "delete_published": delete_published,
            "published": [p[0] for p in published],
            "outcomes": [p[1] for p in published],
            "numbers": [p[2] for p in published],
            "dead": [d[0] for d in dead],
            "reasons": [d[1] for d in dead],
            "errors": [d[2] for d in dead],
            "released": [r[0] for r in released],
            "keeps": [r[1] for r in released],
            "priors": [r[2] for r in released],
            "tried": [r[3] for r in released],
            "release_errors": [r[4] for r in released],
            "attempted": [r[5] for r in released],
            "throughs": [r[6] for r in released],
            "heads": [r[7] for r in released],
        }
        self._run(lambda conn: conn.execute(_SETTLE, params, prepare=True))

    def prune(self, retention: timedelta, limit: int) -> int:
        """Drop published rows older than ``retention`` and idle key counters; rows removed."""

        def work(conn: psycopg.Connection[Any]) -> int:
            params = {"retention": retention.total_seconds(), "limit": limit}
            removed: int = conn.execute(_PRUNE_PUBLISHED, params).rowcount
            with conn.transaction():
                idle = conn.execute(_LOCK_IDLE_KEYS, {"limit": limit}).fetchall()
                if idle:
                    conn.execute(
                        _DROP_IDLE_KEYS,
                        {"entities": [i[0] for i in idle], "okeys": [i[1] for i in idle]},
                    )
            return removed

        return self._run(work)

    # -- what an operator reads --------------------------------------------------------

    def stats(self) -> list[EntityStats]:
        def work(conn: psycopg.Connection[Any]) -> list[EntityStats]:
            rows = conn.execute(_STATS).fetchall()
            dead = dict(conn.execute(_DEAD_STATS).fetchall())
            found = {
                r[0]: EntityStats(r[0], r[1], r[2], r[3], dead.get(r[0], 0), _seconds(r[4]), r[5])
                for r in rows
            }
            for entity, count in dead.items():
                if entity not in found:
                    found[entity] = EntityStats(entity, 0, 0, 0, count, None, None)
            return [found[name] for name in sorted(found)]

        return self._run(work)

    def dead_rows(self, entity: str | None, limit: int) -> list[DeadRow]:
        params = {"entity": entity, "limit": limit}
        rows = self._run(lambda conn: conn.execute(_DEAD_ROWS, params).fetchall())
        return [DeadRow(*r) for r in rows]

    def requeue(self, entity: str, message_ids: Sequence[str] | None) -> list[str]:
        """Move dead rows back to the end of their keys' queues; the ids requeued."""
        params = {"entity": entity, "all": message_ids is None, "ids": list(message_ids or ())}

        def work(conn: psycopg.Connection[Any]) -> list[str]:
            with conn.transaction():
                return [r[0] for r in conn.execute(_REQUEUE, params).fetchall()]

        return self._run(work)


def _seconds(value: Any) -> float | None:
    return None if value is None else max(float(value), 0.0)
