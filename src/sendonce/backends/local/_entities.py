"""Entities: their stored profiles, looking them up in a transaction, and administration.

An entity's profile is stored as JSON in its row and fixed at creation (Service
Bus cannot change duplicate detection after creating an entity either); so is a
subscription's. Names are case-insensitive, as Service Bus's are: ``ORDERS``
finds the entity created as ``orders``, and the name as created is what profiles,
listings and subscription keys carry.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sqlite3
from datetime import timedelta
from typing import NamedTuple

from ..._entity import DEFAULT_LOCK_DURATION, EntityProfile
from ..._subscription import SubscriptionProfile, check_subscription_name
from ...errors import AttemptNotSentError, ConfigurationError, PermanentSendError
from ._store import RESTART_LOCK_WAIT, US, Store

logger = logging.getLogger("sendonce.local")

SUBSCRIPTIONS = "SELECT name FROM subscriptions WHERE eid = ? ORDER BY name"
_SUBSCRIPTION = "SELECT name, profile FROM subscriptions WHERE eid = ? AND name = ? COLLATE NOCASE"
# Service Bus dead-letters a topic message's copy for a sessionful subscription when
# the message has no session id (azure-service-bus#196, azure-sdk-for-js#1118).
SESSION_ID_NULL = "Session id is null."
SESSION_ID_NULL_DESCRIPTION = (
    "Session enabled entity doesn't allow a message whose session identifier is null."
)


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
            "lock_us": profile.lock_duration // US,
        },
        sort_keys=True,
    )


def subscription_to_json(profile: SubscriptionProfile) -> str:
    ttl = profile.default_message_time_to_live
    return json.dumps(
        {
            "sessions": profile.sessions,
            "lock_us": profile.lock_duration // US,
            "max_delivery_count": profile.max_delivery_count,
            "default_ttl_us": None if ttl is None else ttl // US,
            "dead_letter_on_expiry": profile.dead_lettering_on_message_expiration,
        },
        sort_keys=True,
    )


def subscription_from_row(topic: EntityProfile, name: str, text: str | None) -> SubscriptionProfile:
    """A stored subscription's settings; one from before they existed has its topic's."""
    if text is None:
        return SubscriptionProfile(
            name,
            sessions=topic.sessions,
            lock_duration=topic.lock_duration,
            max_delivery_count=topic.max_delivery_count,
            dead_lettering_on_message_expiration=topic.dead_lettering_on_message_expiration,
        )
    data = json.loads(text)
    return SubscriptionProfile(
        name,
        sessions=data["sessions"],
        lock_duration=timedelta(microseconds=data["lock_us"]),
        max_delivery_count=data["max_delivery_count"],
        default_message_time_to_live=None
        if data["default_ttl_us"] is None
        else timedelta(microseconds=data["default_ttl_us"]),
        dead_lettering_on_message_expiration=data["dead_letter_on_expiry"],
    )


def receiving_profile(topic: EntityProfile, subscription: SubscriptionProfile) -> EntityProfile:
    """The topic's profile with the subscription's receive settings: what its receivers get.

    Time to live: the shorter of the topic's and the subscription's defaults.
    """
    ttls = [
        t
        for t in (topic.default_message_time_to_live, subscription.default_message_time_to_live)
        if t is not None
    ]
    return dataclasses.replace(
        topic,
        sessions=subscription.sessions,
        lock_duration=subscription.lock_duration,
        max_delivery_count=subscription.max_delivery_count,
        default_message_time_to_live=min(ttls) if ttls else None,
        dead_lettering_on_message_expiration=subscription.dead_lettering_on_message_expiration,
    )


def check_same(wanted: EntityProfile | SubscriptionProfile, existing: object) -> None:
    """Refuse an ``exist_ok`` create whose profile differs from the existing one.

    Names compare case-insensitively: ``ORDERS`` is the entity ``orders``.
    """
    for item in dataclasses.fields(wanted):
        if item.name == "name":
            continue
        if getattr(existing, item.name) != getattr(wanted, item.name):
            what = "entity" if isinstance(wanted, EntityProfile) else "subscription"
            raise ConfigurationError(
                f"{what} {wanted.name!r} exists with {item.name}="
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
        lock_duration=timedelta(microseconds=data["lock_us"])
        if "lock_us" in data
        else DEFAULT_LOCK_DURATION,  # absent before it existed
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
        "SELECT eid, profile, next_seq, id_count, name FROM entities WHERE name = ? COLLATE NOCASE",
        (name,),
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
    eid, text, next_seq, id_count, created_as = row
    return eid, profile_from_json(created_as, text), next_seq, id_count


def place(
    conn: sqlite3.Connection, eid: int, profile: EntityProfile, subscription: str | None
) -> str:
    """The ``sub`` key of a queue (``""``) or of one of a topic's subscriptions."""
    return place_settings(conn, eid, profile, subscription)[0]


def place_settings(
    conn: sqlite3.Connection, eid: int, profile: EntityProfile, subscription: str | None
) -> tuple[str, EntityProfile]:
    """The ``sub`` key of a queue or subscription and the profile its receivers get.

    A queue's is its own; a subscription's is its topic's with the subscription's
    receive settings (:func:`receiving_profile`). The key is the subscription's name
    as created, whatever the case it is asked for in.
    """
    if profile.kind == "queue":
        if subscription is not None:
            raise ConfigurationError(
                f"{profile.name!r} is a queue; it has no subscription {subscription!r}",
                field="subscription",
            )
        return "", profile
    if subscription is None:
        raise ConfigurationError(
            f"{profile.name!r} is a topic: name a subscription to read from",
            field="subscription",
        )
    row = conn.execute(_SUBSCRIPTION, (eid, subscription)).fetchone()
    if row is None:
        raise ConfigurationError(
            f"topic {profile.name!r} has no subscription {subscription!r}",
            field="subscription",
        )
    name, text = row
    return name, _subscription_receiving(profile, name, text)


@functools.lru_cache(maxsize=1024)
def _subscription_receiving(topic: EntityProfile, name: str, text: str | None) -> EntityProfile:
    """:func:`receiving_profile` of a stored subscription, parsed once (every receive asks)."""
    return receiving_profile(topic, subscription_from_row(topic, name, text))


def dead_letter_sessionless(conn: sqlite3.Connection, eid: int, first: int, last: int) -> None:
    """Move the copies without a session id of sequence numbers ``first``..``last`` out of
    the topic's sessionful subscriptions, into their dead-letter subqueues, as Service Bus
    does. Subscriptions from before version 7 (no profile) follow the topic, whose sender
    already refused such messages if it has sessions.
    """
    sessionful = [
        name
        for (name,) in conn.execute(
            "SELECT name FROM subscriptions WHERE eid = ? AND profile ->> '$.sessions'",
            (eid,),
        )
    ]
    for name in sessionful:
        conn.execute(
            "UPDATE messages SET sub = sub || '/$DeadLetterQueue', dl_reason = ?, "
            "dl_description = ? WHERE eid = ? AND sub = ? AND seq BETWEEN ? AND ? "
            "AND session_id IS NULL",
            (SESSION_ID_NULL, SESSION_ID_NULL_DESCRIPTION, eid, name, first, last),
        )


def entity_row(conn: sqlite3.Connection, name: str) -> tuple[int, str, int, IdState]:
    """(eid, profile text, next sequence number, the state of its ids) of an entity."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError("entity must be a non-empty str", field="entity")
    row = conn.execute(
        "SELECT eid, profile, next_seq, id_count, sweep_mid, sweep_pkey, first_stamp "
        "FROM entities WHERE name = ? COLLATE NOCASE",
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
    """The profile of ``entity`` as the broker enforces it (or will create it with)."""
    try:
        return store.read(lambda conn: lookup(conn, entity)[1])
    except ConfigurationError:
        pending = store.pending.get(entity) if isinstance(entity, str) else None
        if pending is None:
            raise
        return pending


def create_entity(store: Store, profile: EntityProfile, *, exist_ok: bool = False) -> None:
    """Create a queue or topic. Its duplicate-detection settings are fixed from now on.

    ``exist_ok`` (how a sender opens on its entity) never waits for another process's
    write: an existing entity is only read, and a missing one is created if the write
    lock comes within :data:`RESTART_LOCK_WAIT`, else by this backend's first send to it.
    """
    if not isinstance(profile, EntityProfile):
        raise ConfigurationError("profile must be an EntityProfile", field="profile")
    text = profile_to_json(profile)

    def existing(conn: sqlite3.Connection) -> bool:
        return _existing(conn, profile, exist_ok=exist_ok)

    def work(conn: sqlite3.Connection) -> None:
        if not existing(conn):
            conn.execute("INSERT INTO entities (name, profile) VALUES (?, ?)", (profile.name, text))

    # A read first: a sender opening on an existing entity needs no write lock, so
    # it does not wait behind other writers.
    if store.read(existing):
        return
    if not exist_ok:
        store.write(work)
        return
    try:
        store.write(work, timeout=min(store.busy_timeout, RESTART_LOCK_WAIT))
    except AttemptNotSentError:
        # Another process holds the write lock (a long transaction, the sqlite3 shell):
        # the first send creates the entity in its own transaction, which waits and is
        # retried as sends are, so opening waits no longer than for an existing entity.
        store.pending[profile.name] = profile
        logger.info(
            "entity %r does not exist yet and the broker file is locked by another process: "
            "the first send to it creates it",
            profile.name,
        )


def create_pending(conn: sqlite3.Connection, store: Store, entity: str) -> None:
    """In a send's transaction: create ``entity`` if its creation was left to this send."""
    profile = store.pending.get(entity)
    if profile is None:
        return
    if _existing(conn, profile, exist_ok=True):
        store.pending.pop(entity, None)  # created and committed (by this backend or another)
        return
    conn.execute(
        "INSERT INTO entities (name, profile) VALUES (?, ?)",
        (profile.name, profile_to_json(profile)),
    )


def _existing(conn: sqlite3.Connection, profile: EntityProfile, *, exist_ok: bool) -> bool:
    """Whether ``profile``'s entity exists; an error if it may not, or differs from it."""
    row = conn.execute(
        "SELECT name, profile FROM entities WHERE name = ? COLLATE NOCASE", (profile.name,)
    ).fetchone()
    if row is None:
        return False
    if not exist_ok:
        named = "" if row[0] == profile.name else f" (as {row[0]!r}: names ignore case)"
        raise ConfigurationError(f"entity {profile.name!r} already exists{named}", field="entity")
    check_same(profile, profile_from_json(row[0], row[1]))
    return True


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


def create_subscription(
    store: Store,
    topic: str,
    name: str | SubscriptionProfile,
    *,
    exist_ok: bool = False,
    sessions: bool | None = None,
    lock_duration: timedelta | None = None,
    max_delivery_count: int | None = None,
    default_message_time_to_live: timedelta | None = None,
    dead_lettering_on_message_expiration: bool | None = None,
) -> SubscriptionProfile:
    """Add a subscription; it receives a copy of every message accepted from now on.

    ``name`` is a name, with the settings as keywords (None: the topic's profile's;
    no time to live of its own), or a whole :class:`SubscriptionProfile`.
    """
    given = {
        "sessions": sessions,
        "lock_duration": lock_duration,
        "max_delivery_count": max_delivery_count,
        "default_message_time_to_live": default_message_time_to_live,
        "dead_lettering_on_message_expiration": dead_lettering_on_message_expiration,
    }
    if isinstance(name, SubscriptionProfile):
        both = sorted(key for key, value in given.items() if value is not None)
        if both:
            raise ConfigurationError(
                f"subscription {name.name!r}: give {both[0]} in the SubscriptionProfile, "
                "not beside it",
                field=both[0],
            )
    else:
        check_subscription_name(name)

    def resolve(topic_profile: EntityProfile) -> SubscriptionProfile:
        if isinstance(name, SubscriptionProfile):
            return name
        inherited = subscription_from_row(topic_profile, name, None)
        chosen = {key: value for key, value in given.items() if value is not None}
        return dataclasses.replace(inherited, **chosen)  # type: ignore[arg-type]

    def work(conn: sqlite3.Connection) -> SubscriptionProfile:
        eid, profile, _, _ = lookup(conn, topic)
        if profile.kind != "topic":
            raise ConfigurationError(
                f"{topic!r} is a queue; only topics have subscriptions", field="topic"
            )
        wanted = resolve(profile)
        row = conn.execute(_SUBSCRIPTION, (eid, wanted.name)).fetchone()
        if row is not None:
            if not exist_ok:
                named = "" if row[0] == wanted.name else f" (as {row[0]!r}: names ignore case)"
                raise ConfigurationError(
                    f"topic {profile.name!r} already has subscription {wanted.name!r}{named}",
                    field="subscription",
                )
            existing = subscription_from_row(profile, row[0], row[1])
            check_same(wanted, existing)
            return existing
        conn.execute(
            "INSERT INTO subscriptions (eid, name, profile) VALUES (?, ?, ?)",
            (eid, wanted.name, subscription_to_json(wanted)),
        )
        return wanted

    return store.write(work)


def describe_subscription(store: Store, topic: str, name: str) -> SubscriptionProfile:
    """The settings of one of ``topic``'s subscriptions, as the broker applies them."""

    def work(conn: sqlite3.Connection) -> SubscriptionProfile:
        eid, profile, _, _ = lookup(conn, topic)
        sub = place(conn, eid, profile, name)
        row = conn.execute(_SUBSCRIPTION, (eid, sub)).fetchone()
        return subscription_from_row(profile, row[0], row[1])

    return store.read(work)


def subscriptions(store: Store, topic: str) -> list[str]:
    """The names of ``topic``'s subscriptions (none: its messages are kept nowhere)."""

    def work(conn: sqlite3.Connection) -> list[str]:
        eid = lookup(conn, topic)[0]
        return [r[0] for r in conn.execute(SUBSCRIPTIONS, (eid,))]

    return store.read(work)


def subscription_profiles(store: Store, topic: str) -> list[SubscriptionProfile]:
    """The settings of every subscription of ``topic``, by name."""

    def work(conn: sqlite3.Connection) -> list[SubscriptionProfile]:
        eid, profile, _, _ = lookup(conn, topic)
        rows = conn.execute(
            "SELECT name, profile FROM subscriptions WHERE eid = ? ORDER BY name", (eid,)
        )
        return [subscription_from_row(profile, name, text) for name, text in rows]

    return store.read(work)


class IdState(NamedTuple):
    """What an entity's row says about its dedup ids (see the schema's notes)."""

    id_count: int
    """Ids stored (count-bounded caches)."""
    cursor: tuple[str, str]
    """The key the last sweep stopped after."""
    first_stamp: int | None
    """The earliest stamp any of its ids got; None before the first."""
