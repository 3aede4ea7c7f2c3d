"""Sessions: ``LocalSession`` (a receiver that holds one session), its operations, session state.

Service Bus locks a session to one receiver at a time
(https://learn.microsoft.com/azure/service-bus-messaging/message-sessions): a second
receiver asking for the same session gets *session cannot be locked*; a
``NEXT_AVAILABLE_SESSION`` receiver gets a session that no one holds and that has
a message available; the lock lasts the entity's lock duration unless renewed, and
the messages received in the session are locked as long as the session is (they
have no lock of their own). When the lock expires the session is free again and
the old holder's operations fail with *session lock lost*.

The locks themselves (table ``session_locks``, seen by every process and by the
emulator) are kept by :mod:`._session_locks`.
"""

from __future__ import annotations

import math
import sqlite3
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from ..._entity import EntityProfile
from ..._message import PropertyValue
from ...errors import ConfigurationError, ValidationError
from . import _activation, _inspection, _session_locks
from ._entities import lookup, place, place_settings
from ._errors import NoSessionAvailableError
from ._received import ReceivedMessage
from ._receiving import (
    DEAD_LETTER_SUFFIX,
    ReceiveMode,
    check_lock_duration,
    check_max,
    check_mode,
    check_reason,
    check_sequence_numbers,
    settle,
    take,
    take_deferred,
)
from ._session_locks import where
from ._store import US, Store, from_us

__all__ = ["LocalSession"]


class LocalSession:
    """A session of a sessionful queue or subscription, locked to this receiver.

    Made by :meth:`LocalBackend.accept_session`; shaped after azure-servicebus's
    session receiver (``receive``/``peek``/settlement) and its ``ServiceBusSession``
    (``get_state``/``set_state``/``renew_lock``/``locked_until``). While the lock
    is held no other receiver (another session, handle, process, or an emulator
    client) can take the session or its messages. Messages received in peek-lock
    mode are locked as long as the session is: :meth:`renew_lock` extends both.
    Once the lock expires every operation raises
    :class:`~sendonce.backends.local.SessionLockLostError`. :meth:`close` (or leaving the
    ``with`` block) releases the session; its unsettled messages are available
    again, in order, to the next receiver.
    """

    def __init__(
        self,
        store: Store,
        entity: str,
        subscription: str | None,
        session_id: str,
        token: str,
        locked_until: datetime,
        lock_duration: timedelta,
    ) -> None:
        self._store = store
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
        return f"LocalSession({where(self._entity, self._subscription, self._session_id)}, {state})"

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
        return _receive(self._store, self, max_messages=max_messages, mode=mode)

    def peek(
        self, *, max_messages: int = 1, from_sequence_number: int | None = None
    ) -> list[ReceivedMessage]:
        """Look at the session's stored messages without taking them."""
        return _inspection.peek(
            self._store,
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
        return _receive_deferred(self._store, self, sequence_numbers, mode=mode)

    def complete(self, message: ReceivedMessage | str) -> None:
        """Remove a message received in this session (by the message or its lock token)."""
        _settle(self._store, self, "complete", message)

    def abandon(
        self,
        message: ReceivedMessage | str,
        *,
        properties_to_modify: Mapping[str, PropertyValue] | None = None,
    ) -> None:
        """Release a message: it is the session's next message again.

        ``properties_to_modify`` (here, in :meth:`defer` and :meth:`dead_letter`) are
        written over the message's application properties, as in Service Bus.
        """
        _settle(self._store, self, "abandon", message, properties_to_modify=properties_to_modify)

    def defer(
        self,
        message: ReceivedMessage | str,
        *,
        properties_to_modify: Mapping[str, PropertyValue] | None = None,
    ) -> None:
        """Set a message aside for :meth:`receive_deferred`."""
        _settle(self._store, self, "defer", message, properties_to_modify=properties_to_modify)

    def dead_letter(
        self,
        message: ReceivedMessage | str,
        *,
        reason: str | None = None,
        error_description: str | None = None,
        properties_to_modify: Mapping[str, PropertyValue] | None = None,
    ) -> None:
        """Move a message to the entity's dead-letter subqueue."""
        _settle(
            self._store,
            self,
            "dead_letter",
            message,
            reason=reason,
            error_description=error_description,
            properties_to_modify=properties_to_modify,
        )

    # -- the session itself -------------------------------------------------------------

    def get_state(self) -> bytes | None:
        """The session's state (None when it has none). Needs the lock, as in Service Bus."""
        return _state(self._store, self, get=True)

    def set_state(self, state: bytes | None) -> None:
        """Store (or with None, clear) the session's state. Needs the lock."""
        _state(self._store, self, get=False, state=state)

    def renew_lock(self) -> datetime:
        """Extend the session's lock (and its messages' locks) by the lock duration.

        Returns the new expiry; raises :class:`~sendonce.backends.local.SessionLockLostError`
        when the lock was already lost.
        """
        self._locked_until = _renew(self._store, self)
        return self._locked_until

    def close(self) -> None:
        """Release the session (idempotent). Unsettled messages become available again."""
        if self._closed:
            return
        self._closed = True
        _release(self._store, self)


# -- the operations of a session and of session state --------------------


def get_session_state(
    store: Store, entity: str, session_id: str, *, subscription: str | None = None
) -> bytes | None:
    """The state an application stored for a session (None when it has none)."""
    _check_session_id(session_id)

    def work(conn: sqlite3.Connection) -> bytes | None:
        eid, profile, _, _ = lookup(conn, entity)
        sub = place(conn, eid, profile, subscription)
        row = conn.execute(
            "SELECT state FROM session_states WHERE eid = ? AND sub = ? AND session_id = ?",
            (eid, sub, session_id),
        ).fetchone()
        return None if row is None else bytes(row[0])

    return store.read(work)


def set_session_state(
    store: Store,
    entity: str,
    session_id: str,
    state: bytes | None,
    *,
    subscription: str | None = None,
) -> None:
    """Store (or with None, clear) the state of a session."""
    _check_session_id(session_id)
    if state is not None and not isinstance(state, bytes | bytearray | memoryview):
        raise ValidationError("state must be bytes or None", field="state")

    def work(conn: sqlite3.Connection) -> None:
        eid, profile, _, _ = lookup(conn, entity)
        sub = place(conn, eid, profile, subscription)
        _put_state(conn, eid, sub, profile, session_id, state)

    store.write(work)


def accept_session(
    store: Store,
    entity: str,
    session_id: str | None = None,
    *,
    subscription: str | None = None,
    max_wait_time: float | None = None,
    lock_duration: timedelta | None = None,
) -> LocalSession:
    """Lock a session of a sessionful queue or subscription to a new receiver.

    ``lock_duration`` None: the queue's or subscription's own.
    """
    if session_id is not None:
        _check_session_id(session_id)
    check_lock_duration(lock_duration)
    wait = _wait_seconds(max_wait_time)
    token = uuid.uuid4().hex

    def sessionful(conn: sqlite3.Connection) -> tuple[int, str, timedelta]:
        eid, topic, _, _ = lookup(conn, entity)
        sub, profile = place_settings(conn, eid, topic, subscription)
        if not profile.sessions:
            what = "entity" if subscription is None else "subscription"
            raise ConfigurationError(
                f"{where_of(entity, subscription)!r} does not require sessions: receive from it "
                f"without a session (a session receiver needs an {what} created with "
                "sessions=True)",
                field="entity" if subscription is None else "subscription",
            )
        return eid, sub, lock_duration or profile.lock_duration

    def lock(conn: sqlite3.Connection) -> tuple[str, int, timedelta] | None:
        eid, sub, duration = sessionful(conn)
        now = store.now()
        _activation.activate(conn, eid, now)
        wanted = session_id
        if wanted is None:
            row = conn.execute(_session_locks.NEXT_SESSION, (eid, sub, now)).fetchone()
            if row is None:
                return None
            wanted = str(row[0])
        until = now + duration // US
        if _session_locks.acquire(conn, eid, sub, wanted, token, until, now):
            return wanted, until, duration
        if session_id is None:
            return None  # taken meanwhile: look again
        raise _session_locks.cannot_lock(entity, subscription, wanted)

    def available(conn: sqlite3.Connection) -> bool:
        eid, sub, _ = sessionful(conn)
        now = store.now()
        return _activation.has_due_session(conn, eid, sub, now) or (
            conn.execute(_session_locks.NEXT_SESSION, (eid, sub, now)).fetchone() is not None
        )

    started, started_real = store.now(), time.monotonic()
    pause = 0.005
    while True:
        # A read first: waiting receivers must not take the broker's write lock.
        got = store.write(lock) if session_id is not None or store.read(available) else None
        if got is not None:
            name, until, duration = got
            return LocalSession(store, entity, subscription, name, token, from_us(until), duration)
        waited = max((store.now() - started) * 1e-6, time.monotonic() - started_real)
        if waited >= wait:
            raise NoSessionAvailableError(
                f"no session of {where_of(entity, subscription)!r} is free with a message available"
                + (f" (waited {wait:g} s)" if wait else ""),
                entity=entity,
            )
        time.sleep(min(pause, max(wait - waited, 0.001)))
        pause = min(pause * 2, 0.1)


def where_of(entity: str, subscription: str | None) -> str:
    return entity if subscription is None else f"{entity}/Subscriptions/{subscription}"


def _place(conn: sqlite3.Connection, session: LocalSession) -> tuple[int, str]:
    eid, profile, _, _ = lookup(conn, session.entity)
    return eid, place(conn, eid, profile, session.subscription)


def _held(
    store: Store, conn: sqlite3.Connection, session: LocalSession
) -> tuple[int, str, int, int]:
    """(eid, sub, now, locked_until) of a session this receiver still holds."""
    if session.closed:
        raise _session_locks.lock_lost(session.entity, session.subscription, session.session_id)
    eid, sub = _place(conn, session)
    now = store.now()
    until = _session_locks.check_held(
        conn,
        eid,
        sub,
        session.session_id,
        session._token,
        now,
        session.entity,
        session.subscription,
    )
    return eid, sub, now, until


def _receive(
    store: Store, session: LocalSession, *, max_messages: int, mode: ReceiveMode
) -> list[ReceivedMessage]:
    limit = check_max(max_messages)
    check_mode(mode)

    def anything(conn: sqlite3.Connection) -> bool:
        eid, sub, now, _ = _held(store, conn, session)
        return bool(_activation.due_count(conn, eid, now, session.session_id)) or (
            conn.execute(
                "SELECT 1 FROM messages WHERE eid = ? AND sub = ? AND session_id = ? "
                "AND visible <= ? AND (locked_until IS NULL OR locked_until <= ?) "
                "AND deferred IS NULL LIMIT 1",
                (eid, sub, session.session_id, now, now),
            ).fetchone()
            is not None
        )

    def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
        eid, sub, now, until = _held(store, conn, session)
        # The subscription's own settings (max delivery count, time to live) apply.
        topic = lookup(conn, session.entity)[1]
        profile = place_settings(conn, eid, topic, session.subscription)[1]
        # The session's messages are locked with the session: same expiry, renewed with it.
        return take(
            conn,
            eid,
            sub,
            profile,
            now,
            limit=limit,
            mode=mode,
            until=until,
            session_id=session.session_id,
            retire=True,
        )

    # A read first: an idle receiver polling an empty session takes no write lock.
    if not store.read(anything):
        return []
    return store.write(work)


def _receive_deferred(
    store: Store, session: LocalSession, sequence_numbers: Sequence[int], *, mode: ReceiveMode
) -> list[ReceivedMessage]:
    wanted = check_sequence_numbers(sequence_numbers)
    check_mode(mode)

    def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
        eid, sub, now, until = _held(store, conn, session)
        topic = lookup(conn, session.entity)[1]
        profile = place_settings(conn, eid, topic, session.subscription)[1]  # its own TTL
        return take_deferred(
            conn,
            eid,
            sub,
            now,
            session.entity,
            wanted,
            mode=mode,
            until=until,
            session_id=session.session_id,
            skip_locked_sessions=False,
            default_ttl=profile.default_message_time_to_live,
        )

    return store.write(work)


def _settle(
    store: Store,
    session: LocalSession,
    operation: str,
    message: ReceivedMessage | str,
    *,
    reason: str | None = None,
    error_description: str | None = None,
    properties_to_modify: Mapping[str, PropertyValue] | None = None,
) -> None:
    token = message.lock_token if isinstance(message, ReceivedMessage) else message
    if not isinstance(token, str) or not token:
        raise ValidationError(
            "settle a message received in peek-lock mode (or its lock token)",
            field="message",
        )
    values: tuple[Any, ...] = ()
    if operation == "dead_letter":
        check_reason(reason, error_description)
        values = (DEAD_LETTER_SUFFIX, reason, error_description)
    settle(
        store,
        session.entity,
        token,
        session.subscription,
        operation,
        values=values,
        session=(session.session_id, session._token),
        properties_to_modify=properties_to_modify,
    )


def _state(
    store: Store, session: LocalSession, *, get: bool, state: bytes | None = None
) -> bytes | None:
    if not get and state is not None and not isinstance(state, bytes | bytearray | memoryview):
        raise ValidationError("state must be bytes or None", field="state")

    def work(conn: sqlite3.Connection) -> bytes | None:
        eid, sub, _, _ = _held(store, conn, session)
        if get:
            row = conn.execute(
                "SELECT state FROM session_states WHERE eid = ? AND sub = ? AND session_id = ?",
                (eid, sub, session.session_id),
            ).fetchone()
            return None if row is None else bytes(row[0])
        profile = lookup(conn, session.entity)[1]
        _put_state(conn, eid, sub, profile, session.session_id, state)
        return None

    if get:
        return store.read(work)
    return store.write(work)


def _renew(store: Store, session: LocalSession) -> datetime:
    def work(conn: sqlite3.Connection) -> int:
        if session.closed:
            raise _session_locks.lock_lost(session.entity, session.subscription, session.session_id)
        eid, sub = _place(conn, session)
        now = store.now()
        until = now + session.lock_duration // US
        if not _session_locks.renew(conn, eid, sub, session.session_id, session._token, until, now):
            raise _session_locks.lock_lost(session.entity, session.subscription, session.session_id)
        return until

    return from_us(store.write(work))


def _release(store: Store, session: LocalSession) -> None:
    if store.db.closed:
        return  # nothing to release through: the lock runs out by itself

    def work(conn: sqlite3.Connection) -> None:
        try:
            eid, sub = _place(conn, session)
        except ConfigurationError:
            return  # the entity was deleted meanwhile
        _session_locks.release(conn, eid, sub, session.session_id, session._token, store.now())

    store.write(work)


def _wait_seconds(value: object) -> float:
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValidationError(
            f"max_wait_time must be a non-negative number of seconds or None, got {value!r}",
            field="max_wait_time",
        )
    return float(value)


def _put_state(
    conn: sqlite3.Connection,
    eid: int,
    sub: str,
    profile: EntityProfile,
    session_id: str,
    state: bytes | bytearray | memoryview | None,
) -> None:
    if state is not None and len(state) > profile.max_message_size:
        raise ValidationError(
            f"state is larger than the entity's max_message_size "
            f"({profile.max_message_size} bytes)",
            field="state",
        )
    if state is None:
        conn.execute(
            "DELETE FROM session_states WHERE eid = ? AND sub = ? AND session_id = ?",
            (eid, sub, session_id),
        )
    else:
        conn.execute(
            "INSERT OR REPLACE INTO session_states VALUES (?, ?, ?, ?)",
            (eid, sub, session_id, bytes(state)),
        )


def _check_session_id(session_id: object) -> None:
    if not isinstance(session_id, str) or not session_id or "\x00" in session_id:
        raise ValidationError(
            "session_id must be a non-empty str without NUL characters", field="session_id"
        )
