"""The PostgreSQL ledger store: one server shared by every producer host and Spark executor.

Through psycopg 3 (``pip install 'sendonce[postgres]'``). Each primitive is one short
transaction; the intents of a transfer are one ``INSERT ... ON CONFLICT ... RETURNING``
statement, and a whole transfer's confirmation one row of ``sendonce_ledger_transfers``
(by its owner token). A connection lost mid-call is
reopened and the call retried (tenacity): every primitive is idempotent, and intents
a lost attempt did commit come back carrying this call's owner token, so they are
recognised as ours.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import tenacity

from .._extras import requires_extra
from ..errors import ConfigurationError, LedgerError, redact
from ._store import Confirmation, Entry, Key

with requires_extra("the PostgreSQL ledger", "postgres"):
    import psycopg

__all__ = ["PostgresStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sendonce_ledger (
    entity text NOT NULL,
    message_id text NOT NULL,
    partition_key text NOT NULL,
    digest bytea NOT NULL,
    first_attempt timestamptz NOT NULL,
    owner text NOT NULL,
    confirmed_at timestamptz,
    outcome text,
    PRIMARY KEY (entity, message_id, partition_key)
);
CREATE INDEX IF NOT EXISTS sendonce_ledger_age ON sendonce_ledger (first_attempt);
CREATE TABLE IF NOT EXISTS sendonce_ledger_transfers (
    entity text NOT NULL,
    owner text NOT NULL,
    confirmed_at timestamptz NOT NULL,
    PRIMARY KEY (entity, owner)
);
CREATE INDEX IF NOT EXISTS sendonce_ledger_transfers_age
    ON sendonce_ledger_transfers (confirmed_at);
"""
# A whole transfer's confirmation is one row of sendonce_ledger_transfers (its owner
# token): no update of every key (an MVCC update rewrites each row and its indexes).
# A key's own confirmed_at/outcome, where set, wins (duplicates, partial transfers,
# keys resent by a later transfer, and every row of the first table-only format).
_CONFIRMED = "coalesce(l.confirmed_at, t.confirmed_at)"
_OUTCOME = "coalesce(l.outcome, CASE WHEN t.owner IS NOT NULL THEN 'sent' END)"
_TRANSFER = "LEFT JOIN sendonce_ledger_transfers AS t ON t.entity = l.entity AND t.owner = l.owner"
_INTENTS = f"""
WITH written AS (
    INSERT INTO sendonce_ledger AS l
        (entity, message_id, partition_key, digest, first_attempt, owner)
    SELECT %(entity)s, u.m, u.p, u.d, %(at)s, %(owner)s
    FROM unnest(%(mids)s::text[], %(pks)s::text[], %(digests)s::bytea[]) AS u(m, p, d)
    ON CONFLICT (entity, message_id, partition_key) DO UPDATE SET owner = l.owner
    RETURNING l.entity, l.message_id, l.partition_key, l.digest, l.first_attempt, l.owner,
        l.confirmed_at, l.outcome, (l.xmax = 0) AS inserted
)
SELECT l.message_id, l.partition_key, l.digest, l.first_attempt, l.owner, {_CONFIRMED},
    {_OUTCOME}
FROM written AS l {_TRANSFER}
WHERE NOT l.inserted
"""
_CONFIRM = """
UPDATE sendonce_ledger AS l SET confirmed_at = %(at)s, outcome = u.o
FROM unnest(%(mids)s::text[], %(pks)s::text[], %(outcomes)s::text[]) AS u(m, p, o)
WHERE l.entity = %(entity)s AND l.message_id = u.m AND l.partition_key = u.p
"""
_CONFIRM_TRANSFERS = """
INSERT INTO sendonce_ledger_transfers (entity, owner, confirmed_at)
SELECT %(entity)s, o, %(at)s FROM unnest(%(owners)s::text[]) AS o
ON CONFLICT (entity, owner) DO NOTHING
"""
_RELEASE = """
DELETE FROM sendonce_ledger AS l
USING unnest(%(mids)s::text[], %(pks)s::text[]) AS u(m, p)
WHERE l.entity = %(entity)s AND l.message_id = u.m AND l.partition_key = u.p
    AND l.owner = %(owner)s AND l.confirmed_at IS NULL AND NOT EXISTS (
        SELECT 1 FROM sendonce_ledger_transfers AS t
        WHERE t.entity = l.entity AND t.owner = l.owner)
"""
_LOOKUP = f"""
SELECT l.message_id, l.partition_key, l.digest, l.first_attempt, l.owner, {_CONFIRMED},
    {_OUTCOME}
FROM sendonce_ledger AS l
JOIN unnest(%(mids)s::text[], %(pks)s::text[]) AS u(m, p)
    ON l.message_id = u.m AND l.partition_key = u.p
{_TRANSFER}
WHERE l.entity = %(entity)s
"""
_PRUNE = """
DELETE FROM sendonce_ledger WHERE ctid IN (
    SELECT ctid FROM sendonce_ledger WHERE first_attempt < %(before)s
    ORDER BY first_attempt LIMIT %(limit)s)
"""
# Once no key older than ``before`` is left, no transfer confirmed before it has keys
# (a key's first attempt precedes its transfer's confirmation).
_PRUNE_TRANSFERS = """
DELETE FROM sendonce_ledger_transfers WHERE ctid IN (
    SELECT ctid FROM sendonce_ledger_transfers WHERE confirmed_at < %(before)s
    ORDER BY confirmed_at LIMIT %(limit)s)
"""


def _entries(rows: list[tuple[Any, ...]]) -> dict[Key, Entry]:
    found: dict[Key, Entry] = {}
    for mid, pk, digest, first, owner, confirmed, outcome in rows:
        key = Key(mid, pk)
        found[key] = Entry(key, bytes(digest), first, owner, confirmed, outcome)
    return found


def _keys(keys: Sequence[Key]) -> dict[str, list[str]]:
    return {"mids": [k[0] for k in keys], "pks": [k[1] for k in keys]}


class PostgresStore:
    """Ledger rows in a PostgreSQL table (``sendonce_ledger``, created if missing)."""

    def __init__(self, url: str, *, connect_timeout: float = 10.0, attempts: int = 3) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError(
                "a PostgreSQL ledger url starts with postgresql://", field="ledger"
            )
        self.url = url
        self.connect_timeout = connect_timeout
        self.attempts = attempts
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._run(self._create_schema)

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.url)!r})"

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            self._conn = None
            conn = psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout))
            )
            self._conn = conn
        return conn

    def _run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """One transaction, retried on a fresh connection when the connection is lost."""
        if self._closed:
            raise ConfigurationError("this ledger store is closed", field="ledger")

        def attempt() -> T:
            with self._lock:
                conn = self._connect()
                try:
                    with conn.transaction():
                        return work(conn)
                except psycopg.OperationalError:
                    conn.close()  # lost or broken: the next attempt reconnects
                    self._conn = None
                    raise

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(psycopg.OperationalError),
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )
        try:
            return retrying(attempt)
        except psycopg.Error as exc:
            raise LedgerError(
                f"ledger {redact(self.url)!r} failed ({type(exc).__name__}: {exc})"
            ) from None

    @staticmethod
    def _create_schema(conn: psycopg.Connection[Any]) -> None:
        # Many executors may start at once: serialise the CREATEs.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('sendonce_ledger'))")
        conn.execute(_SCHEMA)

    def record_intents(
        self,
        entity: str,
        keys: Sequence[Key],
        digests: Sequence[bytes],
        *,
        first_attempt: datetime,
        owner: str,
        confirm: Confirmation | None = None,
    ) -> dict[Key, Entry]:
        if not keys:
            return {}
        params = {
            "entity": entity,
            "at": first_attempt,
            "owner": owner,
            **_keys(keys),
            "digests": list(digests),
        }

        def work(conn: psycopg.Connection[Any]) -> dict[Key, Entry]:
            if confirm:
                self._confirm(conn, entity, confirm, first_attempt)
            return _entries(conn.execute(_INTENTS, params).fetchall())

        return self._run(work)

    @staticmethod
    def _confirm(
        conn: psycopg.Connection[Any], entity: str, confirmation: Confirmation, at: datetime
    ) -> None:
        transfers, outcomes = confirmation
        if transfers:
            conn.execute(
                _CONFIRM_TRANSFERS, {"entity": entity, "at": at, "owners": list(transfers)}
            )
        if outcomes:
            keys = list(outcomes)
            conn.execute(
                _CONFIRM,
                {
                    "entity": entity,
                    "at": at,
                    **_keys(keys),
                    "outcomes": [outcomes[k] for k in keys],
                },
            )

    def confirm(self, entity: str, confirmation: Confirmation, at: datetime) -> None:
        if confirmation:
            self._run(lambda conn: self._confirm(conn, entity, confirmation, at))

    def release(self, entity: str, keys: Sequence[Key], owner: str) -> None:
        self._run(
            lambda conn: conn.execute(_RELEASE, {"entity": entity, "owner": owner, **_keys(keys)})
        )

    def lookup(self, entity: str, keys: Sequence[Key]) -> dict[Key, Entry]:
        return self._run(
            lambda conn: _entries(
                conn.execute(_LOOKUP, {"entity": entity, **_keys(keys)}).fetchall()
            )
        )

    def prune(self, before: datetime, limit: int) -> int:
        def work(conn: psycopg.Connection[Any]) -> int:
            params = {"before": before, "limit": limit}
            deleted: int = conn.execute(_PRUNE, params).rowcount
            if deleted < limit:
                conn.execute(_PRUNE_TRANSFERS, params)
            return deleted

        return self._run(work)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
