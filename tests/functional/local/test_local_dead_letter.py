"""Dead-letter subqueues of the local broker, on a real broker file."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from _old_schemas import as_version_5

from sendonce import ConfigurationError, EntityProfile, Message, ValidationError
from sendonce.backends import Ack
from sendonce.backends.local import LocalBackend, LockLostError
from sendonce.backends.local._schema import SCHEMA_VERSION


def msg(message_id: str, body: str = "b") -> Message:
    return Message(body, message_id=message_id)


def test_explicit_dead_letter_keeps_the_message_and_its_reason(broker, make_entity):
    make_entity()
    broker.send("orders", [msg("a", "poison"), msg("b")], timeout=5)
    (a,) = broker.receive("orders", mode="peek_lock")
    broker.dead_letter(
        "orders", a.lock_token, reason="BadFormat", error_description="field x is missing"
    )
    assert broker.peek("orders", max_messages=10)[0].message_id == "b"
    (dead,) = broker.peek("orders", sub_queue="dead_letter")
    assert (dead.message_id, dead.body, dead.sequence_number) == ("a", b"poison", 1)
    assert dead.dead_letter_reason == "BadFormat"
    assert dead.dead_letter_error_description == "field x is missing"
    assert broker.count("orders", sub_queue="dead_letter") == 1
    # settle on the dead-letter subqueue as on the entity
    (locked,) = broker.receive("orders", mode="peek_lock", sub_queue="dead_letter")
    broker.abandon("orders", locked.lock_token, sub_queue="dead_letter")
    (locked,) = broker.receive("orders", mode="peek_lock", sub_queue="dead_letter")
    broker.renew_lock("orders", locked.lock_token, sub_queue="dead_letter")
    broker.complete("orders", locked.lock_token, sub_queue="dead_letter")
    assert broker.peek("orders", sub_queue="dead_letter") == []
    assert [m.message_id for m in broker.receive("orders", max_messages=5)] == ["b"]


def test_a_message_from_the_dead_letter_subqueue_cannot_be_dead_lettered_again(broker, make_entity):
    """Service Bus: "you can't dead-letter a message from a DLQ": it stays there, released."""
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    (a,) = broker.receive("orders", mode="peek_lock")
    broker.dead_letter("orders", a.lock_token, reason="First")
    (dead,) = broker.receive("orders", mode="peek_lock", sub_queue="dead_letter")
    broker.dead_letter("orders", dead.lock_token, reason="Second", sub_queue="dead_letter")
    (again,) = broker.receive("orders", mode="peek_lock", sub_queue="dead_letter")
    assert (again.message_id, again.sequence_number) == ("a", dead.sequence_number)
    assert again.dead_letter_reason == "First"
    with pytest.raises(LockLostError):  # its first lock was released
        broker.dead_letter("orders", dead.lock_token, sub_queue="dead_letter")
    broker.complete("orders", again.lock_token, sub_queue="dead_letter")
    assert broker.peek("orders", sub_queue="dead_letter") == []


def test_dead_lettering_never_touches_duplicate_detection(broker, make_entity):
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    (a,) = broker.receive("orders", mode="peek_lock")
    broker.dead_letter("orders", a.lock_token)
    assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]
    (dead,) = broker.receive("orders", sub_queue="dead_letter")
    assert dead.message_id == "a" and dead.dead_letter_reason is None
    assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]
    assert broker.receive("orders") == []


def test_subscriptions_have_their_own_dead_letter_subqueue(broker, make_entity):
    make_entity("events", kind="topic")
    broker.create_subscription("events", "s1")
    broker.create_subscription("events", "s2")
    broker.send("events", [msg("e")], timeout=5)
    (m,) = broker.receive("events", subscription="s1", mode="peek_lock")
    broker.dead_letter("events", m.lock_token, subscription="s1", reason="r")
    (dead,) = broker.receive("events", subscription="s1", sub_queue="dead_letter")
    assert dead.message_id == "e" and dead.dead_letter_reason == "r"
    assert broker.peek("events", subscription="s2", sub_queue="dead_letter") == []
    assert [m.message_id for m in broker.receive("events", subscription="s2")] == ["e"]


def test_max_delivery_count_dead_letters_after_abandons_and_lock_expiries(
    broker, make_entity, clock
):
    make_entity(max_delivery_count=3)
    broker.send("orders", [msg("poison"), msg("fine")], timeout=5)
    (first,) = broker.receive("orders", mode="peek_lock")
    broker.abandon("orders", first.lock_token)
    (second,) = broker.receive("orders", mode="peek_lock")
    assert second.delivery_count == 2
    clock.advance(seconds=61)  # the lock expires: a delivery that counts too
    (third,) = broker.receive("orders", mode="peek_lock")
    assert third.message_id == "poison" and third.delivery_count == 3
    broker.abandon("orders", third.lock_token)
    (nxt,) = broker.receive("orders", mode="peek_lock")
    assert nxt.message_id == "fine"
    (dead,) = broker.peek("orders", sub_queue="dead_letter")
    assert dead.message_id == "poison" and dead.delivery_count == 3
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.dead_letter_error_description == (
        "Message could not be consumed after 3 delivery attempts."
    )


def test_the_abandon_that_uses_up_the_last_delivery_dead_letters_the_message(broker, make_entity):
    """At the abandon, as Service Bus does: a peek before any further receive finds it in
    the dead-letter subqueue; a session's abandon does the same."""
    make_entity(max_delivery_count=2)
    broker.send("orders", [msg("poison")], timeout=5)
    for attempt in (1, 2):
        (m,) = broker.receive("orders", mode="peek_lock")
        assert m.delivery_count == attempt
        broker.abandon("orders", m.lock_token, properties_to_modify={"tries": attempt})
    assert broker.peek("orders") == [] and broker.count("orders") == 0
    (dead,) = broker.peek("orders", sub_queue="dead_letter")
    assert dead.message_id == "poison" and dead.delivery_count == 2
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.application_properties == {"tries": 2}  # the abandon's properties are kept
    # abandoning it in the dead-letter subqueue only releases it: it stays there
    (again,) = broker.receive("orders", mode="peek_lock", sub_queue="dead_letter")
    broker.abandon("orders", again.lock_token, sub_queue="dead_letter")
    assert [m.message_id for m in broker.peek("orders", sub_queue="dead_letter")] == ["poison"]


def test_a_lost_lock_cannot_be_dead_lettered(broker, make_entity, clock):
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    (a,) = broker.receive("orders", mode="peek_lock", lock_duration=timedelta(seconds=5))
    clock.advance(seconds=6)
    with pytest.raises(LockLostError):
        broker.dead_letter("orders", a.lock_token, reason="late")
    assert broker.peek("orders", sub_queue="dead_letter") == []
    assert [m.message_id for m in broker.receive("orders")] == ["a"]


def test_bad_arguments_name_the_field(broker, make_entity):
    make_entity()
    with pytest.raises(ValidationError) as err:
        broker.receive("orders", sub_queue="deadletter")  # type: ignore[arg-type]
    assert err.value.field == "sub_queue"
    with pytest.raises(ValidationError) as err:
        broker.dead_letter("orders", "t", reason=7)  # type: ignore[arg-type]
    assert err.value.field == "reason"
    with pytest.raises(ConfigurationError) as cerr:
        EntityProfile("q", max_delivery_count=0)
    assert cerr.value.field == "max_delivery_count"


def test_a_version_1_broker_file_is_upgraded(tmp_path: Path):
    path = tmp_path / "v1.db"
    with LocalBackend(path) as broker:
        broker.create_entity(EntityProfile("orders"))
        broker.send("orders", [msg("old")], timeout=5)
    # Make it a version 1 file: no dead-letter or deferral columns, and a profile
    # without max_delivery_count.
    conn = sqlite3.connect(path)
    with conn:
        as_version_5(conn)
        conn.execute("ALTER TABLE messages DROP COLUMN dl_reason")
        conn.execute("ALTER TABLE messages DROP COLUMN dl_description")
        conn.execute("ALTER TABLE messages DROP COLUMN deferred")
        conn.execute("DROP TABLE session_states")
        conn.execute("DROP TABLE session_locks")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        (profile,) = conn.execute("SELECT profile FROM entities").fetchone()
        conn.execute(
            "UPDATE entities SET profile = ?",
            (profile.replace(', "max_delivery_count": 10', ""),),
        )
        assert (
            "max_delivery_count" not in conn.execute("SELECT profile FROM entities").fetchone()[0]
        )
    conn.close()
    with LocalBackend(path) as broker:
        assert broker.describe("orders").max_delivery_count == 10
        (old,) = broker.receive("orders", mode="peek_lock")
        broker.dead_letter("orders", old.lock_token, reason="after upgrade")
        (dead,) = broker.peek("orders", sub_queue="dead_letter")
        assert (dead.message_id, dead.dead_letter_reason) == ("old", "after upgrade")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
        SCHEMA_VERSION,
    )
    conn.close()
