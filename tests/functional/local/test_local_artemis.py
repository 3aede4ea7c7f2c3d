"""Artemis-style duplicate detection: count-bounded id cache, persistence, transactional groups."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest

from sendonce import Message, TransientSendError
from sendonce.backends import Ack
from sendonce.backends.local import LocalBackend


def msg(message_id: str, body: str = "b") -> Message:
    return Message(body, message_id=message_id)


def test_cache_evicts_the_oldest_id_first(broker, make_entity):
    make_entity(id_cache_size=100)
    broker.send("orders", [msg(f"id-{i}") for i in range(100)], timeout=5)
    assert broker.send("orders", [msg("id-0")], timeout=5) == [Ack("duplicate")]
    broker.send("orders", [msg("id-100")], timeout=5)  # the 101st id evicts id-0
    assert broker.stats("orders")["ids_remembered"] == 100
    assert broker.send("orders", [msg("id-0")], timeout=5)[0].outcome == "accepted"  # evicts id-1
    assert broker.send("orders", [msg("id-1")], timeout=5)[0].outcome == "accepted"  # evicts id-2
    acks = broker.send("orders", [msg(f"id-{i}") for i in range(3, 101)], timeout=5)
    assert {a.outcome for a in acks} == {"duplicate"}


def test_cache_is_count_bounded_not_time_bounded(broker, make_entity, clock):
    make_entity(id_cache_size=10)
    broker.send("orders", [msg("a")], timeout=5)
    clock.advance(days=30)
    assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]


def test_cache_storage_stays_at_its_size(broker, make_entity, db):
    make_entity(id_cache_size=100)
    for start in range(0, 1000, 250):
        broker.send("orders", [msg(f"id-{i}") for i in range(start, start + 250)], timeout=5)
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT count(*) FROM ids").fetchone()[0] == 100


def test_persisted_cache_survives_restart(db, clock):
    from sendonce import EntityProfile

    with LocalBackend(db, clock=clock) as broker:
        broker.create_entity(EntityProfile("orders", id_cache_size=100))
        broker.send("orders", [msg("a")], timeout=5)
    with LocalBackend(db, clock=clock) as broker:
        assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]


def test_unpersisted_cache_starts_empty_after_restart(db, clock):
    from sendonce import EntityProfile

    with LocalBackend(db, clock=clock) as broker:
        broker.create_entity(EntityProfile("orders", id_cache_size=100, persist_id_cache=False))
        broker.send("orders", [msg("a")], timeout=5)
        assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]
        # Another opener while the broker is "running" shares its cache.
        with LocalBackend(db, clock=clock) as second:
            assert second.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]
    # Nobody holds the file open any more: opening it is a restart.
    with LocalBackend(db, clock=clock) as broker:
        assert broker.stats("orders")["ids_remembered"] == 0
        assert broker.send("orders", [msg("a")], timeout=5)[0].outcome == "accepted"
        assert broker.message_ids("orders") == ["a", "a"]


def test_transactional_group_with_one_duplicate_stores_nothing(broker, make_entity):
    make_entity(id_cache_size=1000)
    broker.send("orders", [msg("b")], timeout=5)
    acks = broker.send("orders", [msg("a"), msg("b"), msg("c")], timeout=5, atomic=True)
    # b is the duplicate; a and c were dropped with the group and are stored nowhere
    assert acks == [Ack("ignored"), Ack("duplicate"), Ack("ignored")]
    assert broker.message_ids("orders") == ["b"]
    # Nothing of the ignored group was remembered either.
    acks = broker.send("orders", [msg("a"), msg("c")], timeout=5, atomic=True)
    assert [a.outcome for a in acks] == ["accepted", "accepted"]
    assert broker.message_ids("orders") == ["b", "a", "c"]


def test_transactional_group_repeating_an_id_is_ignored_whole(broker, make_entity):
    make_entity(id_cache_size=1000)
    acks = broker.send("orders", [msg("a"), msg("a")], timeout=5, atomic=True)
    assert acks == [Ack("ignored"), Ack("duplicate")]
    assert broker.message_ids("orders") == []


def test_atomic_group_on_a_window_entity(broker, make_entity):
    make_entity(duplicate_detection_window=timedelta(minutes=1))
    broker.send("orders", [msg("x")], timeout=5)
    assert broker.send("orders", [msg("y"), msg("x")], timeout=5, atomic=True) == [
        Ack("ignored"),
        Ack("duplicate"),
    ]
    assert broker.message_ids("orders") == ["x"]


def test_busy_file_becomes_transient_error_never_database_locked(broker, make_entity, db):
    make_entity()
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
        with pytest.raises(TransientSendError) as info:
            broker.send("orders", [msg("a")], timeout=0.3)
        assert "database is locked" not in str(info.value)
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert broker.send("orders", [msg("a")], timeout=5)[0].outcome == "accepted"
