"""Session locks in the broker file: who holds a session, until when.

Service Bus locks a session to one receiver at a time
(https://learn.microsoft.com/azure/service-bus-messaging/message-sessions). The
locks live in the broker file (table ``session_locks``), so every process and
both doors to the broker (``local://`` and the emulator) see them. A holder is
identified by a random token, not by its process or connection: two handles of one
process (which share one SQLite connection) compete like two processes do.
"""

from __future__ import annotations

import sqlite3

from ._errors import SessionCannotBeLockedError, SessionLockLostError


def where(entity: str, subscription: str | None, session_id: str) -> str:
    place = entity if subscription is None else f"{entity}/Subscriptions/{subscription}"
    return f"session {session_id!r} of {place!r}"


def holder(conn: sqlite3.Connection, eid: int, sub: str, session_id: str, now: int) -> str | None:
    """The token of the live lock on a session, or None when no one holds it."""
    row = conn.execute(
        "SELECT token FROM session_locks WHERE eid = ? AND sub = ? AND session_id = ? "
        "AND locked_until > ?",
        (eid, sub, session_id, now),
    ).fetchone()
    return None if row is None else str(row[0])


def acquire(
    conn: sqlite3.Connection, eid: int, sub: str, session_id: str, token: str, until: int, now: int
) -> bool:
    """Lock a session for ``token`` until ``until``; False when another live lock holds it."""
    cur = conn.execute(
        "INSERT INTO session_locks (eid, sub, session_id, token, locked_until) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (eid, sub, session_id) DO UPDATE SET "
        "token = excluded.token, locked_until = excluded.locked_until "
        "WHERE session_locks.locked_until <= ? OR session_locks.token = excluded.token",
        (eid, sub, session_id, token, until, now),
    )
    return cur.rowcount > 0


def refuse_if_locked(
    conn: sqlite3.Connection,
    eid: int,
    sub: str,
    session_id: str,
    now: int,
    entity: str,
    subscription: str | None,
) -> None:
    """For receivers that hold no session: a session someone holds is not theirs to take."""
    if holder(conn, eid, sub, session_id, now) is not None:
        raise cannot_lock(entity, subscription, session_id)


def cannot_lock(
    entity: str, subscription: str | None, session_id: str
) -> SessionCannotBeLockedError:
    return SessionCannotBeLockedError(
        f"{where(entity, subscription, session_id)} cannot be locked: another receiver holds "
        "it (until it closes its session or the lock expires)",
        entity=entity,
        session_id=session_id,
    )


def check_held(
    conn: sqlite3.Connection,
    eid: int,
    sub: str,
    session_id: str,
    token: str,
    now: int,
    entity: str,
    subscription: str | None,
) -> int:
    """When ``token``'s live lock on the session expires; :class:`SessionLockLostError` if lost."""
    row = conn.execute(
        "SELECT locked_until FROM session_locks WHERE eid = ? AND sub = ? AND session_id = ? "
        "AND token = ? AND locked_until > ?",
        (eid, sub, session_id, token, now),
    ).fetchone()
    if row is None:
        raise lock_lost(entity, subscription, session_id)
    return int(row[0])


def lock_lost(entity: str, subscription: str | None, session_id: str) -> SessionLockLostError:
    return SessionLockLostError(
        f"the lock on {where(entity, subscription, session_id)} is lost: it expired (it was "
        "not renewed within the lock duration) or the session was closed; accept the session "
        "again",
        entity=entity,
        session_id=session_id,
    )


def renew(
    conn: sqlite3.Connection, eid: int, sub: str, session_id: str, token: str, until: int, now: int
) -> bool:
    """Extend a live lock and the locks of the session's locked messages; False if lost."""
    cur = conn.execute(
        "UPDATE session_locks SET locked_until = ? WHERE eid = ? AND sub = ? AND session_id = ? "
        "AND token = ? AND locked_until > ?",
        (until, eid, sub, session_id, token, now),
    )
    if cur.rowcount == 0:
        return False
    conn.execute(
        "UPDATE messages SET locked_until = ? WHERE eid = ? AND sub = ? AND session_id = ? "
        "AND lock_token IS NOT NULL AND locked_until > ?",
        (until, eid, sub, session_id, now),
    )
    return True


def release(
    conn: sqlite3.Connection, eid: int, sub: str, session_id: str, token: str, now: int
) -> None:
    """Drop ``token``'s lock; if it was live, its unsettled messages become available again."""
    live = conn.execute(
        "DELETE FROM session_locks WHERE eid = ? AND sub = ? AND session_id = ? AND token = ? "
        "AND locked_until > ?",
        (eid, sub, session_id, token, now),
    ).rowcount
    conn.execute(
        "DELETE FROM session_locks WHERE eid = ? AND sub = ? AND session_id = ? AND token = ?",
        (eid, sub, session_id, token),
    )
    if live:
        # Service Bus: closing a session receiver releases the session and the
        # messages it received but did not settle (their delivery was counted).
        conn.execute(
            "UPDATE messages SET lock_token = NULL, locked_until = NULL WHERE eid = ? AND sub = ? "
            "AND session_id = ? AND lock_token IS NOT NULL AND locked_until > ?",
            (eid, sub, session_id, now),
        )


# A session for NEXT_AVAILABLE_SESSION: the one of the oldest available message that
# no live lock holds. (Only sessionful entities have session locks.)
NEXT_SESSION = (
    "SELECT m.session_id FROM messages AS m WHERE m.eid = ?1 AND m.sub = ?2 "
    "AND m.session_id IS NOT NULL AND m.visible <= ?3 "
    "AND (m.locked_until IS NULL OR m.locked_until <= ?3) AND m.deferred IS NULL "
    "AND NOT EXISTS (SELECT 1 FROM session_locks AS l WHERE l.eid = m.eid AND l.sub = m.sub "
    "AND l.session_id = m.session_id AND l.locked_until > ?3) ORDER BY m.seq LIMIT 1"
)

# Messages of sessions that someone holds are not for receivers without the session.
NOT_IN_LOCKED_SESSION = (
    " AND (session_id IS NULL OR NOT EXISTS (SELECT 1 FROM session_locks AS l "
    "WHERE l.eid = messages.eid AND l.sub = messages.sub AND l.session_id = messages.session_id "
    "AND l.locked_until > ?))"
)
