"""Scheduled messages: where they wait, and their activation when due.

Service Bus appends a scheduled message at activation "as if it had been
enqueued at the current instant", with a new sequence number
(https://learn.microsoft.com/azure/service-bus-messaging/message-sequencing#scheduled-messages);
the number returned by the schedule request identifies the message only while
it waits (to cancel it). A topic keeps its scheduled messages until due and fans
them out then, to the subscriptions that exist at that moment
(https://learn.microsoft.com/azure/service-bus-messaging/message-browsing).

So a message scheduled for later is stored once per entity under the ``sub``
key :data:`PENDING` (no subscription name holds a ``/``), with its schedule
request's sequence number. Every write transaction that hands out messages or
sequence numbers (send, schedule, cancel, receive, accepting a session) first
calls :func:`activate`, which moves the due ones into the queue (or each
subscription) under new numbers, enqueued at their scheduled time: the move is
one transaction on the shared file, so it happens exactly once whichever
process or door (``local://`` or the emulator) triggers it, and in the order
Service Bus would have produced. Reads never write: they show due messages as
:func:`due` numbers them, which is what the next activation stores.

No index orders the waiting messages by due time (it would cost a schema
change), so each entity keeps the earliest due time of its waiting messages in
the ``meta`` table (:func:`note_waiting`): every write checks that one row, and
only an entity with a message due scans its waiting ones. The hint may be
early (after a cancel), never late.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..._entity import EntityProfile
from ._entities import SUBSCRIPTIONS, dead_letter_sessionless
from ._received import ROW_COLUMNS

__all__ = ["PENDING", "activate", "due", "due_count", "has_due_session", "note_waiting"]

PENDING = "/$Scheduled"
"""The ``sub`` key of an entity's scheduled messages not yet activated."""

_MOVED = (
    "message_id, partition_key, session_id, body, extra, scheduled, raw, dl_reason, dl_description"
)
_DUE = "eid = ? AND sub = '" + PENDING + "' AND visible <= ?"
_DUE_ORDER = " ORDER BY visible, seq"


def _hint_key(eid: int) -> str:
    return f"scheduled_due:{eid}"


def note_waiting(conn: sqlite3.Connection, eid: int, earliest: int) -> None:
    """Record that a message of the entity waits until ``earliest`` (µs)."""
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE "
        "SET value = min(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
        (_hint_key(eid), earliest),
    )


def _anything_due(conn: sqlite3.Connection, eid: int, now: int) -> bool:
    """Whether a waiting message of the entity may be due (the hint has passed)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (_hint_key(eid),)).fetchone()
    return row is not None and int(row[0]) <= now


def _renew_hint(conn: sqlite3.Connection, eid: int) -> None:
    (earliest,) = conn.execute(
        f"SELECT min(visible) FROM messages WHERE eid = ? AND sub = '{PENDING}'", (eid,)
    ).fetchone()
    if earliest is None:
        conn.execute("DELETE FROM meta WHERE key = ?", (_hint_key(eid),))
    else:
        conn.execute("UPDATE meta SET value = ? WHERE key = ?", (earliest, _hint_key(eid)))


def targets(conn: sqlite3.Connection, eid: int, profile: EntityProfile) -> list[str]:
    """The ``sub`` keys a message of the entity goes to now: the queue, or each subscription."""
    if profile.kind == "topic":
        return [r[0] for r in conn.execute(SUBSCRIPTIONS, (eid,))]
    return [""]


def activate(conn: sqlite3.Connection, eid: int, now: int) -> int:
    """Append the entity's due scheduled messages under new sequence numbers; how many.

    Run inside a write transaction, before the caller reads the entity's next
    sequence number or its available messages. Oldest due first (ties: the
    schedule order); each is enqueued at its scheduled time, so its time to
    live counts from its activation. As a send does, a sessionless topic
    dead-letters the copies without a session id that its sessionful
    subscriptions get.
    """
    if not _anything_due(conn, eid, now):
        return 0
    due_rows = conn.execute(f"SELECT seq FROM messages WHERE {_DUE}{_DUE_ORDER}", (eid, now))
    old = [r[0] for r in due_rows.fetchall()]
    if not old:
        _renew_hint(conn, eid)  # early: what it announced was cancelled or purged
        return 0
    base, kind, sessions = conn.execute(
        "SELECT next_seq, profile ->> '$.kind', profile ->> '$.sessions' FROM entities "
        "WHERE eid = ?",
        (eid,),
    ).fetchone()
    conn.execute("UPDATE entities SET next_seq = next_seq + ? WHERE eid = ?", (len(old), eid))
    insert = (
        f"INSERT INTO messages (eid, sub, seq, enqueued, visible, {_MOVED}) "
        f"SELECT eid, ?, ?, scheduled, scheduled, {_MOVED} FROM messages "
        f"WHERE eid = ? AND sub = '{PENDING}' AND seq = ?"
    )
    subs = [r[0] for r in conn.execute(SUBSCRIPTIONS, (eid,))] if kind == "topic" else [""]
    for sub in subs:
        conn.executemany(insert, [(sub, base + i, eid, seq) for i, seq in enumerate(old)])
    if kind == "topic" and not sessions:
        dead_letter_sessionless(conn, eid, base, base + len(old) - 1)
    conn.executemany(
        f"DELETE FROM messages WHERE eid = ? AND sub = '{PENDING}' AND seq = ?",
        [(eid, seq) for seq in old],
    )
    _renew_hint(conn, eid)
    return len(old)


def due(
    conn: sqlite3.Connection, eid: int, next_seq: int, now: int, session_id: str | None = None
) -> list[tuple[Any, ...]]:
    """The due, not yet activated messages as ``ROW_COLUMNS`` rows, as activation would store them.

    For reads, which cannot activate (a read-only handle, a peek): each row has
    the sequence number and enqueued time the next activation gives it.
    """
    if not _anything_due(conn, eid, now):
        return []
    rows = conn.execute(
        f"SELECT {ROW_COLUMNS} FROM messages WHERE {_DUE}{_DUE_ORDER}", (eid, now)
    ).fetchall()
    shown = []
    for i, row in enumerate(rows):
        if session_id is not None and row[3] != session_id:
            continue
        scheduled = row[7]
        # seq, ..., enqueued (6), scheduled (7), then no lock and no delivery yet.
        shown.append((next_seq + i, *row[1:6], scheduled, scheduled, None, None, 0, *row[11:]))
    return shown


def due_count(conn: sqlite3.Connection, eid: int, now: int, session_id: str | None = None) -> int:
    """How many due messages wait for activation (of one session, when given)."""
    if not _anything_due(conn, eid, now):
        return 0
    sql = f"SELECT count(*) FROM messages WHERE {_DUE}"
    params: list[Any] = [eid, now]
    if session_id is not None:
        sql += " AND session_id = ?"
        params.append(session_id)
    return int(conn.execute(sql, params).fetchone()[0])


def has_due_session(conn: sqlite3.Connection, eid: int, sub: str, now: int) -> bool:
    """Whether a due message waits for activation in a session no live lock holds on ``sub``."""
    if not _anything_due(conn, eid, now):
        return False
    row = conn.execute(
        f"SELECT 1 FROM messages AS m WHERE m.eid = ?1 AND m.sub = '{PENDING}' "
        "AND m.visible <= ?3 AND m.session_id IS NOT NULL AND NOT EXISTS ("
        "SELECT 1 FROM session_locks AS l WHERE l.eid = ?1 AND l.sub = ?2 "
        "AND l.session_id = m.session_id AND l.locked_until > ?3) LIMIT 1",
        (eid, sub, now),
    ).fetchone()
    return row is not None
