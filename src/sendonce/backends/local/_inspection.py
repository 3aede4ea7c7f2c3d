"""Inspection: looking at what the broker holds without taking it, and purging it.

``peek``, ``count``, ``stats`` and ``message_ids`` only read (they never wait
for writers); ``purge`` deletes stored messages but keeps remembered ids, so it
does not reopen the duplicate-detection window.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ._entities import lookup, place, place_settings
from ._received import ROW_COLUMNS, ReceivedMessage, received_from_row
from ._receiving import SubQueue, check_max, check_sub_queue, expiry_sql, in_sub_queue
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
    """Look at stored messages (scheduled and locked ones too) without taking them."""
    limit = check_max(max_messages)
    check_sub_queue(sub_queue)

    def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
        eid, topic, _, _ = lookup(conn, entity)
        sub, profile = place_settings(conn, eid, topic, subscription)  # its own TTL
        sub = in_sub_queue(sub, sub_queue)
        query = f"SELECT {ROW_COLUMNS} FROM messages WHERE eid = ? AND sub = ? AND seq >= ?"
        params: list[Any] = [eid, sub, from_sequence_number or 0]
        now = store.now()
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
        return [received_from_row(r, default_ttl=ttl, now=now) for r in rows]

    return store.read(work)


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
        return int(row[0])

    return store.read(work)


def purge(store: Store, entity: str, *, subscription: str | None = None) -> int:
    """Delete stored messages (a topic without ``subscription``: all of its copies)."""

    def work(conn: sqlite3.Connection) -> int:
        eid, profile, _, _ = lookup(conn, entity)
        if profile.kind == "topic" and subscription is None:
            return conn.execute("DELETE FROM messages WHERE eid = ?", (eid,)).rowcount
        sub = place(conn, eid, profile, subscription)
        return conn.execute("DELETE FROM messages WHERE eid = ? AND sub = ?", (eid, sub)).rowcount

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
            "last_sequence_number": int(next_seq) - 1,
        }

    return store.read(work)


def message_ids(store: Store, entity: str, *, subscription: str | None = None) -> list[str]:
    """Every stored message id, scheduled and locked ones included, in sequence order."""

    def work(conn: sqlite3.Connection) -> list[str]:
        eid, profile, _, _ = lookup(conn, entity)
        if profile.kind == "topic" and subscription is None:
            sql = "SELECT message_id FROM messages WHERE eid = ? GROUP BY seq ORDER BY seq"
            return [r[0] for r in conn.execute(sql, (eid,))]
        sub = place(conn, eid, profile, subscription)
        return [
            r[0]
            for r in conn.execute(
                "SELECT message_id FROM messages WHERE eid = ? AND sub = ? ORDER BY seq",
                (eid, sub),
            )
        ]

    return store.read(work)
