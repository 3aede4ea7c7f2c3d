"""The broker file's schema: tables, the format marker, and upgrades between versions.

Kept apart from the file-handling code so that the schema can grow (new tables or
columns for new broker features) without touching how the file is opened and shared.
A file written by an older schema version is upgraded in place, inside the first
opener's start-up transaction; a file from a newer version is refused.
"""

from __future__ import annotations

import sqlite3

__all__ = ["FORMAT", "SCHEMA", "SCHEMA_VERSION", "UpgradeRefused", "upgrade"]

FORMAT = "sendonce-broker"
SCHEMA_VERSION = "7"

# Dedup keys live in a WITHOUT ROWID table keyed by (entity, message id, partition
# key): the duplicate check is one indexed point lookup whatever the number of
# live ids. ``stamp`` is the accept time in microseconds; an id whose stamp is
# older than the window is expired (and overwritten by a new send of it) even
# before it is deleted. Expired ids are deleted by a sweep that walks the key
# order from the entity's ``sweep_mid``/``sweep_pkey`` cursor, a bounded slice per
# send: no index orders ids by age, so storing an id writes one B-tree, not two.
# ``first_stamp`` is the earliest stamp any id of the entity got (NULL: none yet):
# until the window has passed it, no id can have expired and no sweep runs.
# A count-bounded cache (Artemis) must forget exactly its oldest ids: those carry
# an insertion ``ordinal``, indexed by the partial ``ids_ordinal`` (time-window
# ids leave it NULL and out of the index). Messages are clustered by (entity,
# subscription, sequence number): the delivery order, with no extra index.
# Entity and subscription names are case-insensitive, as on Service Bus: unique
# NOCASE indexes keep ``ORDERS`` and ``orders`` one name (the name as created is
# what the row keeps), and lookups compare ``name = ? COLLATE NOCASE``. A
# subscription's ``profile`` holds its own settings as JSON (NULL, in a file
# upgraded from version 6: the topic's).
SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE entities (
    eid INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    profile TEXT NOT NULL,
    next_seq INTEGER NOT NULL DEFAULT 1,
    id_count INTEGER NOT NULL DEFAULT 0,
    sweep_mid TEXT NOT NULL DEFAULT '',
    sweep_pkey TEXT NOT NULL DEFAULT '',
    first_stamp INTEGER
);
CREATE UNIQUE INDEX entities_name_nocase ON entities (name COLLATE NOCASE);
CREATE TABLE subscriptions (
    eid INTEGER NOT NULL,
    name TEXT NOT NULL,
    profile TEXT,
    PRIMARY KEY (eid, name)
) WITHOUT ROWID;
CREATE UNIQUE INDEX subscriptions_name_nocase ON subscriptions (eid, name COLLATE NOCASE);
CREATE TABLE ids (
    eid INTEGER NOT NULL,
    mid TEXT NOT NULL,
    pkey TEXT NOT NULL,
    stamp INTEGER NOT NULL,
    ordinal INTEGER,
    PRIMARY KEY (eid, mid, pkey)
) WITHOUT ROWID;
CREATE INDEX ids_ordinal ON ids (eid, ordinal) WHERE ordinal IS NOT NULL;
CREATE TABLE messages (
    eid INTEGER NOT NULL,
    sub TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    partition_key TEXT,
    session_id TEXT,
    body BLOB NOT NULL,
    extra TEXT,
    enqueued INTEGER NOT NULL,
    scheduled INTEGER,
    visible INTEGER NOT NULL,
    locked_until INTEGER,
    lock_token TEXT,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    raw BLOB,
    dl_reason TEXT,
    dl_description TEXT,
    deferred INTEGER,
    PRIMARY KEY (eid, sub, seq)
) WITHOUT ROWID;
CREATE INDEX messages_lock ON messages (lock_token) WHERE lock_token IS NOT NULL;
CREATE TABLE session_states (
    eid INTEGER NOT NULL,
    sub TEXT NOT NULL,
    session_id TEXT NOT NULL,
    state BLOB NOT NULL,
    PRIMARY KEY (eid, sub, session_id)
) WITHOUT ROWID;
CREATE TABLE session_locks (
    eid INTEGER NOT NULL,
    sub TEXT NOT NULL,
    session_id TEXT NOT NULL,
    token TEXT NOT NULL,
    locked_until INTEGER NOT NULL,
    PRIMARY KEY (eid, sub, session_id)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('format', '{FORMAT}'), ('schema_version', '{SCHEMA_VERSION}');
"""


# Upgrades from an older schema version: {from_version: (to_version, sql)}.
# Version 2: a dead-lettered message keeps its reason and description. Dead-letter
# subqueues are rows whose ``sub`` is the queue's or subscription's own ``sub``
# followed by ``/$DeadLetterQueue`` (no subscription name may hold a ``/``).
_UPGRADES: dict[str, tuple[str, str]] = {
    "1": (
        "2",
        "ALTER TABLE messages ADD COLUMN dl_reason TEXT;\n"
        "ALTER TABLE messages ADD COLUMN dl_description TEXT;\n",
    ),
    # Version 3: deferred messages (set to 1) wait for receive_deferred.
    "2": ("3", "ALTER TABLE messages ADD COLUMN deferred INTEGER;\n"),
    # Version 4: session state (get/set_session_state), kept in the file so that it
    # outlives the emulator and is shared with local:// consumers.
    "3": (
        "4",
        "CREATE TABLE session_states (eid INTEGER NOT NULL, sub TEXT NOT NULL,"
        " session_id TEXT NOT NULL, state BLOB NOT NULL,"
        " PRIMARY KEY (eid, sub, session_id)) WITHOUT ROWID;\n",
    ),
    # Version 5: session locks, kept in the file so that every process and both doors
    # (local:// session receivers and the emulator) see who holds a session. A row
    # whose locked_until has passed is a released lock, free for the next receiver.
    "4": (
        "5",
        "CREATE TABLE session_locks (eid INTEGER NOT NULL, sub TEXT NOT NULL,"
        " session_id TEXT NOT NULL, token TEXT NOT NULL, locked_until INTEGER NOT NULL,"
        " PRIMARY KEY (eid, sub, session_id)) WITHOUT ROWID;\n",
    ),
    # Version 6: no age index on the dedup ids (expired ids are found by a sweep over
    # the key order, from a cursor kept per entity, once the oldest id may have expired);
    # the ids of count-bounded caches get their insertion ordinal, which version 5 kept
    # in ``stamp``.
    "5": (
        "6",
        "ALTER TABLE entities ADD COLUMN first_stamp INTEGER;\n"
        "UPDATE entities SET first_stamp = (SELECT min(stamp) FROM ids"
        " WHERE ids.eid = entities.eid);\n"
        "DROP INDEX IF EXISTS ids_age;\n"
        "ALTER TABLE ids ADD COLUMN ordinal INTEGER;\n"
        "UPDATE ids SET ordinal = stamp WHERE eid IN (SELECT eid FROM entities"
        " WHERE profile ->> '$.id_cache_size' IS NOT NULL);\n"
        "CREATE INDEX ids_ordinal ON ids (eid, ordinal) WHERE ordinal IS NOT NULL;\n"
        "ALTER TABLE entities ADD COLUMN sweep_mid TEXT NOT NULL DEFAULT '';\n"
        "ALTER TABLE entities ADD COLUMN sweep_pkey TEXT NOT NULL DEFAULT '';\n",
    ),
    # Version 7: case-insensitive entity and subscription names (Service Bus resource
    # name rules), and each subscription's own settings (NULL: the topic's).
    "6": (
        "7",
        "CREATE UNIQUE INDEX entities_name_nocase ON entities (name COLLATE NOCASE);\n"
        "ALTER TABLE subscriptions ADD COLUMN profile TEXT;\n"
        "CREATE UNIQUE INDEX subscriptions_name_nocase ON subscriptions"
        " (eid, name COLLATE NOCASE);\n",
    ),
}


class UpgradeRefused(Exception):
    """An old file cannot be upgraded as it is; the message says what to change."""


def _refuse_names_differing_by_case(conn: sqlite3.Connection) -> None:
    """Two names that differ only by case cannot become one entity silently."""
    clash = conn.execute(
        "SELECT a.name, b.name FROM entities AS a JOIN entities AS b "
        "ON a.name = b.name COLLATE NOCASE AND a.eid < b.eid ORDER BY a.eid LIMIT 1"
    ).fetchone()
    if clash is not None:
        raise UpgradeRefused(
            f"holds entities {clash[0]!r} and {clash[1]!r}, whose names differ only by case; "
            "entity names are case-insensitive from schema version 7 (as on Service Bus): "
            "delete or rename one of them with the sendonce version that wrote the file"
        )
    clash = conn.execute(
        "SELECT e.name, a.name, b.name FROM subscriptions AS a JOIN subscriptions AS b "
        "ON a.eid = b.eid AND a.name = b.name COLLATE NOCASE AND a.name < b.name "
        "JOIN entities AS e ON e.eid = a.eid LIMIT 1"
    ).fetchone()
    if clash is not None:
        raise UpgradeRefused(
            f"holds subscriptions {clash[1]!r} and {clash[2]!r} of topic {clash[0]!r}, whose "
            "names differ only by case; subscription names are case-insensitive from schema "
            "version 7 (as on Service Bus): delete one of them with the sendonce version that "
            "wrote the file"
        )


# Checks before an upgrade step: {from_version: check}; a check raises UpgradeRefused.
_CHECKS = {"6": _refuse_names_differing_by_case}


def upgrade(conn: sqlite3.Connection, version: str) -> bool:
    """Bring a file at ``version`` up to :data:`SCHEMA_VERSION`; False if it cannot be."""
    while version != SCHEMA_VERSION:
        step = _UPGRADES.get(version)
        if step is None:
            return False
        check = _CHECKS.get(version)
        if check is not None:
            check(conn)
        version, sql = step
        # One statement at a time: executescript would commit the opener's transaction.
        for statement in sql.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
    return True
