"""The outbox's tables in PostgreSQL, created and migrated by sendonce, versioned like the ledger's.

- ``sendonce_outbox``: one row per message enqueued, from the caller's transaction until the
  relay has published it (then marked ``published_at``, and pruned after the retention;
  while kept, a later row with the same id and another body is a payload conflict).
- ``sendonce_outbox_keys``: one row per order key (entity + session id, else partition key)
  holding the last sequence number handed out. ``enqueue`` increments it in the caller's
  transaction, so the row stays locked until that transaction ends: a second transaction on
  the same key waits there, and takes its numbers only after the first has committed (or
  rolled back, undoing its increment). Numbers per key therefore follow commit order.
- ``sendonce_outbox_dead``: rows that can never be sent (too large, refused by the broker,
  in doubt past the broker's window), moved aside with their reason so they block nothing.
- ``trace_context`` (both tables): the enqueuing transaction's W3C trace context, in a column
  of its own so the message (body, properties, size) is stored exactly as given; the relay
  decides whether it fits on the message when it sends it.
- ``sendonce_outbox_meta``: the schema version row. Every open reads it; only a database
  without it runs DDL (under an advisory lock, so many relays starting at once agree).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError

__all__ = ["SCHEMA_VERSION", "check_version", "ensure_schema", "read_version"]

SCHEMA_VERSION = 5
"""The outbox schema this sendonce reads and writes. An older database is migrated on open
(``_MIGRATIONS``); a newer one is refused with a ``ConfigurationError``. Version 2 added
``claimed_through`` (a claimed head names the last row of its key claimed with it, so only
heads are written at claim time) and a fill factor that leaves room for HOT lease updates.
Version 3 indexes the pending rows without a key on their own (the claim walks keyed rows
through the heads index), in place of an index of every pending row. Version 4 indexes the
published rows by (entity, message id): a relay looks up the row it published under a
pending row's id, to move a second body for that id aside as a payload conflict. Version 5
adds ``trace_context`` to the outbox and its dead rows: the W3C trace context of the span
current when the row was enqueued (NULL when telemetry was off, and for rows enqueued
before version 5), which the relay links to and forwards in the message it sends."""

_CREATE = """
CREATE TABLE IF NOT EXISTS sendonce_outbox (
    id bigserial PRIMARY KEY,
    entity text NOT NULL,
    okey text,
    seq bigint,
    message_id text NOT NULL,
    body bytea NOT NULL,
    body_is_text boolean NOT NULL,
    partition_key text,
    session_id text,
    subject text,
    content_type text,
    correlation_id text,
    properties text,
    time_to_live_us bigint,
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_owner text,
    lease_until timestamptz,
    first_attempt timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    published_at timestamptz,
    outcome text,
    sequence_number bigint,
    claimed_through bigint,
    trace_context text,
    CHECK ((okey IS NULL) = (seq IS NULL))
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS sendonce_outbox_unordered
    ON sendonce_outbox (entity, id) WHERE published_at IS NULL AND okey IS NULL;
CREATE INDEX IF NOT EXISTS sendonce_outbox_heads
    ON sendonce_outbox (entity, okey, seq) WHERE published_at IS NULL AND okey IS NOT NULL;
CREATE INDEX IF NOT EXISTS sendonce_outbox_published
    ON sendonce_outbox (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS sendonce_outbox_published_ids
    ON sendonce_outbox (entity, message_id) WHERE published_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS sendonce_outbox_keys (
    entity text NOT NULL,
    okey text NOT NULL,
    last_seq bigint NOT NULL,
    PRIMARY KEY (entity, okey)
);
CREATE TABLE IF NOT EXISTS sendonce_outbox_dead (
    id bigint PRIMARY KEY,
    entity text NOT NULL,
    okey text,
    seq bigint,
    message_id text NOT NULL,
    body bytea NOT NULL,
    body_is_text boolean NOT NULL,
    partition_key text,
    session_id text,
    subject text,
    content_type text,
    correlation_id text,
    properties text,
    time_to_live_us bigint,
    enqueued_at timestamptz NOT NULL,
    first_attempt timestamptz,
    attempts integer NOT NULL,
    reason text NOT NULL,
    error text NOT NULL,
    dead_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    trace_context text
);
CREATE TABLE IF NOT EXISTS sendonce_outbox_meta (key text PRIMARY KEY, value text NOT NULL);
"""
_RECORD_VERSION = """
INSERT INTO sendonce_outbox_meta (key, value) VALUES ('schema_version', %(version)s)
ON CONFLICT (key) DO UPDATE SET value = excluded.value
"""
_MIGRATIONS: dict[int, str] = {
    1: """
    ALTER TABLE sendonce_outbox ADD COLUMN IF NOT EXISTS claimed_through bigint;
    ALTER TABLE sendonce_outbox SET (fillfactor = 70);
    """,
    2: """
    CREATE INDEX IF NOT EXISTS sendonce_outbox_unordered
        ON sendonce_outbox (entity, id) WHERE published_at IS NULL AND okey IS NULL;
    DROP INDEX IF EXISTS sendonce_outbox_pending;
    """,
    3: """
    CREATE INDEX IF NOT EXISTS sendonce_outbox_published_ids
        ON sendonce_outbox (entity, message_id) WHERE published_at IS NOT NULL;
    """,
    # A nullable column without a default: a change of the catalog only, whatever the
    # table holds (no rewrite, no scan); the rows already there read NULL (no context).
    4: """
    ALTER TABLE sendonce_outbox ADD COLUMN IF NOT EXISTS trace_context text;
    ALTER TABLE sendonce_outbox_dead ADD COLUMN IF NOT EXISTS trace_context text;
    """,
}
"""From version N to N+1: the DDL to run."""


def read_version(cursor: Any) -> int | None:
    """The schema version recorded in this database, or None when the outbox is not there.

    ``cursor`` is a DB-API cursor (psycopg's, or the one under a SQLAlchemy connection).
    ``to_regclass`` never fails, so the caller's transaction is never aborted by the check.
    """
    cursor.execute("SELECT to_regclass('sendonce_outbox_meta') IS NOT NULL")
    row = cursor.fetchone()
    if not row or not row[0]:
        return None
    cursor.execute("SELECT value FROM sendonce_outbox_meta WHERE key = 'schema_version'")
    found = cursor.fetchone()
    if found is None:
        return None
    try:
        return int(found[0])
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"the outbox's schema version row holds {found[0]!r}, not a number: this is not a "
            "table sendonce wrote",
            field="outbox",
        ) from None


def check_version(version: int | None, where: str) -> None:
    """Refuse a database this sendonce cannot use (missing, or of a newer schema)."""
    if version is None:
        raise ConfigurationError(
            f"{where} has no sendonce outbox: create it with sendonce.outbox.install(...) (or "
            "`sendonce outbox install URL`), or start a relay on it once",
            field="outbox",
        )
    if version > SCHEMA_VERSION:
        raise ConfigurationError(
            f"{where} has outbox schema version {version}; this sendonce knows versions up to "
            f"{SCHEMA_VERSION}: upgrade sendonce (nothing was read or written)",
            field="outbox",
        )
    if version < SCHEMA_VERSION:
        raise ConfigurationError(
            f"{where} has outbox schema version {version}, older than this sendonce's "
            f"{SCHEMA_VERSION}: start a relay (or `sendonce outbox install URL`) to migrate it",
            field="outbox",
        )


def ensure_schema(cursor: Any, where: str) -> int:
    """Create or migrate the outbox in the cursor's transaction; return the version found.

    Reads the version row first; only a database without it, or of an older version, runs
    DDL, under a transaction-scoped advisory lock so concurrent installers agree.
    """
    version = read_version(cursor)
    if version == SCHEMA_VERSION:
        return version
    if version is not None and version > SCHEMA_VERSION:
        check_version(version, where)
    cursor.execute("SELECT pg_advisory_xact_lock(hashtext('sendonce_outbox'))")
    version = read_version(cursor)
    found = version
    if version is None:
        cursor.execute(_CREATE)
        version = SCHEMA_VERSION
    elif version > SCHEMA_VERSION:
        check_version(version, where)
    while version < SCHEMA_VERSION:
        cursor.execute(_MIGRATIONS[version])
        version += 1
    cursor.execute(_RECORD_VERSION, {"version": str(version)})
    return found if found is not None else 0
