"""Per-entity and per-subscription receive settings, and case-insensitive names.

Service Bus keeps lock duration, sessions, max delivery count, default time to live
and dead-lettering on expiration per queue and per subscription; names of entities
and subscriptions ignore case. The real broker file, moved by an injected clock.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from _clock import Clock
from _old_schemas import as_version_6

from sendonce import (
    ConfigurationError,
    EntityProfile,
    Message,
    SubscriptionProfile,
    ValidationError,
)
from sendonce.backends.local import BrokerFileError, LocalBackend
from sendonce.backends.local._schema import SCHEMA_VERSION


def msg(message_id: str, session_id: str | None = None) -> Message:
    return Message(b"body-" + message_id.encode(), message_id=message_id, session_id=session_id)


def ids(messages: list) -> list[str]:
    return [m.message_id for m in messages]


# -- lock duration ----------------------------------------------------------------------


def test_lock_duration_defaults_to_one_minute_and_is_checked_naming_the_field() -> None:
    assert EntityProfile("q").lock_duration == timedelta(minutes=1)
    for bad in (timedelta(milliseconds=500), timedelta(minutes=6), 30, None):
        with pytest.raises(ConfigurationError) as caught:
            EntityProfile("q", lock_duration=bad)  # type: ignore[arg-type]
        assert caught.value.field == "lock_duration"
        assert "lock_duration" in str(caught.value)
    assert EntityProfile("q", lock_duration=timedelta(seconds=1)).lock_duration.seconds == 1
    assert EntityProfile("q", lock_duration=timedelta(minutes=5)).lock_duration.seconds == 300


def test_a_queue_locks_messages_for_its_own_lock_duration(broker: LocalBackend, clock: Clock):
    broker.create_entity(EntityProfile("short", lock_duration=timedelta(seconds=2)))
    broker.create_entity(EntityProfile("long"))
    assert broker.describe("short").lock_duration == timedelta(seconds=2)
    for name in ("short", "long"):
        broker.send(name, [msg(name)], timeout=5)
    (short,) = broker.receive("short", mode="peek_lock")
    (long,) = broker.receive("long", mode="peek_lock")
    assert short.locked_until == clock.now + timedelta(seconds=2)
    assert long.locked_until == clock.now + timedelta(minutes=1)
    clock.advance(seconds=3)
    # The short lock expired: the message is delivered again; the long one is still held.
    (again,) = broker.receive("short", mode="peek_lock")
    assert (again.message_id, again.delivery_count) == ("short", 2)
    assert broker.receive("long", mode="peek_lock") == []
    # Renewal extends by the entity's lock duration; an explicit one still wins.
    assert broker.renew_lock("short", again.lock_token) == clock.now + timedelta(seconds=2)
    explicit = broker.renew_lock("short", again.lock_token, lock_duration=timedelta(seconds=30))
    assert explicit == clock.now + timedelta(seconds=30)


def test_a_session_is_locked_for_the_entity_s_lock_duration(broker: LocalBackend, clock: Clock):
    broker.create_entity(EntityProfile("s", sessions=True, lock_duration=timedelta(seconds=5)))
    broker.send("s", [msg("a", "one")], timeout=5)
    with broker.accept_session("s", "one") as session:
        assert session.lock_duration == timedelta(seconds=5)
        assert session.locked_until == clock.now + timedelta(seconds=5)
        clock.advance(seconds=4)
        assert session.renew_lock() == clock.now + timedelta(seconds=5)


def test_an_explicit_bad_lock_duration_is_refused_naming_it_and_locks_nothing(
    broker: LocalBackend,
) -> None:
    broker.create_entity(EntityProfile("orders"))
    broker.send("orders", [msg("a")], timeout=5)
    for bad in (timedelta(0), 5):
        with pytest.raises(ValidationError) as caught:
            broker.receive("orders", mode="peek_lock", lock_duration=bad)  # type: ignore[arg-type]
        assert caught.value.field == "lock_duration"
    assert broker.count("orders") == 1  # nothing was locked


def test_an_old_profile_without_lock_duration_reads_as_one_minute(db: str) -> None:
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT profile FROM entities").fetchone()
        data = json.loads(text)
        del data["lock_us"]
        conn.execute("UPDATE entities SET profile = ?", (json.dumps(data),))
    with LocalBackend(db) as broker:
        assert broker.describe("orders").lock_duration == timedelta(minutes=1)


# -- subscription settings --------------------------------------------------------------


def test_subscriptions_take_the_topic_s_settings_unless_given_their_own(
    broker: LocalBackend,
) -> None:
    broker.create_entity(
        EntityProfile(
            "events",
            kind="topic",
            max_delivery_count=4,
            lock_duration=timedelta(seconds=20),
            dead_lettering_on_message_expiration=True,
        )
    )
    inherited = broker.create_subscription("events", "audit")
    assert inherited == SubscriptionProfile(
        "audit",
        max_delivery_count=4,
        lock_duration=timedelta(seconds=20),
        dead_lettering_on_message_expiration=True,
    )
    own = broker.create_subscription(
        "events",
        "billing",
        max_delivery_count=2,
        lock_duration=timedelta(seconds=3),
        default_message_time_to_live=timedelta(minutes=1),
        dead_lettering_on_message_expiration=False,
        sessions=True,
    )
    assert broker.describe_subscription("events", "billing") == own
    assert broker.subscription_profiles("events") == [inherited, own]
    whole = SubscriptionProfile("shipping", max_delivery_count=7)
    assert broker.create_subscription("events", whole) == whole


def test_subscription_settings_are_checked_naming_the_field(broker: LocalBackend) -> None:
    broker.create_entity(EntityProfile("events", kind="topic"))
    cases = [
        ({"max_delivery_count": 0}, "max_delivery_count"),
        ({"lock_duration": timedelta(minutes=10)}, "lock_duration"),
        ({"default_message_time_to_live": timedelta(0)}, "default_message_time_to_live"),
        ({"sessions": "yes"}, "sessions"),
    ]
    for options, field in cases:
        with pytest.raises(ConfigurationError) as caught:
            broker.create_subscription("events", "bad", **options)  # type: ignore[arg-type]
        assert caught.value.field == field, options
    with pytest.raises(ConfigurationError) as caught:
        broker.create_subscription("events", SubscriptionProfile("x"), max_delivery_count=3)
    assert caught.value.field == "max_delivery_count"
    broker.create_subscription("events", "audit", max_delivery_count=3)
    with pytest.raises(ConfigurationError) as caught:
        broker.create_subscription("events", "audit", max_delivery_count=4, exist_ok=True)
    assert caught.value.field == "max_delivery_count"
    assert "subscription 'audit' exists with max_delivery_count=3" in str(caught.value)
    assert broker.subscriptions("events") == ["audit"]  # nothing else was created


def test_each_subscription_dead_letters_after_its_own_max_delivery_count(
    broker: LocalBackend,
) -> None:
    broker.create_entity(EntityProfile("events", kind="topic"))
    broker.create_subscription("events", "strict", max_delivery_count=2)
    broker.create_subscription("events", "lenient")
    broker.send("events", [msg("m")], timeout=5)
    for _ in range(2):
        for sub in ("strict", "lenient"):
            (got,) = broker.receive("events", subscription=sub, mode="peek_lock")
            broker.abandon("events", got.lock_token, subscription=sub)
    assert broker.receive("events", subscription="strict", mode="peek_lock") == []
    (dead,) = broker.receive("events", subscription="strict", sub_queue="dead_letter")
    assert (dead.message_id, dead.dead_letter_reason) == ("m", "MaxDeliveryCountExceeded")
    (third,) = broker.receive("events", subscription="lenient")
    assert (third.message_id, third.delivery_count) == ("m", 3)


def test_each_subscription_expires_copies_by_its_own_time_to_live(
    broker: LocalBackend, clock: Clock
) -> None:
    broker.create_entity(EntityProfile("events", kind="topic"))
    broker.create_subscription(
        "events",
        "brief",
        default_message_time_to_live=timedelta(seconds=10),
        dead_lettering_on_message_expiration=True,
    )
    broker.create_subscription("events", "gone", default_message_time_to_live=timedelta(seconds=10))
    broker.create_subscription("events", "forever")
    broker.send("events", [msg("m")], timeout=5)
    clock.advance(seconds=11)
    assert broker.receive("events", subscription="brief") == []
    assert broker.receive("events", subscription="gone") == []
    (dead,) = broker.receive("events", subscription="brief", sub_queue="dead_letter")
    assert (dead.message_id, dead.dead_letter_reason) == ("m", "TTLExpiredException")
    assert broker.receive("events", subscription="gone", sub_queue="dead_letter") == []
    assert ids(broker.receive("events", subscription="forever")) == ["m"]


def test_the_shorter_of_the_topic_s_and_the_subscription_s_time_to_live_applies(
    broker: LocalBackend, clock: Clock
) -> None:
    broker.create_entity(
        EntityProfile("events", kind="topic", default_message_time_to_live=timedelta(seconds=5))
    )
    broker.create_subscription("events", "longer", default_message_time_to_live=timedelta(hours=1))
    broker.send("events", [msg("m")], timeout=5)
    clock.advance(seconds=6)
    assert broker.peek("events", subscription="longer") == []
    assert broker.receive("events", subscription="longer") == []


def test_a_sessionful_subscription_of_a_sessionless_topic(broker: LocalBackend) -> None:
    """Service Bus accepts the send and dead-letters the sessionful subscription's copy of
    a message without a session id ("Session id is null."); other subscriptions get it."""
    broker.create_entity(EntityProfile("events", kind="topic"))
    broker.create_subscription("events", "ordered", sessions=True)
    broker.create_subscription("events", "plain")
    broker.send("events", [msg("loose"), msg("keyed", "s1")], timeout=5)
    assert ids(broker.receive("events", subscription="plain", max_messages=5)) == [
        "loose",
        "keyed",
    ]
    (dead,) = broker.receive("events", subscription="ordered", sub_queue="dead_letter")
    assert (dead.message_id, dead.dead_letter_reason) == ("loose", "Session id is null.")
    assert "session identifier is null" in (dead.dead_letter_error_description or "")
    with broker.accept_session("events", subscription="ordered") as session:
        assert (session.session_id, ids(session.receive())) == ("s1", ["keyed"])
    # A plain subscription has no sessions to accept.
    with pytest.raises(ConfigurationError) as caught:
        broker.accept_session("events", "s1", subscription="plain")
    assert caught.value.field == "subscription"


def test_a_subscription_locks_for_its_own_lock_duration(broker: LocalBackend, clock: Clock):
    broker.create_entity(EntityProfile("events", kind="topic", sessions=True))
    broker.create_subscription("events", "quick", lock_duration=timedelta(seconds=2))
    broker.create_subscription("events", "slow", sessions=False)
    broker.send("events", [msg("m", "s1")], timeout=5)
    with broker.accept_session("events", subscription="quick") as session:
        assert session.locked_until == clock.now + timedelta(seconds=2)
    (got,) = broker.receive("events", subscription="slow", mode="peek_lock")
    assert got.locked_until == clock.now + timedelta(minutes=1)


# -- case-insensitive names -------------------------------------------------------------


def test_entity_names_ignore_case_and_keep_the_name_as_created(broker: LocalBackend) -> None:
    broker.create_entity(EntityProfile("Orders"))
    broker.send("ORDERS", [msg("a")], timeout=5)
    broker.send("orders", [msg("a"), msg("b")], timeout=5)  # "a": a duplicate, one entity
    assert broker.describe("oRdErS").name == "Orders"
    assert [p.name for p in broker.entities()] == ["Orders"]
    assert ids(broker.receive("orders", max_messages=5)) == ["a", "b"]
    with pytest.raises(ConfigurationError) as caught:
        broker.create_entity(EntityProfile("ORDERS"))
    assert "as 'Orders'" in str(caught.value)
    broker.create_entity(EntityProfile("ORDERS"), exist_ok=True)  # the same entity
    broker.delete_entity("ORDERS")
    assert broker.entities() == []


def test_subscription_names_ignore_case(broker: LocalBackend) -> None:
    broker.create_entity(EntityProfile("events", kind="topic"))
    broker.create_subscription("events", "Billing")
    with pytest.raises(ConfigurationError) as caught:
        broker.create_subscription("EVENTS", "BILLING")
    assert caught.value.field == "subscription"
    broker.send("Events", [msg("a")], timeout=5)
    assert broker.count("events", subscription="billing") == 1
    (got,) = broker.receive("events", subscription="BILLING", mode="peek_lock")
    broker.complete("events", got.lock_token, subscription="bIlLiNg")
    assert broker.subscriptions("events") == ["Billing"]
    assert broker.describe_subscription("events", "billing").name == "Billing"


# -- the upgrade from version 6 ---------------------------------------------------------


def test_a_version_6_file_is_upgraded_and_its_subscriptions_follow_their_topic(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "v6.db")
    with LocalBackend(path) as broker:
        broker.create_entity(
            EntityProfile("events", kind="topic", sessions=True, max_delivery_count=3)
        )
        broker.create_subscription("events", "audit")
        broker.send("events", [msg("kept", "s1")], timeout=5)
    with sqlite3.connect(path) as conn:
        as_version_6(conn)
        (text,) = conn.execute("SELECT profile FROM entities").fetchone()
        data = json.loads(text)
        del data["lock_us"]  # version 6 profiles had no lock duration
        conn.execute("UPDATE entities SET profile = ?", (json.dumps(data),))
    with LocalBackend(path) as broker:
        assert broker.describe_subscription("events", "AUDIT") == SubscriptionProfile(
            "audit", sessions=True, max_delivery_count=3
        )
        with broker.accept_session("EVENTS", subscription="Audit") as session:
            assert ids(session.receive()) == ["kept"]
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == (SCHEMA_VERSION,) == ("7",)


def test_a_version_6_file_with_names_differing_only_by_case_is_refused(tmp_path: Path):
    path = str(tmp_path / "v6.db")
    with LocalBackend(path) as broker:
        broker.create_entity(EntityProfile("orders"))
        broker.send("orders", [msg("a")], timeout=5)
    with sqlite3.connect(path) as conn:
        as_version_6(conn)
        conn.execute("INSERT INTO entities (name, profile) SELECT 'ORDERS', profile FROM entities")
    with pytest.raises(BrokerFileError) as caught:
        LocalBackend(path)
    text = str(caught.value)
    assert "'orders'" in text and "'ORDERS'" in text and "differ only by case" in text
    with sqlite3.connect(path) as conn:  # untouched: still version 6, both entities
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            "6",
        )
        assert conn.execute("SELECT count(*) FROM entities").fetchone() == (2,)


def test_a_version_6_file_with_subscriptions_differing_only_by_case_is_refused(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "v6.db")
    with LocalBackend(path) as broker:
        broker.create_entity(EntityProfile("events", kind="topic"))
        broker.create_subscription("events", "audit")
    with sqlite3.connect(path) as conn:
        as_version_6(conn)
        conn.execute("INSERT INTO subscriptions (eid, name) SELECT eid, 'Audit' FROM entities")
    with pytest.raises(BrokerFileError) as caught:
        LocalBackend(path)
    assert "'Audit' and 'audit' of topic 'events'" in str(caught.value)


def test_a_subscription_s_own_time_to_live_is_the_one_reported(broker: LocalBackend) -> None:
    """Service Bus reports the effective time to live of a message without its own: here the
    subscription's, through peek, receive and a session's deferred receive alike."""
    broker.create_entity(EntityProfile("events", kind="topic"))
    broker.create_subscription("events", "brief", default_message_time_to_live=timedelta(hours=1))
    broker.create_subscription(
        "events", "ordered", sessions=True, default_message_time_to_live=timedelta(minutes=5)
    )
    broker.send("events", [msg("m", "s1")], timeout=5)
    (peeked,) = broker.peek("events", subscription="brief")
    assert peeked.time_to_live == timedelta(hours=1)
    (got,) = broker.receive("events", subscription="brief")
    assert got.time_to_live == timedelta(hours=1)
    with broker.accept_session("events", "s1", subscription="ordered") as session:
        (first,) = session.receive()
        session.defer(first)
        (deferred,) = session.receive_deferred([first.sequence_number])
        assert deferred.time_to_live == timedelta(minutes=5)
        session.complete(deferred)
