"""The PostgreSQL ledger store: one server shared by every producer host and Spark executor.

Through psycopg 3 (``pip install 'sendonce[postgres]'``). Each primitive is one short
transaction; a key is one packed ``bytea`` (schema 3, :mod:`._pgkeys`); the intents of a
transfer are one plain ``INSERT`` (every key new, the usual case), else one
``INSERT ... ON CONFLICT ... RETURNING`` that returns the rows found, and a whole
transfer's confirmation one row of ``sendonce_ledger_transfers`` (by its owner token). A
connection lost mid-call is reopened and the call retried (tenacity): every primitive is
idempotent, and intents a lost attempt did commit come back carrying this call's owner
token, so they are recognised as ours.

Rows are written and locked in one canonical order (the packed key's bytes), so two
producers writing overlapping keys in different orders wait for each other instead of
deadlocking. The schema is created once per database and recorded by a
version row (``sendonce_ledger_meta``); an open (every Spark task's) only reads that row,
so it never waits behind a producer's open write transaction as DDL would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import tenacity

from .._extras import requires_extra
from .._names import name_key
from ..errors import ConfigurationError, LedgerError, redact
from ._pgkeys import entity_prefix, packed_keys, unpack_key
from ._store import Confirmation, Entry, Key

with requires_extra("the PostgreSQL ledger", "postgres"):
    import psycopg

__all__ = ["PostgresStore"]

T = TypeVar("T")
_MESSAGE_ID = itemgetter(0)
_PARTITION_KEY = itemgetter(1)

logger = logging.getLogger("sendonce.ledger")

SCHEMA_VERSION = "3"
"""The version row's value. A database written before the row existed has version 1's
tables: its first open adopts it (creating whatever is missing) and upgrades it.
Version 2: entity names ignore case, as on Service Bus; the ``entity`` columns hold the
name with its ASCII letters in lower case (:func:`~sendonce._names.name_key`).
Version 3: a key is one packed ``bytea`` column (:func:`packed_key`) instead of three text
columns, and the age index is a BRIN index: a third of the server's work per key."""
CONNECT_TIMEOUT = 10.0
ATTEMPTS = 3

# Version 3. ``k`` packs (entity, partition key, message id) into one bytea: the entity's
# UTF-8 bytes and the partition key's, each after its length in two bytes (big-endian),
# then the message id's. Lengths make it injective (two distinct keys never pack alike)
# and the entity part self-delimiting, so an entity's keys are one range of the index.
# Against the three text columns of version 2 (a collation-aware comparison per column,
# the canonical order in COLLATE "C" beside it) the key index compares bytes. The age
# index is BRIN: first attempts grow with the heap, pruning and the inspection queries
# only need "older than", and a BRIN entry is kept per range of pages, not per key.
_KEYS_TABLE = """
CREATE TABLE IF NOT EXISTS sendonce_ledger (
    k bytea NOT NULL,
    digest bytea NOT NULL,
    first_attempt timestamptz NOT NULL,
    owner text NOT NULL,
    confirmed_at timestamptz,
    outcome text,
    CONSTRAINT sendonce_ledger_k PRIMARY KEY (k)
);
CREATE INDEX IF NOT EXISTS sendonce_ledger_age ON sendonce_ledger USING brin (first_attempt)
    WITH (autosummarize = on);
"""
_OTHER_TABLES = """
CREATE TABLE IF NOT EXISTS sendonce_ledger_transfers (
    entity text NOT NULL,
    owner text NOT NULL,
    confirmed_at timestamptz NOT NULL,
    PRIMARY KEY (entity, owner)
);
CREATE INDEX IF NOT EXISTS sendonce_ledger_transfers_age
    ON sendonce_ledger_transfers (confirmed_at);
CREATE TABLE IF NOT EXISTS sendonce_ledger_meta (key text PRIMARY KEY, value text NOT NULL);
"""
_SCHEMA = _KEYS_TABLE + _OTHER_TABLES
# Versions 1 and 2 (one key: three text columns). Only to adopt a database of version 1
# that has no version row, before upgrading it.
_SCHEMA_2 = (
    """
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
"""
    + _OTHER_TABLES
)
# Staged intents (see ``SQLiteStore.arm``): a transfer whose intents were written ahead and
# will not be sent before its writer arms it, by deleting its row here. ``taken``: another
# writer took some of its keys over (its writer found them after a crash it assumed), so
# its arm fails. Added beside schema 2 without a version change: a producer of an earlier
# version ignores the table and reads a staged key as another producer's unconfirmed
# intent (never sent by it: in doubt, never duplicated).
_STAGED_TABLE = """
CREATE TABLE IF NOT EXISTS sendonce_ledger_staged (
    entity text NOT NULL,
    owner text NOT NULL,
    staged_at timestamptz NOT NULL,
    taken boolean NOT NULL DEFAULT false,
    PRIMARY KEY (entity, owner)
)
"""
_HAS_STAGED_TABLE = "SELECT to_regclass('sendonce_ledger_staged') IS NOT NULL"
_VERSION = "SELECT value FROM sendonce_ledger_meta WHERE key = 'schema_version'"
# name_key in SQL: ASCII letters only, whatever the database's collation (lower() folds
# by locale), so a name means the same entity here, in Python and in the local broker.
_FOLD = "translate({}, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')"
_NAMES = "SELECT entity FROM sendonce_ledger UNION SELECT entity FROM sendonce_ledger_transfers"
_SPELLINGS = f"""
SELECT a.entity, b.entity FROM ({_NAMES}) AS a JOIN ({_NAMES}) AS b
    ON {_FOLD.format("a.entity")} = {_FOLD.format("b.entity")} AND a.entity < b.entity
ORDER BY a.entity COLLATE "C", b.entity COLLATE "C"
LIMIT 1
"""
_UPGRADE_FROM_1 = [
    f"UPDATE {table} SET entity = {_FOLD.format('entity')} WHERE entity <> {_FOLD.format('entity')}"
    for table in ("sendonce_ledger", "sendonce_ledger_transfers")
]
_RECORD_VERSION = """
INSERT INTO sendonce_ledger_meta (key, value) VALUES ('schema_version', %(version)s)
ON CONFLICT (key) DO UPDATE SET value = excluded.value
"""


def _length_sql(text: str) -> str:
    """SQL: the UTF-8 length of ``text`` in two bytes, big-endian (as :func:`packed_key`)."""
    return f"substring(int4send(octet_length(convert_to({text}, 'UTF8'))) from 3)"


# packed_key in SQL, over a version-2 row (its entity already folded by version 2).
_PACK_SQL = (
    f"{_length_sql('entity')} || convert_to(entity, 'UTF8') || {_length_sql('partition_key')}"
    " || convert_to(partition_key, 'UTF8') || convert_to(message_id, 'UTF8')"
)
# Version 2 to 3, in one transaction: every row moves as it is (owner, first attempt,
# digest, confirmation), so an unconfirmed intent stays one with the same deadline and
# a staged one stays staged (its row in sendonce_ledger_staged is untouched). The old
# table is locked first: a producer of version 2 mid-write finishes before the copy, and
# one writing after it fails (the table it names has no such columns): nothing is sent
# without an intent this version reads.
_UPGRADE_FROM_2 = [
    "LOCK TABLE sendonce_ledger IN ACCESS EXCLUSIVE MODE",
    "ALTER TABLE sendonce_ledger RENAME TO sendonce_ledger_v2",
    "ALTER INDEX IF EXISTS sendonce_ledger_age RENAME TO sendonce_ledger_v2_age",
    _KEYS_TABLE.split(";")[0],
    "INSERT INTO sendonce_ledger (k, digest, first_attempt, owner, confirmed_at, outcome) "
    f"SELECT {_PACK_SQL}, digest, first_attempt, owner, confirmed_at, outcome "
    "FROM sendonce_ledger_v2 ORDER BY first_attempt",
    "DROP TABLE sendonce_ledger_v2",
    _KEYS_TABLE.split(";")[1],
]

# A whole transfer's confirmation is one row of sendonce_ledger_transfers (its owner
# token): no update of every key (an MVCC update rewrites each row and its indexes).
# A key's own confirmed_at/outcome, where set, wins (duplicates, partial transfers,
# keys resent by a later transfer, and every row of the first table-only format).
_CONFIRMED = "coalesce(l.confirmed_at, t.confirmed_at)"
_OUTCOME = "coalesce(l.outcome, CASE WHEN t.owner IS NOT NULL THEN 'sent' END)"
_TRANSFER = (
    "LEFT JOIN sendonce_ledger_transfers AS t ON t.entity = %(entity)s AND t.owner = l.owner"
)
# A key of a staged transfer reads outcome 'staged' (or 'taken'), as in the SQLite store.
_STAGED_OUTCOME = (
    "coalesce(l.outcome, CASE WHEN t.owner IS NOT NULL THEN 'sent' "
    "WHEN s.owner IS NOT NULL THEN CASE WHEN s.taken THEN 'taken' ELSE 'staged' END END)"
)
_STAGED_JOIN = (
    "LEFT JOIN sendonce_ledger_staged AS s ON s.entity = %(entity)s AND s.owner = l.owner"
)
# Every statement writes and locks keys in the order of their packed bytes: producers
# writing overlapping keys in different orders wait for each other, never deadlock.
# The usual write: every key new. A plain INSERT (no ON CONFLICT: its speculative
# insertion costs the server ~3 µs a key); a key that already has a row aborts it with a
# unique violation, and the write is made again as _INTENTS, which returns those rows.
_NEW_INTENTS = """
INSERT INTO sendonce_ledger (k, digest, first_attempt, owner)
SELECT u.k, u.d, %(at)s, %(owner)s
FROM unnest(%(ks)b::bytea[], %(digests)b::bytea[]) AS u(k, d)
ORDER BY u.k
"""
# The same write with its keys as two texts (message ids, partition keys) joined by a
# unit separator (U+001F) and its digests as one bytea, one after the other: psycopg
# dumps an array element by element in Python (~1.2 µs a key for two arrays), a text or
# a bytea at once; the server packs each key as packed_key does (the entity's part given).
DIGEST_SIZE = 9
"""The size of a body digest the ledger writes (a format byte and xxh3-64)."""
_NEW_INTENTS_JOINED = f"""
INSERT INTO sendonce_ledger (k, digest, first_attempt, owner)
SELECT u.k, substring(%(digest_run)s from u.i::int * {DIGEST_SIZE} - {DIGEST_SIZE - 1}
    for {DIGEST_SIZE}), %(at)s, %(owner)s
FROM (
    SELECT %(prefix)s::bytea || substring(int4send(octet_length(convert_to(p, 'UTF8')))
        from 3) || convert_to(p, 'UTF8') || convert_to(m, 'UTF8') AS k, i
    FROM unnest(string_to_array(%(mids_joined)s, E'\\x1f'),
        string_to_array(%(pks_joined)s, E'\\x1f')) WITH ORDINALITY AS x(m, p_or_null, i),
        LATERAL (SELECT coalesce(p_or_null, '') AS p) AS pk
) AS u
ORDER BY u.k
"""
_SEPARATOR = "\x1f"


def _joined(keys: Sequence[Key], digests: Sequence[bytes]) -> dict[str, object] | None:
    """The parameters of ``_NEW_INTENTS_JOINED``, or None where a key holds the separator
    or a NUL, or a digest is of another size (the arrays carry those)."""
    mids = _SEPARATOR.join(map(_MESSAGE_ID, keys))
    pks = _SEPARATOR.join(map(_PARTITION_KEY, keys))
    run = b"".join(digests)
    count = len(keys) - 1
    if (
        len(run) != DIGEST_SIZE * len(keys)
        or mids.count(_SEPARATOR) != count
        or pks.count(_SEPARATOR) != count
        or "\x00" in mids
        or "\x00" in pks
    ):
        return None
    return {"mids_joined": mids, "pks_joined": pks, "digest_run": run}


_INTENTS = f"""
WITH written AS (
    INSERT INTO sendonce_ledger AS l (k, digest, first_attempt, owner)
    SELECT u.k, u.d, %(at)s, %(owner)s
    FROM unnest(%(ks)b::bytea[], %(digests)b::bytea[]) AS u(k, d)
    ORDER BY u.k
    ON CONFLICT (k) DO UPDATE SET owner = l.owner
    RETURNING l.k, l.digest, l.first_attempt, l.owner, l.confirmed_at, l.outcome,
        (l.xmax = 0) AS inserted
)
SELECT l.k, l.digest, l.first_attempt, l.owner, {_CONFIRMED}, {_OUTCOME}
FROM written AS l {_TRANSFER}
WHERE NOT l.inserted
"""
# UPDATE and DELETE take no ORDER BY: their rows are locked first, in key order.
_CONFIRM = """
WITH locked AS (
    SELECT l.ctid AS rid, u.o FROM sendonce_ledger AS l
    JOIN unnest(%(ks)b::bytea[], %(outcomes)b::text[]) AS u(k, o) ON l.k = u.k
    ORDER BY l.k
    FOR UPDATE OF l
)
UPDATE sendonce_ledger AS l SET confirmed_at = %(at)s, outcome = locked.o
FROM locked WHERE l.ctid = locked.rid
"""
_CONFIRM_TRANSFERS = """
INSERT INTO sendonce_ledger_transfers (entity, owner, confirmed_at)
SELECT %(entity)s, o, %(at)s FROM unnest(%(owners)b::text[]) AS o
ORDER BY o COLLATE "C"
ON CONFLICT (entity, owner) DO NOTHING
"""
_RELEASE = """
WITH locked AS (
    SELECT l.ctid AS rid FROM sendonce_ledger AS l
    JOIN unnest(%(ks)b::bytea[]) AS u(k) ON l.k = u.k
    WHERE l.owner = %(owner)s AND l.confirmed_at IS NULL
    ORDER BY l.k
    FOR UPDATE OF l
)
DELETE FROM sendonce_ledger AS l USING locked
WHERE l.ctid = locked.rid AND NOT EXISTS (
    SELECT 1 FROM sendonce_ledger_transfers AS t
    WHERE t.entity = %(entity)s AND t.owner = l.owner)
"""
_LOOKUP = f"""
SELECT l.k, l.digest, l.first_attempt, l.owner, {_CONFIRMED}, {_OUTCOME}
FROM sendonce_ledger AS l
JOIN unnest(%(ks)b::bytea[]) AS u(k) ON l.k = u.k
{_TRANSFER}
"""
_LOOKUP_STAGED = f"""
SELECT l.k, l.digest, l.first_attempt, l.owner, {_CONFIRMED}, {_STAGED_OUTCOME}
FROM sendonce_ledger AS l
JOIN unnest(%(ks)b::bytea[]) AS u(k) ON l.k = u.k
{_TRANSFER} {_STAGED_JOIN}
"""
_STAGE = """
INSERT INTO sendonce_ledger_staged (entity, owner, staged_at) VALUES (%(entity)s, %(owner)s, %(at)s)
ON CONFLICT (entity, owner) DO NOTHING
"""
# Takes over the keys given (those met unconfirmed, with this body) whose writer staged them
# and never armed them: they move to this writer, and the stager's arm fails. The staged
# rows are locked after the keys (every statement locks keys first), so no cycle forms.
_TAKE_STAGED = """
WITH locked AS (
    SELECT ctid AS rid FROM sendonce_ledger_staged
    WHERE entity = %(entity)s AND owner = ANY(%(owners)b::text[])
    ORDER BY owner COLLATE "C"
    FOR UPDATE
), taken AS (
    UPDATE sendonce_ledger_staged AS s SET taken = true FROM locked
    WHERE s.ctid = locked.rid
    RETURNING s.owner
)
UPDATE sendonce_ledger AS l SET owner = %(owner)s, first_attempt = %(at)s
FROM unnest(%(ks)b::bytea[], %(digests)b::bytea[]) AS u(k, d)
WHERE l.k = u.k AND l.digest = u.d AND l.confirmed_at IS NULL
    AND l.owner IN (SELECT owner FROM taken)
RETURNING l.k
"""
# Armed: its staged row goes; none left (taken over, or never staged here) is not armed.
_ARM = """
DELETE FROM sendonce_ledger_staged
WHERE entity = %(entity)s AND owner = %(owner)s AND NOT taken
"""
_PRUNE_STAGED = """
DELETE FROM sendonce_ledger_staged WHERE ctid IN (
    SELECT ctid FROM sendonce_ledger_staged WHERE staged_at < %(before)s
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""
# Pruning is housekeeping: it skips rows a producer holds (they go next time) rather than
# wait for them, so it can neither stall nor deadlock a writer. Any keys older than the
# retention go (the BRIN age index finds them; which of them first does not matter).
_PRUNE = """
DELETE FROM sendonce_ledger WHERE ctid IN (
    SELECT ctid FROM sendonce_ledger WHERE first_attempt < %(before)s
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""
# Once no key older than ``before`` is left, no transfer confirmed before it has keys
# (a key's first attempt precedes its transfer's confirmation).
_NO_OLD_KEY = "SELECT NOT EXISTS (SELECT 1 FROM sendonce_ledger WHERE first_attempt < %(before)s)"
_PRUNE_TRANSFERS = """
DELETE FROM sendonce_ledger_transfers WHERE ctid IN (
    SELECT ctid FROM sendonce_ledger_transfers WHERE confirmed_at < %(before)s
    ORDER BY confirmed_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""


def _entries(rows: list[tuple[Any, ...]]) -> dict[Key, Entry]:
    found: dict[Key, Entry] = {}
    for packed, digest, first, owner, confirmed, outcome in rows:
        key = unpack_key(packed)
        found[key] = Entry(key, bytes(digest), first, owner, confirmed, outcome)
    return found


def _take_over(
    conn: psycopg.Connection[Any],
    params: dict[str, Any],
    found: dict[Key, Entry],
    keys: Sequence[Key],
    digests: Sequence[bytes],
) -> None:
    """Take over the keys of ``found`` another writer staged and never armed, with the same
    body; they leave ``found`` (new to this transfer)."""
    owner = params["owner"]
    mine = dict(zip(keys, digests, strict=True))
    candidates = [
        key
        for key, row in found.items()
        if row.confirmed_at is None and row.owner != owner and row.digest == mine.get(key)
    ]
    if not candidates:
        return
    taken = conn.execute(
        _TAKE_STAGED,
        {
            **params,
            "owners": sorted({found[k].owner for k in candidates}),
            "ks": packed_keys(params["entity"], candidates),
            "digests": [mine[k] for k in candidates],
        },
    ).fetchall()
    for (packed,) in taken:
        found.pop(unpack_key(packed), None)


class _KeyExists(Exception):
    """The plain insert of a write met a key that has a row: write it again, reading rows."""


def _has_ledger_table(conn: psycopg.Connection[Any]) -> bool:
    """Whether the database holds a ledger (one of the first format has no version row)."""
    row = conn.execute("SELECT to_regclass('sendonce_ledger') IS NOT NULL").fetchone()
    return bool(row and row[0])


def _connect_options(url: str) -> tuple[str, dict[str, str]]:
    """The url for libpq (without sendonce's own ``attempts``) and the options it carried."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = dict(query)
    kept = [(name, value) for name, value in query if name != "attempts"]
    return urlunsplit(parts._replace(query=urlencode(kept))), options


def _option(
    options: dict[str, str], name: str, given: float | None, default: float, url: str
) -> float:
    """A connect option: given to the constructor, else from the url, else the default."""
    if given is None and name not in options:
        return default
    value: object = given if given is not None else options[name]
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = float("nan")
    if not number >= 1 or (name == "attempts" and not number.is_integer()):
        what = "an integer >= 1" if name == "attempts" else "a number of seconds >= 1"
        raise ConfigurationError(
            f"ledger url {redact(url)!r}: {name} must be {what}, not {value!r}", field="ledger"
        )
    return number


class PostgresStore:
    """Ledger rows in a PostgreSQL table (``sendonce_ledger``, created if missing).

    Entity names ignore case (``Orders`` is ``orders``), as on Service Bus.

    ``connect_timeout`` (seconds per connection attempt, default 10) and ``attempts``
    (tries per call on a lost connection, default 3) are also read from the url
    (``postgresql://host/db?connect_timeout=5&attempts=2``), so executors that open
    the url get them; an argument given here wins over the url.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float | None = None,
        attempts: int | None = None,
        create: bool = True,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError(
                "a PostgreSQL ledger url starts with postgresql://", field="ledger"
            )
        self.url = url
        self._conninfo, options = _connect_options(url)
        self.connect_timeout = _option(
            options, "connect_timeout", connect_timeout, CONNECT_TIMEOUT, url
        )
        self.attempts = int(_option(options, "attempts", attempts, ATTEMPTS, url))
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._create = create
        self.created = False
        """Whether this open created the ledger's tables (the database had none)."""
        self._staging = False
        self._expect_new = True
        """Whether the next intent write tries the plain insert (every key new) first."""
        self._run(self._ensure_schema)
        if create:
            self._staging = self._run(self._ensure_staged_table)
        else:
            self._staging = self._run(
                lambda conn: conn.execute(_HAS_STAGED_TABLE).fetchone() == (True,)
            )

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.url)!r})"

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            self._conn = None
            conn = psycopg.connect(
                self._conninfo, autocommit=True, connect_timeout=max(1, int(self.connect_timeout))
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
            before_sleep=self._retrying,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except psycopg.Error as exc:
            raise LedgerError(
                f"ledger {redact(self.url)!r} failed ({type(exc).__name__}: {exc})"
            ) from None

    def _retrying(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        first = str(exc).splitlines()[0] if exc is not None and str(exc) else ""
        logger.warning(
            "ledger %s: %s (%s); retrying (attempt %d of %d)",
            redact(self.url),
            type(exc).__name__,
            first,
            state.attempt_number + 1,
            self.attempts,
        )

    @staticmethod
    def _schema_version(conn: psycopg.Connection[Any]) -> str | None:
        exists = conn.execute("SELECT to_regclass('sendonce_ledger_meta') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute(_VERSION).fetchone()
        return None if row is None else str(row[0])

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        """Read the version row; create or upgrade the schema only when it is not current.

        DDL such as ``CREATE INDEX IF NOT EXISTS`` waits behind any open write
        transaction on the table; a read of the version row waits for nothing.
        """
        version = self._schema_version(conn)
        if version in (None, "1", "2"):
            # Many executors may start at once: serialise the changes, then look again.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('sendonce_ledger'))")
            version = self._schema_version(conn)
            if version is None and not _has_ledger_table(conn):
                if not self._create:
                    raise ConfigurationError(
                        f"database {redact(self.url)!r} holds no sendonce ledger "
                        "(create=True creates its tables there)",
                        field="ledger",
                    )
                self.created = True
                conn.execute(_SCHEMA)
                conn.execute(_RECORD_VERSION, {"version": SCHEMA_VERSION})
                version = SCHEMA_VERSION
            if version is None:
                conn.execute(_SCHEMA_2)  # a database of version 1 without its row: adopted
                version = "1"
            if version == "1":
                self._upgrade_from_1(conn)
                version = "2"
            if version == "2":
                self._upgrade_from_2(conn)
                version = SCHEMA_VERSION
        if version != SCHEMA_VERSION:
            raise ConfigurationError(
                f"ledger {redact(self.url)!r} has schema version {version!r}; this sendonce "
                f"reads {SCHEMA_VERSION!r}",
                field="ledger",
            )

    @staticmethod
    def _ensure_staged_table(conn: psycopg.Connection[Any]) -> bool:
        """Create the staged-transfers table if missing; whether intents can be staged here
        (False where this user may not create it: intents are then never written ahead)."""
        if conn.execute(_HAS_STAGED_TABLE).fetchone() == (True,):
            return True
        try:
            with conn.transaction():  # a savepoint: a refusal leaves the rest usable
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('sendonce_ledger'))")
                conn.execute(_STAGED_TABLE)
        except psycopg.errors.InsufficientPrivilege:
            return False
        return True

    @property
    def stages(self) -> bool:
        """Whether intents can be staged (written ahead, unsent) and armed later."""
        return self._staging

    def _upgrade_from_1(self, conn: psycopg.Connection[Any]) -> None:
        """Entity names as their case-insensitive key; two names of one entity are refused.

        Stop producers of earlier versions first: one still running keeps writing names
        as given (a process of an earlier version that opens the ledger later is refused).
        """
        clash = conn.execute(_SPELLINGS).fetchone()
        if clash is not None:
            raise ConfigurationError(
                f"ledger {redact(self.url)!r} holds keys of entities {clash[0]!r} and "
                f"{clash[1]!r}, whose names differ only by case. From ledger schema "
                "2 entity names ignore case, as on Service Bus (where both "
                "name one entity), and this sendonce does not merge two names' keys: use the "
                "ledger with the sendonce version that wrote it until one name's keys are "
                "pruned (Ledger.prune after the retention), then open it again",
                field="ledger",
            )
        for statement in _UPGRADE_FROM_1:
            conn.execute(statement)
        conn.execute(_RECORD_VERSION, {"version": "2"})

    @staticmethod
    def _upgrade_from_2(conn: psycopg.Connection[Any]) -> None:
        """Keys packed in one column (version 3), every row kept as it was.

        In the opening transaction, after the advisory lock: the old table is locked, so a
        producer of version 2 mid-write commits first (its rows are copied) and one writing
        afterwards fails (its columns are gone), sending nothing; one that opens afterwards
        is refused (``has schema version '3'``). Unconfirmed, staged and confirmed keys stay
        what they were: nothing in doubt becomes a resend.
        """
        for statement in _UPGRADE_FROM_2:
            conn.execute(statement)
        conn.execute(_RECORD_VERSION, {"version": SCHEMA_VERSION})

    def record_intents(
        self,
        entity: str,
        keys: Sequence[Key],
        digests: Sequence[bytes],
        *,
        first_attempt: datetime,
        owner: str,
        confirm: Confirmation | None = None,
        staged: bool = False,
    ) -> dict[Key, Entry]:
        """See ``LedgerStore.record_intents``; ``staged``: see :meth:`arm`.

        Keys another writer staged and never armed, with the same body, are taken over
        (moved to this transfer, reported as new): that writer never sent them, and its
        arm now fails, so it never will.
        """
        if not keys:
            return {}
        if staged and not self._staging:
            raise ConfigurationError(
                "this PostgreSQL ledger cannot stage intents (no sendonce_ledger_staged table)",
                field="ledger",
            )
        entity = name_key(entity)
        params: dict[str, Any] = {"entity": entity, "at": first_attempt, "owner": owner}
        joined = _joined(keys, digests) if self._expect_new else None
        if joined is not None:
            new_intents = _NEW_INTENTS_JOINED
            fast = {**params, **joined, "prefix": entity_prefix(entity)}
        else:
            new_intents = _NEW_INTENTS
            params.update(ks=packed_keys(entity, keys), digests=list(digests))
            fast = params
        staging = self._staging

        def write(conn: psycopg.Connection[Any], new: bool) -> dict[Key, Entry]:
            if confirm:
                self._confirm(conn, entity, confirm, first_attempt)
            if staged:  # before its keys: whoever sees them sees them staged
                conn.execute(_STAGE, params, prepare=True)
            if new:
                try:
                    conn.execute(new_intents, fast)
                except psycopg.errors.UniqueViolation:
                    raise _KeyExists from None  # the transaction is rolled back
                return {}
            if "ks" not in params:
                params.update(ks=packed_keys(entity, keys), digests=list(digests))
            found = _entries(conn.execute(_INTENTS, params).fetchall())
            if found and staging:
                _take_over(conn, params, found, keys, digests)
            return found

        if self._expect_new:
            try:
                return self._run(lambda conn: write(conn, True))
            except _KeyExists:  # rolled back: written again, returning the rows that exist
                self._expect_new = False
        found = self._run(lambda conn: write(conn, False))
        # Keys that exist come in runs (a re-run, a resumed input): the plain insert is
        # tried again only once a write found none, so a re-run aborts one insert, not each.
        self._expect_new = not found
        return found

    def arm(self, entity: str, owner: str, confirm: Confirmation | None, at: datetime) -> bool:
        """Make ``owner``'s staged intents plain intents, with ``confirm``, in one transaction.

        False: some of them were taken over meanwhile (they are the taker's now; send none).
        """
        key = name_key(entity)
        params = {"entity": key, "owner": owner}

        def work(conn: psycopg.Connection[Any]) -> bool:
            if confirm:
                self._confirm(conn, key, confirm, at)
            return bool(conn.execute(_ARM, params, prepare=True).rowcount)  # keys first, then this

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
                    "at": at,
                    "ks": packed_keys(entity, keys),
                    "outcomes": [outcomes[k] for k in keys],
                },
            )

    def confirm(self, entity: str, confirmation: Confirmation, at: datetime) -> None:
        if confirmation:
            key = name_key(entity)
            self._run(lambda conn: self._confirm(conn, key, confirmation, at))

    def release(self, entity: str, keys: Sequence[Key], owner: str) -> None:
        key = name_key(entity)
        params = {"entity": key, "owner": owner, "ks": packed_keys(key, keys)}
        self._run(lambda conn: conn.execute(_RELEASE, params))

    def lookup(self, entity: str, keys: Sequence[Key]) -> dict[Key, Entry]:
        key = name_key(entity)
        params = {"entity": key, "ks": packed_keys(key, keys)}
        query = _LOOKUP_STAGED if self._staging else _LOOKUP
        return self._run(lambda conn: _entries(conn.execute(query, params).fetchall()))

    def prune(self, before: datetime, limit: int) -> int:
        def work(conn: psycopg.Connection[Any]) -> int:
            params = {"before": before, "limit": limit}
            deleted: int = conn.execute(_PRUNE, params).rowcount
            if deleted < limit and conn.execute(_NO_OLD_KEY, params).fetchone() == (True,):
                conn.execute(_PRUNE_TRANSFERS, params)  # a skipped key keeps its transfer
                if self._staging:  # a staged row older than every key: none of its keys left
                    conn.execute(_PRUNE_STAGED, params)
            return deleted

        return self._run(work)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
