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
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..._entity import EntityProfile
from ._entities import SUBSCRIPTIONS, dead_letter_sessionless
from ._received import ROW_COLUMNS

__all__ = ["PENDING", "activate", "due", "due_count", "has_due_session"]

PENDING = "/$Scheduled"
"""The ``sub`` key of an entity's scheduled messages not yet activated."""

_MOVED = (
    "message_id, partition_key, session_id, body, extra, scheduled, raw, dl_reason, dl_description"
)
_DUE = "eid = ? AND sub = '" + PENDING + "' AND visible <= ?"
_DUE_ORDER = " ORDER BY visible, seq"


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
    due_rows = conn.execute(f"SELECT seq FROM messages WHERE {_DUE}{_DUE_ORDER}", (eid, now))
    old = [r[0] for r in due_rows.fetchall()]
    if not old:
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
    return len(old)


def due(
    conn: sqlite3.Connection, eid: int, next_seq: int, now: int, session_id: str | None = None
) -> list[tuple[Any, ...]]:
    """The due, not yet activated messages as ``ROW_COLUMNS`` rows, as activation would store them.

    For reads, which cannot activate (a read-only handle, a peek): each row has
    the sequence number and enqueued time the next activation gives it.
    """
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
    sql = f"SELECT count(*) FROM messages WHERE {_DUE}"
    params: list[Any] = [eid, now]
    if session_id is not None:
        sql += " AND session_id = ?"
        params.append(session_id)
    return int(conn.execute(sql, params).fetchone()[0])


def has_due_session(conn: sqlite3.Connection, eid: int, sub: str, now: int) -> bool:
    """Whether a due message waits for activation in a session no live lock holds on ``sub``."""
    row = conn.execute(
        f"SELECT 1 FROM messages AS m WHERE m.eid = ?1 AND m.sub = '{PENDING}' "
        "AND m.visible <= ?3 AND m.session_id IS NOT NULL AND NOT EXISTS ("
        "SELECT 1 FROM session_locks AS l WHERE l.eid = ?1 AND l.sub = ?2 "
        "AND l.session_id = m.session_id AND l.locked_until > ?3) LIMIT 1",
        (eid, sub, now),
    ).fetchone()
    return row is not None
