"""Session locks in the broker file, and ``LocalSession``: a receiver that holds one session.

Service Bus locks a session to one receiver at a time
(https://learn.microsoft.com/azure/service-bus-messaging/message-sessions): a second
receiver asking for the same session gets *session cannot be locked*; a
``NEXT_AVAILABLE_SESSION`` receiver gets a session that no one holds and that has
a message available; the lock lasts the entity's lock duration unless renewed, and
the messages received in the session are locked as long as the session is (they
have no lock of their own). When the lock expires the session is free again and
the old holder's operations fail with *session lock lost*.

The locks live in the broker file (table ``session_locks``), so every process and
both doors to the broker (``local://`` and the emulator) see them. A holder is
identified by a random token, not by its process or connection: two handles of one
process (which share one SQLite connection) compete like two processes do.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from ...errors import SessionCannotBeLockedError, SessionLockLostError
from ._received import ReceivedMessage

if TYPE_CHECKING:
    from ._backend import LocalBackend

__all__ = ["LocalSession"]

ReceiveMode = Literal["receive_and_delete", "peek_lock"]


def _where(entity: str, subscription: str | None, session_id: str) -> str:
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
        f"{_where(entity, subscription, session_id)} cannot be locked: another receiver holds "
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
        f"the lock on {_where(entity, subscription, session_id)} is lost: it expired (it was "
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


class LocalSession:
    """A session of a sessionful queue or subscription, locked to this receiver.

    Made by :meth:`LocalBackend.accept_session`; shaped after azure-servicebus's
    session receiver (``receive``/``peek``/settlement) and its ``ServiceBusSession``
    (``get_state``/``set_state``/``renew_lock``/``locked_until``). While the lock
    is held no other receiver (another session, handle, process, or an emulator
    client) can take the session or its messages. Messages received in peek-lock
    mode are locked as long as the session is: :meth:`renew_lock` extends both.
    Once the lock expires every operation raises
    :class:`~sendonce.errors.SessionLockLostError`. :meth:`close` (or leaving the
    ``with`` block) releases the session; its unsettled messages are available
    again, in order, to the next receiver.
    """

    def __init__(
        self,
        backend: LocalBackend,
        entity: str,
        subscription: str | None,
        session_id: str,
        token: str,
        locked_until: datetime,
        lock_duration: timedelta,
    ) -> None:
        self._backend = backend
        self._entity = entity
        self._subscription = subscription
        self._session_id = session_id
        self._token = token
        self._locked_until = locked_until
        self._lock_duration = lock_duration
        self._closed = False

    # -- what it is ---------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The session this receiver holds."""
        return self._session_id

    @property
    def entity(self) -> str:
        """The queue or topic the session is on."""
        return self._entity

    @property
    def subscription(self) -> str | None:
        """The subscription, on a topic; None on a queue."""
        return self._subscription

    @property
    def locked_until(self) -> datetime:
        """When the lock expires unless renewed (as of the last accept or renewal)."""
        return self._locked_until

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` released the session (a lost lock does not close it)."""
        return self._closed

    @property
    def lock_duration(self) -> timedelta:
        """How long each accept or renewal locks the session for."""
        return self._lock_duration

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"locked until {self._locked_until.isoformat()}"
        return (
            f"LocalSession({_where(self._entity, self._subscription, self._session_id)}, {state})"
        )

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- receiving and settling ---------------------------------------------------------

    def receive(
        self, *, max_messages: int = 1, mode: ReceiveMode = "peek_lock"
    ) -> list[ReceivedMessage]:
        """Take up to ``max_messages`` available messages of the session, in order.

        ``peek_lock`` (the default, as for Service Bus receivers) locks them with
        the session; ``receive_and_delete`` removes them. Returns at once (an empty
        list when none is available).
        """
        return self._backend._session_receive(self, max_messages=max_messages, mode=mode)

    def peek(
        self, *, max_messages: int = 1, from_sequence_number: int | None = None
    ) -> list[ReceivedMessage]:
        """Look at the session's stored messages without taking them."""
        return self._backend.peek(
            self._entity,
            max_messages=max_messages,
            subscription=self._subscription,
            session_id=self._session_id,
            from_sequence_number=from_sequence_number,
        )

    def receive_deferred(
        self, sequence_numbers: Sequence[int], *, mode: ReceiveMode = "peek_lock"
    ) -> list[ReceivedMessage]:
        """Receive deferred messages of the session by sequence number."""
        return self._backend._session_receive_deferred(self, sequence_numbers, mode=mode)

    def complete(self, message: ReceivedMessage | str) -> None:
        """Remove a message received in this session (by the message or its lock token)."""
        self._backend._session_settle(self, "complete", message)

    def abandon(self, message: ReceivedMessage | str) -> None:
        """Release a message: it is the session's next message again."""
        self._backend._session_settle(self, "abandon", message)

    def defer(self, message: ReceivedMessage | str) -> None:
        """Set a message aside for :meth:`receive_deferred`."""
        self._backend._session_settle(self, "defer", message)

    def dead_letter(
        self,
        message: ReceivedMessage | str,
        *,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        """Move a message to the entity's dead-letter subqueue."""
        self._backend._session_settle(
            self, "dead_letter", message, reason=reason, error_description=error_description
        )

    # -- the session itself -------------------------------------------------------------

    def get_state(self) -> bytes | None:
        """The session's state (None when it has none). Needs the lock, as in Service Bus."""
        return self._backend._session_state(self, get=True)

    def set_state(self, state: bytes | None) -> None:
        """Store (or with None, clear) the session's state. Needs the lock."""
        self._backend._session_state(self, get=False, state=state)

    def renew_lock(self) -> datetime:
        """Extend the session's lock (and its messages' locks) by the lock duration.

        Returns the new expiry; raises :class:`~sendonce.errors.SessionLockLostError`
        when the lock was already lost.
        """
        self._locked_until = self._backend._session_renew(self)
        return self._locked_until

    def close(self) -> None:
        """Release the session (idempotent). Unsettled messages become available again."""
        if self._closed:
            return
        self._closed = True
        self._backend._session_release(self)
