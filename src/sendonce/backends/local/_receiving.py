"""Receiving and settling: peek-lock, complete, abandon, deferral, dead-lettering, expiry.

Service Bus semantics: a peek-locked message is the receiver's until its lock
expires; a message delivered ``max_delivery_count`` times, or expired, moves to
the dead-letter subqueue (``sub`` + ``/$DeadLetterQueue``) as the entity says.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NoReturn

from ..._entity import EntityProfile
from ..._message import PropertyValue
from ...errors import ValidationError
from . import _session_locks
from ._activation import activate
from ._entities import lookup, place_settings
from ._errors import LockLostError, MessageNotFoundError
from ._received import (
    ROW_COLUMNS,
    ReceivedMessage,
    check_properties_to_modify,
    modify_extra,
    received_from_row,
)
from ._store import US, Store

ReceiveMode = Literal["receive_and_delete", "peek_lock"]
# "transfer_dead_letter": <entity>/$Transfer/$DeadLetterQueue, which Service Bus has for every
# queue and subscription; it holds what forwarding or send-via failed to transfer, so here
# (no forwarding) it is always empty.
SubQueue = Literal["dead_letter", "transfer_dead_letter"]


def check_max(max_messages: int) -> int:
    if not isinstance(max_messages, int) or isinstance(max_messages, bool) or max_messages < 1:
        raise ValidationError("max_messages must be a positive int", field="max_messages")
    return max_messages


def receive(
    store: Store,
    entity: str,
    *,
    max_messages: int = 1,
    subscription: str | None = None,
    session_id: str | None = None,
    mode: ReceiveMode = "receive_and_delete",
    lock_duration: timedelta | None = None,
    sub_queue: SubQueue | None = None,
) -> list[ReceivedMessage]:
    """Take up to ``max_messages`` available messages, oldest sequence number first.

    ``lock_duration`` None: the queue's or subscription's own.
    """
    limit = check_max(max_messages)
    check_sub_queue(sub_queue)
    if mode not in ("receive_and_delete", "peek_lock"):
        raise ValidationError(
            f"mode must be 'receive_and_delete' or 'peek_lock', got {mode!r}", field="mode"
        )
    check_lock_duration(lock_duration)

    def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
        eid, topic, _, _ = lookup(conn, entity)
        sub, profile = place_settings(conn, eid, topic, subscription)
        sub = in_sub_queue(sub, sub_queue)
        now = store.now()
        skip_locked = False
        if sub_queue is None and session_id is not None:
            # A session someone holds (a LocalSession or an emulator client) is theirs.
            _session_locks.refuse_if_locked(conn, eid, sub, session_id, now, entity, subscription)
        elif sub_queue is None and profile.sessions:
            skip_locked = True
        return take(
            conn,
            eid,
            sub,
            profile,
            now,
            limit=limit,
            mode=mode,
            until=now + (lock_duration or profile.lock_duration) // US,
            session_id=session_id,
            retire=sub_queue is None,
            skip_locked_sessions=skip_locked,
        )

    return store.write(work)


def take(
    conn: sqlite3.Connection,
    eid: int,
    sub: str,
    profile: EntityProfile,
    now: int,
    *,
    limit: int,
    mode: ReceiveMode,
    until: int,
    session_id: str | None,
    retire: bool,
    skip_locked_sessions: bool = False,
) -> list[ReceivedMessage]:
    """Receive up to ``limit`` available messages (locking them until ``until``)."""
    activate(conn, eid, now)
    query = (
        f"SELECT {ROW_COLUMNS} FROM messages WHERE eid = ? AND sub = ? "
        "AND visible <= ? AND (locked_until IS NULL OR locked_until <= ?) "
        "AND deferred IS NULL"
    )
    params: list[Any] = [eid, sub, now, now]
    if session_id is not None:
        query += " AND session_id = ?"
        params.append(session_id)
    if skip_locked_sessions:
        query += _session_locks.NOT_IN_LOCKED_SESSION
        params.append(now)
    query += " ORDER BY seq LIMIT ?"
    params.append(limit)
    rows = conn.execute(query, params).fetchall()
    # Only the messages about to be delivered are checked for expiry and delivery
    # count (a sweep of the whole entity made each receive scan it).
    while retire and _retire(conn, eid, sub, profile, now, rows):
        rows = conn.execute(query, params).fetchall()
    out = []
    ttl = profile.default_message_time_to_live
    # Columns: seq, ..., scheduled (0-7), locked_until, lock_token, delivery_count, raw.
    if mode == "receive_and_delete":
        conn.executemany(
            "DELETE FROM messages WHERE eid = ? AND sub = ? AND seq = ?",
            [(eid, sub, r[0]) for r in rows],
        )
        for r in rows:
            out.append(received_from_row((*r[:8], None, None, r[10] + 1, *r[11:]), default_ttl=ttl))
        return out
    for r in rows:
        token = str(uuid.uuid4())
        conn.execute(
            "UPDATE messages SET lock_token = ?, locked_until = ?, "
            "delivery_count = delivery_count + 1 WHERE eid = ? AND sub = ? AND seq = ?",
            (token, until, eid, sub, r[0]),
        )
        out.append(received_from_row((*r[:8], until, token, r[10] + 1, *r[11:]), default_ttl=ttl))
    return out


_WHERE_LOCKED = "WHERE eid = ? AND sub = ? AND lock_token = ? AND locked_until > ?"
# Settlements: operation -> (verb for errors, SQL over a locked message).
_SETTLEMENTS: dict[str, tuple[str, str]] = {
    "complete": ("complete", "DELETE FROM messages " + _WHERE_LOCKED),
    "abandon": (
        "abandon",
        "UPDATE messages SET lock_token = NULL, locked_until = NULL " + _WHERE_LOCKED,
    ),
    "dead_letter": (
        "dead-letter",
        "UPDATE messages SET sub = sub || ?, lock_token = NULL, locked_until = NULL, "
        "dl_reason = ?, dl_description = ?, deferred = NULL " + _WHERE_LOCKED,
    ),
    "defer": (
        "defer",
        "UPDATE messages SET lock_token = NULL, locked_until = NULL, deferred = 1 " + _WHERE_LOCKED,
    ),
}


def settle(
    store: Store,
    entity: str,
    lock_token: str,
    subscription: str | None,
    operation: str,
    sub_queue: SubQueue | None = None,
    values: tuple[Any, ...] = (),
    session: tuple[str, str] | None = None,
    properties_to_modify: object = None,
) -> None:
    """Settle a locked message; within a held session, ``session`` is (session id, token).

    ``properties_to_modify`` are written over the message's application properties as it
    is settled (Service Bus's abandon, defer and dead-letter take them).
    """
    check_sub_queue(sub_queue)
    verb, sql = _SETTLEMENTS[operation]
    if not isinstance(lock_token, str) or not lock_token:
        raise ValidationError("lock_token must be a non-empty str", field="lock_token")
    changes = check_properties_to_modify(properties_to_modify)

    def work(conn: sqlite3.Connection) -> None:
        eid, topic, _, _ = lookup(conn, entity)
        placed, profile = place_settings(conn, eid, topic, subscription)
        sub = in_sub_queue(placed, sub_queue)
        now = store.now()
        where: tuple[Any, ...] = (eid, sub, lock_token, now)
        settle_sql, settle_values = sql, values
        if operation == "abandon" and sub_queue is None and _last_delivery(conn, where, profile):
            # Service Bus dead-letters a message at the abandon that used up its last
            # delivery: from then on the dead-letter subqueue holds it, not the entity.
            settle_sql = _SETTLEMENTS["dead_letter"][1]
            settle_values = (DEAD_LETTER_SUFFIX, *_max_delivery_reason(profile))
        if session is not None:
            session_id, token = session
            _session_locks.check_held(conn, eid, sub, session_id, token, now, entity, subscription)
            sql_here = settle_sql + " AND session_id = ?"
            params: tuple[Any, ...] = (*settle_values, *where, session_id)
        else:
            sql_here = settle_sql
            params = (*settle_values, *where)
        if changes:
            row = conn.execute("SELECT extra FROM messages " + _WHERE_LOCKED, where).fetchone()
            if row is not None:
                conn.execute(
                    "UPDATE messages SET extra = ? " + _WHERE_LOCKED,
                    (modify_extra(row[0], changes), *where),
                )
        if conn.execute(sql_here, params).rowcount == 0:
            _lock_lost(entity, lock_token, verb)

    store.write(work)


def _last_delivery(
    conn: sqlite3.Connection, where: tuple[Any, ...], profile: EntityProfile
) -> bool:
    """Whether the locked message has been delivered ``max_delivery_count`` times."""
    row = conn.execute("SELECT delivery_count FROM messages " + _WHERE_LOCKED, where).fetchone()
    return row is not None and row[0] >= profile.max_delivery_count


def _max_delivery_reason(profile: EntityProfile) -> tuple[str, str]:
    """Service Bus's dead-letter reason and description for a message delivered too often."""
    return (
        MAX_DELIVERY_COUNT_EXCEEDED,
        f"Message could not be consumed after {profile.max_delivery_count} delivery attempts.",
    )


def complete(
    store: Store,
    entity: str,
    lock_token: str,
    *,
    subscription: str | None = None,
    sub_queue: SubQueue | None = None,
) -> None:
    """Remove a peek-locked message. Raises :class:`LockLostError` if the lock expired."""
    settle(store, entity, lock_token, subscription, "complete", sub_queue)


def abandon(
    store: Store,
    entity: str,
    lock_token: str,
    *,
    subscription: str | None = None,
    sub_queue: SubQueue | None = None,
    properties_to_modify: Mapping[str, PropertyValue] | None = None,
) -> None:
    """Release a peek-locked message so it can be received again."""
    settle(
        store,
        entity,
        lock_token,
        subscription,
        "abandon",
        sub_queue,
        properties_to_modify=properties_to_modify,
    )


def dead_letter(
    store: Store,
    entity: str,
    lock_token: str,
    *,
    subscription: str | None = None,
    reason: str | None = None,
    error_description: str | None = None,
    sub_queue: SubQueue | None = None,
    properties_to_modify: Mapping[str, PropertyValue] | None = None,
) -> None:
    """Move a peek-locked message to the entity's dead-letter subqueue."""
    check_reason(reason, error_description)
    if sub_queue is not None:
        # a message read from a dead-letter subqueue cannot be dead-lettered again: as
        # on Service Bus, it is released and stays where it is
        check_sub_queue(sub_queue)
        abandon(
            store,
            entity,
            lock_token,
            subscription=subscription,
            sub_queue=sub_queue,
            properties_to_modify=properties_to_modify,
        )
        return
    settle(
        store,
        entity,
        lock_token,
        subscription,
        "dead_letter",
        values=(DEAD_LETTER_SUFFIX, reason, error_description),
        properties_to_modify=properties_to_modify,
    )


def defer(
    store: Store,
    entity: str,
    lock_token: str,
    *,
    subscription: str | None = None,
    properties_to_modify: Mapping[str, PropertyValue] | None = None,
) -> None:
    """Set a peek-locked message aside: only :meth:`receive_deferred` hands it out again."""
    settle(
        store, entity, lock_token, subscription, "defer", properties_to_modify=properties_to_modify
    )


def receive_deferred(
    store: Store,
    entity: str,
    sequence_numbers: Sequence[int],
    *,
    subscription: str | None = None,
    session_id: str | None = None,
    mode: ReceiveMode = "peek_lock",
    lock_duration: timedelta | None = None,
) -> list[ReceivedMessage]:
    """Receive deferred messages by sequence number (settle them as any locked message)."""
    wanted = check_sequence_numbers(sequence_numbers)
    check_mode(mode)
    check_lock_duration(lock_duration)

    def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
        eid, topic, _, _ = lookup(conn, entity)
        sub, profile = place_settings(conn, eid, topic, subscription)
        now = store.now()
        if session_id is not None:
            _session_locks.refuse_if_locked(conn, eid, sub, session_id, now, entity, subscription)
        return take_deferred(
            conn,
            eid,
            sub,
            now,
            entity,
            wanted,
            mode=mode,
            until=now + (lock_duration or profile.lock_duration) // US,
            session_id=session_id,
            skip_locked_sessions=session_id is None and profile.sessions,
            default_ttl=profile.default_message_time_to_live,
        )

    return store.write(work)


def take_deferred(
    conn: sqlite3.Connection,
    eid: int,
    sub: str,
    now: int,
    entity: str,
    wanted: list[int],
    *,
    mode: ReceiveMode,
    until: int,
    session_id: str | None,
    skip_locked_sessions: bool,
    default_ttl: timedelta | None = None,
) -> list[ReceivedMessage]:
    out = []
    for seq in wanted:
        row = conn.execute(
            f"SELECT {ROW_COLUMNS} FROM messages WHERE eid = ? AND sub = ? AND seq = ? "
            "AND deferred = 1 AND (locked_until IS NULL OR locked_until <= ?)",
            (eid, sub, seq, now),
        ).fetchone()
        if (
            row is not None
            and session_id is None
            and skip_locked_sessions
            and row[3] is not None
            and _session_locks.holder(conn, eid, sub, row[3], now) is not None
        ):
            row = None  # its session is someone else's
        if row is None or (session_id is not None and row[3] != session_id):
            raise MessageNotFoundError(
                f"{entity!r} has no deferred message with sequence number {seq} "
                "available (never deferred, settled, or locked by another receiver)"
            )
        if mode == "receive_and_delete":
            conn.execute(
                "DELETE FROM messages WHERE eid = ? AND sub = ? AND seq = ?",
                (eid, sub, seq),
            )
            out.append(
                received_from_row(
                    (*row[:8], None, None, row[10] + 1, *row[11:]), default_ttl=default_ttl
                )
            )
            continue
        token = str(uuid.uuid4())
        conn.execute(
            "UPDATE messages SET lock_token = ?, locked_until = ?, "
            "delivery_count = delivery_count + 1 WHERE eid = ? AND sub = ? AND seq = ?",
            (token, until, eid, sub, seq),
        )
        out.append(
            received_from_row(
                (*row[:8], until, token, row[10] + 1, *row[11:]), default_ttl=default_ttl
            )
        )
    return out


def renew_lock(
    store: Store,
    entity: str,
    lock_token: str,
    *,
    subscription: str | None = None,
    lock_duration: timedelta | None = None,
    sub_queue: SubQueue | None = None,
) -> datetime:
    """Extend a peek lock (by the queue's or subscription's lock duration when None)."""
    result: list[datetime] = []
    check_sub_queue(sub_queue)
    check_lock_duration(lock_duration)

    def work(conn: sqlite3.Connection) -> None:
        eid, topic, _, _ = lookup(conn, entity)
        sub, profile = place_settings(conn, eid, topic, subscription)
        sub = in_sub_queue(sub, sub_queue)
        now = store.now()
        until = now + (lock_duration or profile.lock_duration) // US
        cur = conn.execute(
            "UPDATE messages SET locked_until = ? " + _WHERE_LOCKED,
            (until, eid, sub, lock_token, now),
        )
        if cur.rowcount == 0:
            _lock_lost(entity, lock_token, "renew the lock of")
        result.append(datetime.fromtimestamp(0, UTC) + until * US)

    store.write(work)
    return result[0]


DEAD_LETTER_SUFFIX = "/$DeadLetterQueue"
MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"


TRANSFER_DEAD_LETTER_SUFFIX = "/$Transfer/$DeadLetterQueue"


def check_sub_queue(sub_queue: object) -> None:
    if sub_queue is not None and sub_queue not in ("dead_letter", "transfer_dead_letter"):
        raise ValidationError(
            f"sub_queue must be None, 'dead_letter' or 'transfer_dead_letter', got {sub_queue!r}",
            field="sub_queue",
        )


def in_sub_queue(sub: str, sub_queue: SubQueue | None) -> str:
    """The ``sub`` key of a queue's or subscription's subqueue (itself for None)."""
    if sub_queue is None:
        return sub
    if sub_queue == "transfer_dead_letter":
        return sub + TRANSFER_DEAD_LETTER_SUFFIX  # no message is ever put there
    return sub + DEAD_LETTER_SUFFIX


TTL_EXPIRED = "TTLExpiredException"


def expiry_sql(profile: EntityProfile) -> tuple[str, list[Any]]:
    """An SQL expression for a message's expiry time (µs; NULL: never) and its parameters.

    Service Bus: the effective time to live is the message's own, capped by the
    entity's default; it counts from the enqueue time, which for a scheduled
    message is its activation (its scheduled time)
    (https://learn.microsoft.com/azure/service-bus-messaging/message-expiration).
    """
    own = "json_extract(extra, '$.ttl_us')"
    # A scheduled message is enqueued at activation; rows of older files kept the
    # schedule request's time in ``enqueued``, hence the later of the two.
    start = "max(COALESCE(scheduled, enqueued), enqueued)"
    default = profile.default_message_time_to_live
    if default is None:
        return f"({start} + {own})", []
    return f"({start} + COALESCE(min({own}, ?), ?))", [default // US, default // US]


def _retire(
    conn: sqlite3.Connection,
    eid: int,
    sub: str,
    profile: EntityProfile,
    now: int,
    rows: list[Any],
) -> bool:
    """Take expired and too-often-delivered messages out of ``rows``' entity; True if any.

    Expiry (https://learn.microsoft.com/azure/service-bus-messaging/message-expiration):
    the message's own time to live capped by the entity's default, from its enqueue
    (or scheduled) time; an expired message is removed, or dead-lettered with
    TTLExpiredException when the entity says so. Delivery count
    (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues):
    a message delivered ``max_delivery_count`` times and not settled moves to the
    dead-letter subqueue with MaxDeliveryCountExceeded; every peek-lock delivery
    counts, so abandons and lock expiries count alike.
    """
    changed = False
    for r in rows:
        seq, delivery_count = r[0], r[10]
        if expired(profile, r, now):
            if profile.dead_lettering_on_message_expiration:
                _to_dead_letter(
                    conn, eid, sub, seq, TTL_EXPIRED, "The message expired and was dead lettered."
                )
            else:
                conn.execute(
                    "DELETE FROM messages WHERE eid = ? AND sub = ? AND seq = ?", (eid, sub, seq)
                )
            changed = True
        elif delivery_count >= profile.max_delivery_count:
            _to_dead_letter(conn, eid, sub, seq, *_max_delivery_reason(profile))
            changed = True
    return changed


def expired(profile: EntityProfile, row: Sequence[Any], now: int) -> bool:
    """Whether the message of a ``ROW_COLUMNS`` row has expired at ``now`` (see ``expiry_sql``)."""
    extra, enqueued, scheduled = row[5], row[6], row[7]
    own = json.loads(extra).get("ttl_us") if extra else None
    default = profile.default_message_time_to_live
    ttl = own if default is None else default // US if own is None else min(own, default // US)
    return ttl is not None and max(scheduled or enqueued, enqueued) + ttl <= now


def _to_dead_letter(
    conn: sqlite3.Connection, eid: int, sub: str, seq: int, reason: str, description: str
) -> None:
    conn.execute(
        "UPDATE messages SET sub = sub || ?, lock_token = NULL, locked_until = NULL, "
        "dl_reason = ?, dl_description = ? WHERE eid = ? AND sub = ? AND seq = ?",
        (DEAD_LETTER_SUFFIX, reason, description, eid, sub, seq),
    )


def _lock_lost(entity: str, lock_token: str, verb: str) -> NoReturn:
    raise LockLostError(
        f"cannot {verb} the message with lock token {lock_token!r} on {entity!r}: "
        "the lock expired or the message was settled already"
    )


def check_lock_duration(lock_duration: object) -> None:
    """An explicit lock duration (None: the entity's) is a positive timedelta."""
    if lock_duration is not None and (
        not isinstance(lock_duration, timedelta) or lock_duration <= timedelta(0)
    ):
        raise ValidationError(
            "lock_duration must be a positive timedelta or None (the entity's own)",
            field="lock_duration",
        )


def check_mode(mode: object) -> None:
    if mode not in ("receive_and_delete", "peek_lock"):
        raise ValidationError(
            f"mode must be 'receive_and_delete' or 'peek_lock', got {mode!r}", field="mode"
        )


def check_sequence_numbers(sequence_numbers: object) -> list[int]:
    error = ValidationError("sequence_numbers must be a sequence of int", field="sequence_numbers")
    if isinstance(sequence_numbers, int | str | bytes):
        raise error
    try:
        items = list(sequence_numbers)  # type: ignore[call-overload]
    except TypeError:
        raise error from None
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in items):
        raise error
    return list(dict.fromkeys(items))


def check_reason(reason: object, error_description: object) -> None:
    for name, value in (("reason", reason), ("error_description", error_description)):
        if value is not None and not isinstance(value, str):
            raise ValidationError(f"{name} must be a str or None", field=name)
