"""Forgetting expired dedup ids without an age index (broker schema 6), on real files.

Each send sweeps a bounded slice of the entity's ids in key order, from a cursor kept
in the file. What must hold whatever the sweep has reached: an id inside the window
is a duplicate, an id past it is accepted again, and the table stays within about
twice the ids of one window. A version 5 file (age index, ordinals in ``stamp``)
is upgraded in place and keeps its history.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from _clock import Clock
from _old_schemas import as_version_5
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from property_budget import examples
from sendonce import EntityProfile, Message
from sendonce.backends import Ack
from sendonce.backends.local import LocalBackend
from sendonce.backends.local import _sending as local_sending
from sendonce.backends.local._schema import SCHEMA_VERSION

WINDOW = timedelta(seconds=60)


def msg(message_id: str, partition_key: str | None = None) -> Message:
    return Message("b", message_id=message_id, partition_key=partition_key)


def outcomes(acks: list[Ack]) -> list[str]:
    return [a.outcome for a in acks]


def stored_ids(db: str) -> int:
    with sqlite3.connect(db) as raw:
        count: int = raw.execute("SELECT count(*) FROM ids").fetchone()[0]
    return count


@pytest.fixture
def small_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweep slices of 2 keys per id sent (not at least 256): partial sweeps in small tests."""
    monkeypatch.setattr(local_sending, "_HOUSEKEEPING_MIN", 1)


def test_an_expired_id_is_accepted_again_before_the_sweep_deletes_it(
    broker, make_entity, clock, db, small_sweeps
):
    make_entity(duplicate_detection_window=WINDOW)
    broker.send("orders", [msg(f"id-{i:03}") for i in range(100)], timeout=5)
    clock.advance(seconds=61)
    # A one-id send sweeps two keys: "id-099", last in key order, is still stored...
    assert outcomes(broker.send("orders", [msg("id-099")], timeout=5)) == ["accepted"]
    assert stored_ids(db) >= 98
    # ...and, accepted again, it is a duplicate for a new window.
    assert broker.send("orders", [msg("id-099")], timeout=5) == [Ack("duplicate")]
    clock.advance(seconds=59)
    assert broker.send("orders", [msg("id-099")], timeout=5) == [Ack("duplicate")]


def test_the_sweep_walks_every_key_and_starts_over(broker, make_entity, clock, db, small_sweeps):
    make_entity(duplicate_detection_window=WINDOW)
    broker.send("orders", [msg(f"old-{i:03}") for i in range(200)], timeout=5)
    clock.advance(seconds=61)
    sends = 0
    while stored_ids(db) > sends:  # only the ids sent since are left once all old ones go
        broker.send("orders", [msg(f"new-{sends:03}")], timeout=5)
        sends += 1
        assert sends <= 200, "the sweep never reached some expired ids"
    # Every live id is still remembered: the sweep deleted only expired ones.
    acks = broker.send("orders", [msg(f"new-{i:03}") for i in range(sends)], timeout=5)
    assert set(outcomes(acks)) == {"duplicate"}
    # The cursor went round: the next slices start again from the first key.
    for i in range(sends, sends + 300):
        broker.send("orders", [msg(f"new-{i:03}")], timeout=5)
    assert stored_ids(db) == sends + 300


def test_storage_stays_within_twice_one_windows_ids(broker, make_entity, clock, db, small_sweeps):
    make_entity(duplicate_detection_window=WINDOW)
    per_send, most = 10, 0
    for tick in range(300):  # one send a second for five windows: 600 ids live at a time
        ids = [f"{tick * 7919 % 1000:03}-{i}" for i in range(per_send)]  # scattered keys
        broker.send("orders", [msg(m) for m in ids], timeout=5)
        clock.advance(seconds=1)
        most = max(most, stored_ids(db))
    live = per_send * WINDOW.total_seconds()
    assert live <= most <= 2 * live + 2 * per_send


def test_partitioned_keys_are_swept_too(broker, make_entity, clock, db, small_sweeps):
    make_entity(duplicate_detection_window=WINDOW, partitioned=True)
    broker.send("orders", [msg("same", f"pk-{i}") for i in range(50)], timeout=5)
    clock.advance(seconds=61)
    for i in range(60):
        broker.send("orders", [msg(f"fresh-{i}", "pk-0")], timeout=5)
    assert stored_ids(db) == 60
    assert outcomes(broker.send("orders", [msg("same", "pk-7")], timeout=5)) == ["accepted"]


def test_the_cursor_is_shared_by_every_handle_on_the_file(
    db, clock, make_entity, broker, small_sweeps
):
    """Two handles in one process and a reopened one continue one sweep, not three."""
    make_entity(duplicate_detection_window=WINDOW)
    broker.send("orders", [msg(f"old-{i:03}") for i in range(120)], timeout=5)
    clock.advance(seconds=61)
    with LocalBackend(db, clock=clock) as other:
        for i in range(30):
            (broker if i % 2 else other).send("orders", [msg(f"z-new-{i:03}")], timeout=5)
    with LocalBackend(db, clock=clock) as reopened:
        for i in range(30, 60):
            reopened.send("orders", [msg(f"z-new-{i:03}")], timeout=5)
    # 60 sends of one id sweep 120 keys in all: every old id is gone.
    assert stored_ids(db) == 60


def cursor_and_ids(db: str) -> tuple[tuple[str, str], list[str]]:
    with sqlite3.connect(db) as raw:
        cursor = raw.execute("SELECT sweep_mid, sweep_pkey FROM entities").fetchone()
        ids = [r[0] for r in raw.execute("SELECT mid FROM ids ORDER BY mid")]
    return cursor, ids


def test_no_sweep_runs_before_the_first_id_could_expire(
    broker, make_entity, clock, db, small_sweeps
):
    make_entity(duplicate_detection_window=WINDOW)
    for i in range(50):
        broker.send("orders", [msg(f"id-{i:03}")], timeout=5)
        clock.advance(seconds=1)
    assert cursor_and_ids(db)[0] == ("", "")  # 50 sends, nothing could have expired: no walk
    clock.advance(seconds=10.5)  # id-000 is 60.5 s old, id-001 59.5 s
    broker.send("orders", [msg("id-050")], timeout=5)
    cursor, ids = cursor_and_ids(db)
    assert cursor == ("id-001", "") and ids[0] == "id-001"


def test_a_clock_that_went_back_still_gets_its_ids_swept(
    broker, make_entity, clock, db, small_sweeps
):
    make_entity(duplicate_detection_window=WINDOW)
    broker.send("orders", [msg("b-later")], timeout=5)
    clock.advance(seconds=-120)  # the wall clock was set back
    broker.send("orders", [msg("a-earlier")], timeout=5)
    clock.advance(seconds=61)  # "a-earlier" expired; "b-later" has 119 s left
    broker.send("orders", [msg("c")], timeout=5)
    assert cursor_and_ids(db)[1] == ["b-later", "c"]


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.one_of(
            st.lists(st.integers(0, 30), min_size=1, max_size=6).map(lambda ids: ("send", ids)),
            st.integers(1, 45).map(lambda seconds: ("wait", seconds)),
        ),
        max_size=40,
    )
)
def test_outcomes_follow_the_window_whatever_the_sweep_reached(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, object]]
) -> None:
    """Against a model: an id is a duplicate exactly when accepted less than a window ago."""
    db = str(tmp_path_factory.mktemp("sweep") / "broker.db")
    clock = Clock()  # a fresh one per Hypothesis example
    accepted_at: dict[str, float] = {}
    now = 0.0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_sending, "_HOUSEKEEPING_MIN", 1)
        with LocalBackend(db, clock=clock) as broker:
            broker.create_entity(EntityProfile("orders", duplicate_detection_window=WINDOW))
            for kind, value in steps:
                if kind == "wait":
                    assert isinstance(value, int)
                    clock.advance(seconds=value)
                    now += value
                    continue
                assert isinstance(value, list)
                ids = [f"id-{i}" for i in value]
                expected = []
                for mid in ids:
                    seen = accepted_at.get(mid)
                    if seen is not None and now - seen < WINDOW.total_seconds():
                        expected.append("duplicate")
                    else:
                        expected.append("accepted")
                        accepted_at[mid] = now
                assert outcomes(broker.send("orders", [msg(m) for m in ids], timeout=5)) == expected


def test_a_version_5_file_is_upgraded_and_keeps_its_history(tmp_path: Path, clock) -> None:
    path = str(tmp_path / "v5.db")
    with LocalBackend(path, clock=clock) as broker:
        broker.create_entity(EntityProfile("orders", duplicate_detection_window=WINDOW))
        broker.create_entity(EntityProfile("artemis", id_cache_size=3))
        broker.send("orders", [msg("a"), msg("b")], timeout=5)
        broker.send("artemis", [msg("x1"), msg("x2"), msg("x3")], timeout=5)
    with sqlite3.connect(path) as conn:
        as_version_5(conn)
        assert conn.execute("SELECT count(*) FROM ids WHERE stamp < 100").fetchone() == (3,)
    with LocalBackend(path, clock=clock) as broker:
        assert broker.send("orders", [msg("a")], timeout=5) == [Ack("duplicate")]
        # The cache still forgets exactly its oldest id: x1 goes, then x2.
        assert outcomes(broker.send("artemis", [msg("x4")], timeout=5)) == ["accepted"]
        assert broker.send("artemis", [msg("x3")], timeout=5) == [Ack("duplicate")]
        assert outcomes(broker.send("artemis", [msg("x1")], timeout=5)) == ["accepted"]
        assert outcomes(broker.send("artemis", [msg("x2")], timeout=5)) == ["accepted"]
        assert broker.stats("artemis")["ids_remembered"] == 3
        clock.advance(seconds=61)
        assert outcomes(broker.send("orders", [msg("a")], timeout=5)) == ["accepted"]
    with sqlite3.connect(path) as conn:
        # The upgrade knew the oldest id's age: that send swept the expired "b".
        orders = "SELECT mid FROM ids JOIN entities USING (eid) WHERE name = 'orders'"
        assert [r[0] for r in conn.execute(orders)] == ["a"]
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert version == (SCHEMA_VERSION,)
    assert "ids_age" not in indexes and "ids_ordinal" in indexes
