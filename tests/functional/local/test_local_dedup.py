"""Duplicate detection by time window (Service Bus) on a real broker file."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest

from sendonce import ConfigurationError, EntityProfile, Message, PermanentSendError
from sendonce.backends import Ack
from sendonce.backends.local import LocalBackend


def msg(message_id: str, body: str = "b", **kw: object) -> Message:
    return Message(body, message_id=message_id, **kw)  # type: ignore[arg-type]


def test_resend_after_commit_leaves_one_message(broker, make_entity):
    make_entity()
    first = broker.send("orders", [msg("order-1")], timeout=5)
    again = broker.send("orders", [msg("order-1")], timeout=5)
    assert first[0].outcome == "accepted" and first[0].sequence_number is not None
    assert again == [Ack("duplicate")]
    assert broker.message_ids("orders") == ["order-1"]


def test_duplicate_inside_one_call_is_dropped(broker, make_entity):
    make_entity()
    acks = broker.send("orders", [msg("a"), msg("b"), msg("a", "other body")], timeout=5)
    assert [a.outcome for a in acks] == ["accepted", "accepted", "duplicate"]
    assert broker.message_ids("orders") == ["a", "b"]
    assert [m.body for m in broker.receive("orders", max_messages=5)] == [b"b", b"b"]


def test_only_the_id_is_compared_not_the_body(broker, make_entity):
    make_entity()
    broker.send("orders", [msg("a", "first")], timeout=5)
    assert broker.send("orders", [msg("a", "second")], timeout=5) == [Ack("duplicate")]
    assert [m.body for m in broker.receive("orders", max_messages=5)] == [b"first"]


def test_partitioned_entity_keys_on_id_and_partition_key(broker, make_entity):
    make_entity(partitioned=True)
    acks = broker.send(
        "orders",
        [msg("a", partition_key="p1"), msg("a", partition_key="p2"), msg("a", partition_key="p1")],
        timeout=5,
    )
    assert [a.outcome for a in acks] == ["accepted", "accepted", "duplicate"]
    assert broker.message_ids("orders") == ["a", "a"]


def test_partitioned_entity_message_id_stands_in_for_a_missing_key(broker, make_entity):
    make_entity(partitioned=True)
    acks = broker.send(
        "orders", [msg("a"), msg("a", partition_key="a"), msg("a", partition_key="x")], timeout=5
    )
    assert [a.outcome for a in acks] == ["accepted", "duplicate", "accepted"]


def test_non_partitioned_entity_ignores_partition_key(broker, make_entity):
    make_entity()
    acks = broker.send(
        "orders", [msg("a", partition_key="p1"), msg("a", partition_key="p2")], timeout=5
    )
    assert [a.outcome for a in acks] == ["accepted", "duplicate"]
    assert broker.message_ids("orders") == ["a"]


def test_window_inside_dropped_after_accepted(broker, make_entity, clock):
    make_entity(duplicate_detection_window=timedelta(minutes=1))
    broker.send("orders", [msg("a")], timeout=5)
    clock.advance(seconds=59)
    assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]
    clock.advance(seconds=2)  # 61 s after the first send
    assert broker.send("orders", [msg("a")], timeout=5)[0].outcome == "accepted"
    assert broker.message_ids("orders") == ["a", "a"]
    # The re-accepted id opens a new window from now.
    clock.advance(seconds=30)
    assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]


def test_window_is_the_entitys_not_a_global_one(broker, make_entity, clock):
    make_entity("short", duplicate_detection_window=timedelta(seconds=20))
    make_entity("long", duplicate_detection_window=timedelta(days=7))
    for name in ("short", "long"):
        broker.send(name, [msg("a")], timeout=5)
    clock.advance(hours=1)
    assert broker.send("short", [msg("a")], timeout=5)[0].outcome == "accepted"
    assert broker.send("long", [msg("a")], timeout=5) == [Ack("duplicate")]


def test_entities_have_separate_id_spaces(broker, make_entity):
    make_entity("one")
    make_entity("two")
    assert broker.send("one", [msg("a")], timeout=5)[0].outcome == "accepted"
    assert broker.send("two", [msg("a")], timeout=5)[0].outcome == "accepted"


def test_dedup_off_stores_everything(broker, make_entity):
    make_entity(duplicate_detection=False)
    acks = broker.send("orders", [msg("a"), msg("a")], timeout=5)
    assert [a.outcome for a in acks] == ["accepted", "accepted"]
    assert broker.send("orders", [msg("a")], timeout=5)[0].outcome == "accepted"
    assert broker.message_ids("orders") == ["a", "a", "a"]


def test_sequence_numbers_increase(broker, make_entity):
    make_entity()
    acks = broker.send("orders", [msg("a"), msg("b")], timeout=5)
    acks += broker.send("orders", [msg("c")], timeout=5)
    seqs = [a.sequence_number for a in acks]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert [m.sequence_number for m in broker.peek("orders", max_messages=5)] == seqs


def test_history_survives_reopening(db, clock, make_entity, broker):
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    broker.close()
    with LocalBackend(db, clock=clock) as again:
        assert again.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]


def test_expired_ids_are_forgotten_incrementally(broker, make_entity, clock, db):
    make_entity(duplicate_detection_window=timedelta(seconds=20))
    for start in range(0, 3000, 500):
        broker.send("orders", [msg(f"old-{i}") for i in range(start, start + 500)], timeout=5)
    clock.advance(seconds=21)
    assert broker.stats("orders")["ids_remembered"] == 0
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT count(*) FROM ids").fetchone()[0] == 3000
    # Each send forgets a bounded batch of expired ids: storage follows the window.
    for start in range(0, 3000, 500):
        broker.send("orders", [msg(f"new-{i}") for i in range(start, start + 500)], timeout=5)
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT count(*) FROM ids").fetchone()[0] == 3000


def test_message_properties_round_trip(broker, make_entity):
    make_entity()
    sent = Message(
        b"\x00body",
        message_id="a",
        subject="s",
        content_type="application/octet-stream",
        correlation_id="c",
        application_properties={"n": 1, "f": 1.5, "t": True, "b": b"\x01", "s": "x", "z": None},
        time_to_live=timedelta(hours=1),
    )
    broker.send("orders", [sent], timeout=5, raw=[b"amqp-bytes"])
    (got,) = broker.receive("orders")
    assert got.body == b"\x00body" and got.subject == "s" and got.correlation_id == "c"
    assert got.content_type == "application/octet-stream"
    assert dict(got.application_properties or {}) == dict(sent.application_properties or {})
    assert isinstance((got.application_properties or {})["t"], bool)
    assert got.time_to_live == timedelta(hours=1)
    assert got.raw == b"amqp-bytes"


def test_unknown_entity_is_permanent_not_found(broker):
    with pytest.raises(PermanentSendError) as info:
        broker.send("nope", [msg("a")], timeout=5)
    assert info.value.condition == "amqp:not-found"
    with pytest.raises(ConfigurationError) as described:
        broker.describe("nope")
    assert described.value.field == "entity"


def test_entity_rules_are_enforced_by_the_broker(broker, make_entity):
    make_entity(sessions=True, max_message_size=1024)
    with pytest.raises(PermanentSendError):
        broker.send("orders", [msg("a")], timeout=5)  # no session id
    with pytest.raises(PermanentSendError) as info:
        broker.send("orders", [msg("b", "x" * 2000, session_id="s")], timeout=5)
    assert info.value.condition == "amqp:link:message-size-exceeded"
    assert broker.message_ids("orders") == []


def test_create_entity_exist_ok_names_the_differing_field(broker, make_entity):
    profile = make_entity(duplicate_detection_window=timedelta(minutes=5))
    broker.create_entity(profile, exist_ok=True)
    with pytest.raises(ConfigurationError) as info:
        broker.create_entity(
            EntityProfile("orders", duplicate_detection_window=timedelta(minutes=6)), exist_ok=True
        )
    assert info.value.field == "duplicate_detection_window"
    with pytest.raises(ConfigurationError) as again:
        broker.create_entity(profile)
    assert again.value.field == "entity"
    assert broker.describe("orders") == profile
    assert broker.entities() == [profile]


def test_delete_entity_forgets_everything(broker, make_entity):
    make_entity()
    broker.send("orders", [msg("a")], timeout=5)
    broker.delete_entity("orders")
    assert broker.entities() == []
    make_entity()
    assert broker.send("orders", [msg("a")], timeout=5)[0].outcome == "accepted"


def test_bad_options_name_the_field(db):
    for kwargs, field in (
        ({"durability": "sometimes"}, "durability"),
        ({"busy_timeout": "soon"}, "busy_timeout"),
        ({"busy_timeout": 0}, "busy_timeout"),
        ({"color": "red"}, "color"),
    ):
        with pytest.raises(ConfigurationError) as info:
            LocalBackend(db, **kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
    with pytest.raises(ConfigurationError) as missing_dir:
        LocalBackend("/nonexistent-dir/broker.db")
    assert missing_dir.value.field == "path"


def test_connect_passes_url_options_as_strings(db):
    from sendonce.backends import connect

    backend = connect(f"local://{db}?durability=full&busy_timeout=2.5")
    try:
        assert isinstance(backend, LocalBackend)
        assert backend.durability == "full"
    finally:
        backend.close()


def test_close_is_idempotent_and_closed_backend_refuses(db):
    backend = LocalBackend(db)
    backend.close()
    backend.close()
    with pytest.raises(ConfigurationError):
        backend.entities()
