"""Session state in the local broker: stored in the file, per entity/subscription and session."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from _old_schemas import as_version_5

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.backends.local._schema import SCHEMA_VERSION
from sendonce.errors import ValidationError


def test_state_is_set_read_cleared_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    with LocalBackend(path) as broker:
        broker.create_entity(EntityProfile("carts", sessions=True))
        assert broker.get_session_state("carts", "S") is None
        broker.set_session_state("carts", "S", b"step-1")
        broker.set_session_state("carts", "S", b"step-2")  # replaced
        broker.set_session_state("carts", "T", b"other")
    with LocalBackend(path) as broker:
        assert broker.get_session_state("carts", "S") == b"step-2"
        assert broker.get_session_state("carts", "T") == b"other"
        broker.set_session_state("carts", "S", None)
        assert broker.get_session_state("carts", "S") is None
        assert broker.get_session_state("carts", "T") == b"other"


def test_state_is_per_subscription_and_deleted_with_the_entity(tmp_path: Path) -> None:
    with LocalBackend(tmp_path / "b.db") as broker:
        broker.create_entity(EntityProfile("events", kind="topic", sessions=True))
        broker.create_subscription("events", "a")
        broker.create_subscription("events", "b")
        broker.set_session_state("events", "S", b"in-a", subscription="a")
        assert broker.get_session_state("events", "S", subscription="b") is None
        broker.delete_entity("events")
        broker.create_entity(EntityProfile("events", kind="topic", sessions=True))
        broker.create_subscription("events", "a")
        assert broker.get_session_state("events", "S", subscription="a") is None


@pytest.mark.parametrize(
    ("session_id", "state", "field"),
    [
        ("", b"x", "session_id"),
        ("a\x00b", b"x", "session_id"),
        (7, b"x", "session_id"),
        ("S", "text", "state"),
        ("S", b"x" * 1025, "state"),
    ],
)
def test_bad_input_is_refused_and_nothing_stored(
    tmp_path: Path, session_id: object, state: object, field: str
) -> None:
    with LocalBackend(tmp_path / "b.db") as broker:
        broker.create_entity(EntityProfile("carts", sessions=True, max_message_size=1024))
        with pytest.raises(ValidationError) as err:
            broker.set_session_state("carts", session_id, state)  # type: ignore[arg-type]
        assert err.value.field == field
        assert broker.get_session_state("carts", "S") is None


def test_a_version_3_file_is_upgraded_with_a_session_state_table(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    with LocalBackend(path) as broker:
        broker.create_entity(EntityProfile("carts", sessions=True))
    conn = sqlite3.connect(path)
    with conn:
        as_version_5(conn)
        conn.execute("DROP TABLE session_states")
        conn.execute("DROP TABLE session_locks")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
    with LocalBackend(path) as broker:
        broker.set_session_state("carts", "S", b"after upgrade")
        assert broker.get_session_state("carts", "S") == b"after upgrade"
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == (SCHEMA_VERSION,)
