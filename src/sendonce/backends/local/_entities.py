"""Entities: their stored profiles, looking them up in a transaction, and administration.

An entity's profile is stored as JSON in its row and fixed at creation (Service
Bus cannot change duplicate detection after creating an entity either).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from datetime import timedelta
from typing import NamedTuple

from ..._entity import EntityProfile
from ...errors import ConfigurationError, PermanentSendError
from ._store import US, Store

SUBSCRIPTIONS = "SELECT name FROM subscriptions WHERE eid = ? ORDER BY name"


def profile_to_json(profile: EntityProfile) -> str:
    return json.dumps(
        {
            "kind": profile.kind,
            "duplicate_detection": profile.duplicate_detection,
            "window_us": profile.duplicate_detection_window // US,
            "partitioned": profile.partitioned,
            "sessions": profile.sessions,
            "max_message_size": profile.max_message_size,
            "id_cache_size": profile.id_cache_size,
            "persist_id_cache": profile.persist_id_cache,
            "max_delivery_count": profile.max_delivery_count,
            "default_ttl_us": None
            if profile.default_message_time_to_live is None
            else profile.default_message_time_to_live // US,
            "dead_letter_on_expiry": profile.dead_lettering_on_message_expiration,
        },
        sort_keys=True,
    )


def check_same(wanted: EntityProfile, existing: EntityProfile) -> None:
    """Refuse an ``exist_ok`` create whose profile differs from the entity's."""
    for item in dataclasses.fields(EntityProfile):
        if getattr(existing, item.name) != getattr(wanted, item.name):
            raise ConfigurationError(
                f"entity {wanted.name!r} exists with {item.name}="
                f"{getattr(existing, item.name)!r}, not {getattr(wanted, item.name)!r}",
                field=item.name,
            )


def profile_from_json(name: str, text: str) -> EntityProfile:
    data = json.loads(text)
    return EntityProfile(
        name,
        kind=data["kind"],
        duplicate_detection=data["duplicate_detection"],
        duplicate_detection_window=timedelta(microseconds=data["window_us"]),
        partitioned=data["partitioned"],
        sessions=data["sessions"],
        max_message_size=data["max_message_size"],
        id_cache_size=data["id_cache_size"],
        persist_id_cache=data["persist_id_cache"],
        max_delivery_count=data.get("max_delivery_count", 10),  # absent before it existed
        default_message_time_to_live=None
        if data.get("default_ttl_us") is None
        else timedelta(microseconds=data["default_ttl_us"]),
        dead_lettering_on_message_expiration=data.get("dead_letter_on_expiry", False),
    )


def forget_volatile_caches(conn: sqlite3.Connection) -> None:
    """First opener: the broker "restarts", so caches with persist_id_cache=False go.

    Session locks go too: no process had the file open, so none can hold a session.
    """
    conn.execute("DELETE FROM session_locks")
    for eid, name, text in conn.execute("SELECT eid, name, profile FROM entities").fetchall():
        if not profile_from_json(name, text).persist_id_cache:
            conn.execute("DELETE FROM ids WHERE eid = ?", (eid,))
            conn.execute(
                "UPDATE entities SET id_count = 0, first_stamp = NULL WHERE eid = ?", (eid,)
            )


def lookup(
    conn: sqlite3.Connection, name: str, *, sending: bool = False
) -> tuple[int, EntityProfile, int, int]:
    """(eid, profile, next sequence number, ids stored) of an entity; an error if missing."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError("entity must be a non-empty str", field="entity")
    row = conn.execute(
        "SELECT eid, profile, next_seq, id_count FROM entities WHERE name = ?", (name,)
    ).fetchone()
    if row is None:
        if sending:
            raise PermanentSendError(
                f"entity {name!r} does not exist in the local broker",
                condition="amqp:not-found",
            )
        raise ConfigurationError(
            f"entity {name!r} does not exist in the local broker", field="entity"
        )
    eid, text, next_seq, id_count = row
    return eid, profile_from_json(name, text), next_seq, id_count


def place(
    conn: sqlite3.Connection, eid: int, profile: EntityProfile, subscription: str | None
) -> str:
    """The ``sub`` key of a queue (``""``) or of one of a topic's subscriptions."""
    if profile.kind == "queue":
        if subscription is not None:
            raise ConfigurationError(
                f"{profile.name!r} is a queue; it has no subscription {subscription!r}",
                field="subscription",
            )
        return ""
    if subscription is None:
        raise ConfigurationError(
            f"{profile.name!r} is a topic: name a subscription to read from",
            field="subscription",
        )
    if (
        conn.execute(
            "SELECT 1 FROM subscriptions WHERE eid = ? AND name = ?", (eid, subscription)
        ).fetchone()
        is None
    ):
        raise ConfigurationError(
            f"topic {profile.name!r} has no subscription {subscription!r}",
            field="subscription",
        )
    return subscription


def entity_row(conn: sqlite3.Connection, name: str) -> tuple[int, str, int, IdState]:
    """(eid, profile text, next sequence number, the state of its ids) of an entity."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError("entity must be a non-empty str", field="entity")
    row = conn.execute(
        "SELECT eid, profile, next_seq, id_count, sweep_mid, sweep_pkey, first_stamp "
        "FROM entities WHERE name = ?",
        (name,),
    ).fetchone()
    if row is None:
        raise PermanentSendError(
            f"entity {name!r} does not exist in the local broker",
            condition="amqp:not-found",
        )
    eid, text, next_seq, id_count, sweep_mid, sweep_pkey, first_stamp = row
    return eid, text, next_seq, IdState(id_count, (sweep_mid, sweep_pkey), first_stamp)


def profile_of(store: Store, name: str, text: str) -> EntityProfile:
    """The profile stored as ``text``, parsed once per change and remembered."""
    known = store.profiles.get(name)
    if known is not None and known[0] == text:
        return known[1]
    profile = profile_from_json(name, text)
    store.profiles[name] = (text, profile)
    return profile


# -- administration -----------------------------------------------------------------


def describe(store: Store, entity: str) -> EntityProfile:
    """The profile of ``entity`` as the broker enforces it."""
    return store.read(lambda conn: lookup(conn, entity)[1])


def create_entity(store: Store, profile: EntityProfile, *, exist_ok: bool = False) -> None:
    """Create a queue or topic. Its duplicate-detection settings are fixed from now on."""
    if not isinstance(profile, EntityProfile):
        raise ConfigurationError("profile must be an EntityProfile", field="profile")
    text = profile_to_json(profile)

    def existing(conn: sqlite3.Connection) -> bool:
        row = conn.execute(
            "SELECT profile FROM entities WHERE name = ?", (profile.name,)
        ).fetchone()
        if row is None:
            return False
        if not exist_ok:
            raise ConfigurationError(f"entity {profile.name!r} already exists", field="entity")
        check_same(profile, profile_from_json(profile.name, row[0]))
        return True

    def work(conn: sqlite3.Connection) -> None:
        if not existing(conn):
            conn.execute("INSERT INTO entities (name, profile) VALUES (?, ?)", (profile.name, text))

    # A read first: a sender opening on an existing entity needs no write lock, so
    # it does not wait behind other writers.
    if not store.read(existing):
        store.write(work)


def delete_entity(store: Store, name: str) -> None:
    """Delete an entity with its messages, subscriptions and remembered ids."""

    def work(conn: sqlite3.Connection) -> None:
        eid = lookup(conn, name)[0]
        for table in ("messages", "ids", "subscriptions", "session_states", "session_locks"):
            conn.execute(f"DELETE FROM {table} WHERE eid = ?", (eid,))
        conn.execute("DELETE FROM entities WHERE eid = ?", (eid,))

    store.write(work)


def entities(store: Store) -> list[EntityProfile]:
    """The profile of every queue and topic in the broker, by name."""
    rows = store.read(
        lambda conn: conn.execute("SELECT name, profile FROM entities ORDER BY name").fetchall()
    )
    return [profile_from_json(name, text) for name, text in rows]


def create_subscription(store: Store, topic: str, name: str, *, exist_ok: bool = False) -> None:
    """Add a subscription; it receives a copy of every message accepted from now on."""
    if not isinstance(name, str) or not name.strip() or "/" in name or len(name) > 50:
        raise ConfigurationError(
            f"subscription name {name!r} must be a non-empty str of at most 50 characters "
            "without '/'",
            field="subscription",
        )

    def work(conn: sqlite3.Connection) -> None:
        eid, profile, _, _ = lookup(conn, topic)
        if profile.kind != "topic":
            raise ConfigurationError(
                f"{topic!r} is a queue; only topics have subscriptions", field="topic"
            )
        cur = conn.execute(
            "INSERT OR IGNORE INTO subscriptions (eid, name) VALUES (?, ?)", (eid, name)
        )
        if cur.rowcount == 0 and not exist_ok:
            raise ConfigurationError(
                f"topic {topic!r} already has subscription {name!r}", field="subscription"
            )

    store.write(work)


def subscriptions(store: Store, topic: str) -> list[str]:
    """The names of ``topic``'s subscriptions (none: its messages are kept nowhere)."""

    def work(conn: sqlite3.Connection) -> list[str]:
        eid = lookup(conn, topic)[0]
        return [
            r[0]
            for r in conn.execute(
                "SELECT name FROM subscriptions WHERE eid = ? ORDER BY name", (eid,)
            )
        ]

    return store.read(work)


class IdState(NamedTuple):
    """What an entity's row says about its dedup ids (see the schema's notes)."""

    id_count: int
    """Ids stored (count-bounded caches)."""
    cursor: tuple[str, str]
    """The key the last sweep stopped after."""
    first_stamp: int | None
    """The earliest stamp any of its ids got; None before the first."""
