"""Inspection: looking at what the broker holds without taking it, and purging it.

``peek``, ``count``, ``stats`` and ``message_ids`` only read (they never wait
for writers, and work on read-only handles); ``purge`` deletes stored messages
but keeps remembered ids, so it does not reopen the duplicate-detection window.
Reads cannot activate scheduled messages: they show the due ones as the next
activation stores them (see :mod:`._activation`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ._activation import PENDING, due, due_count
from ._entities import lookup, place, place_settings
from ._received import ROW_COLUMNS, ReceivedMessage, received_from_row
from ._receiving import SubQueue, check_max, check_sub_queue, expired, expiry_sql, in_sub_queue
from ._store import US, Store


def peek(
    store: Store,
    entity: str,
    *,
    max_messages: int = 1,
    subscription: str | None = None,
    session_id: str | None = None,
    from_sequence_number: int | None = None,
    sub_queue: SubQueue | None = None,
) -> list[ReceivedMessage]:
    """Look at stored messages (scheduled and locked ones too) without taking them.

    As Service Bus browses: a queue shows its scheduled messages waiting for their
    time (under the schedule request's sequence number); a subscription shows
    none, since its topic keeps them until due. A topic without ``subscription``
    shows exactly those waiting messages (a local broker view: Service Bus cannot
    peek a topic).
    """
    limit = check_max(max_messages)
    check_sub_queue(sub_queue)

    def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
        eid, topic, next_seq, _ = lookup(conn, entity)
        start = from_sequence_number or 0
        now = store.now()
        if topic.kind == "topic" and subscription is None and sub_queue is None:
            ttl = topic.default_message_time_to_live
            return [
                received_from_row(r, default_ttl=ttl, now=now)
                for r in _waiting(conn, eid, start, now, session_id, limit)
            ]
        sub, profile = place_settings(conn, eid, topic, subscription)  # its own TTL
        sub = in_sub_queue(sub, sub_queue)
        query = f"SELECT {ROW_COLUMNS} FROM messages WHERE eid = ? AND sub = ? AND seq >= ?"
        params: list[Any] = [eid, sub, start]
        if sub_queue is None:  # expired messages are gone (or dead-lettered) for a peek too
            expiry, ttl_params = expiry_sql(profile)
            query += (  # NULL expiry: never expires
                f" AND NOT COALESCE({expiry} <= ? "
                "AND (locked_until IS NULL OR locked_until <= ?), 0)"
            )
            params += [*ttl_params, now, now]
        if session_id is not None:
            query += " AND session_id = ?"
            params.append(session_id)
        query += " ORDER BY seq LIMIT ?"
        params.append(limit)
        ttl = profile.default_message_time_to_live
        rows = conn.execute(query, params).fetchall()
        if sub_queue is None:
            if profile.kind == "queue":
                rows += _waiting(conn, eid, start, now, session_id, limit)
            rows += [
                r
                for r in due(conn, eid, next_seq, now, session_id)
                if r[0] >= start and not expired(profile, r, now)
            ]
            rows.sort(key=lambda r: r[0])
        return [received_from_row(r, default_ttl=ttl, now=now) for r in rows[:limit]]

    return store.read(work)


def _waiting(
    conn: sqlite3.Connection,
    eid: int,
    start: int,
    now: int,
    session_id: str | None,
    limit: int,
) -> list[Any]:
    """The entity's scheduled messages not yet due, by schedule sequence number."""
    query = (
        f"SELECT {ROW_COLUMNS} FROM messages WHERE eid = ? AND sub = '{PENDING}' "
        "AND seq >= ? AND visible > ?"
    )
    params: list[Any] = [eid, start, now]
    if session_id is not None:
        query += " AND session_id = ?"
        params.append(session_id)
    query += " ORDER BY seq LIMIT ?"
    params.append(limit)
    return conn.execute(query, params).fetchall()


def count(
    store: Store,
    entity: str,
    *,
    subscription: str | None = None,
    sub_queue: SubQueue | None = None,
) -> int:
    """Messages available now: not scheduled for later, not locked."""
    check_sub_queue(sub_queue)

    def work(conn: sqlite3.Connection) -> int:
        eid, profile, _, _ = lookup(conn, entity)
        sub = in_sub_queue(place(conn, eid, profile, subscription), sub_queue)
        now = store.now()
        row = conn.execute(
            "SELECT count(*) FROM messages WHERE eid = ? AND sub = ? AND visible <= ? "
            "AND (locked_until IS NULL OR locked_until <= ?) AND deferred IS NULL",
            (eid, sub, now, now),
        ).fetchone()
        # Due scheduled messages are available: the next receive activates them.
        return int(row[0]) + (due_count(conn, eid, now) if sub_queue is None else 0)

    return store.read(work)


def purge(store: Store, entity: str, *, subscription: str | None = None) -> int:
    """Delete stored messages (a topic without ``subscription``: all of its copies)."""

    def work(conn: sqlite3.Connection) -> int:
        eid, profile, _, _ = lookup(conn, entity)
        if profile.kind == "topic" and subscription is None:
            return conn.execute("DELETE FROM messages WHERE eid = ?", (eid,)).rowcount
        sub = place(conn, eid, profile, subscription)
        purged = conn.execute("DELETE FROM messages WHERE eid = ? AND sub = ?", (eid, sub)).rowcount
        if profile.kind == "queue":  # a queue's scheduled messages are in the queue
            purged += conn.execute(
                "DELETE FROM messages WHERE eid = ? AND sub = ?", (eid, PENDING)
            ).rowcount
        return purged

    return store.write(work)


def stats(store: Store, entity: str) -> dict[str, int]:
    """Counts for operators: available, scheduled, locked, stored messages, remembered ids."""

    def work(conn: sqlite3.Connection) -> dict[str, int]:
        eid, profile, next_seq, id_count = lookup(conn, entity)
        now = store.now()
        available, scheduled, locked, total = conn.execute(
            "SELECT coalesce(sum(visible <= ?1 AND coalesce(locked_until, 0) <= ?1), 0), "
            "coalesce(sum(visible > ?1), 0), coalesce(sum(coalesce(locked_until, 0) > ?1), 0), "
            "count(*) FROM messages WHERE eid = ?2",
            (now, eid),
        ).fetchone()
        window = profile.window
        if window is None:
            remembered = id_count
        else:
            remembered = conn.execute(
                "SELECT count(*) FROM ids WHERE eid = ? AND stamp > ?",
                (eid, now - window // US),
            ).fetchone()[0]
        subs = conn.execute("SELECT count(*) FROM subscriptions WHERE eid = ?", (eid,)).fetchone()[
            0
        ]
        return {
            "available": int(available),
            "scheduled": int(scheduled),
            "locked": int(locked),
            "messages": int(total),
            "ids_remembered": int(remembered),
            "subscriptions": int(subs),
            # Due scheduled messages have the numbers their activation gives them.
            "last_sequence_number": int(next_seq) - 1 + due_count(conn, eid, now),
        }

    return store.read(work)


def message_ids(store: Store, entity: str, *, subscription: str | None = None) -> list[str]:
    """Every stored message id, scheduled and locked ones included, in sequence order."""

    def work(conn: sqlite3.Connection) -> list[str]:
        eid, profile, next_seq, _ = lookup(conn, entity)
        if profile.kind == "topic" and subscription is None:
            sql = "SELECT message_id FROM messages WHERE eid = ? GROUP BY seq ORDER BY seq"
            return [r[0] for r in conn.execute(sql, (eid,))]
        sub = place(conn, eid, profile, subscription)
        now = store.now()
        rows = conn.execute(
            "SELECT seq, message_id FROM messages WHERE eid = ? AND sub = ? ORDER BY seq",
            (eid, sub),
        ).fetchall()
        if profile.kind == "queue":  # the queue's scheduled messages waiting for their time
            rows += conn.execute(
                "SELECT seq, message_id FROM messages WHERE eid = ? AND sub = ? AND visible > ?",
                (eid, PENDING, now),
            ).fetchall()
        rows += [(r[0], r[1]) for r in due(conn, eid, next_seq, now)]
        return [mid for _, mid in sorted(rows)]

    return store.read(work)
