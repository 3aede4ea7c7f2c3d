"""Damaged broker files are refused on open with an error naming the path."""

from __future__ import annotations

import os
import random
import sqlite3

import pytest

from sendonce import ConfigurationError, EntityProfile, Message
from sendonce.backends.local import BrokerFileError, LocalBackend


def filled(db: str) -> int:
    """A broker with enough ids and messages to span many pages; returns the file size."""
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
        for start in range(0, 4000, 500):
            broker.send(
                "orders",
                [Message("x" * 200, message_id=f"order-{i}") for i in range(start, start + 500)],
                timeout=5,
            )
    assert not os.path.exists(db + "-wal") or os.path.getsize(db + "-wal") == 0
    return os.path.getsize(db)


def refused(db: str) -> BrokerFileError:
    with pytest.raises(BrokerFileError) as info:
        LocalBackend(db)
    assert db in str(info.value)
    assert isinstance(info.value, ConfigurationError) and info.value.field == "path"
    return info.value


def test_truncated_file_is_refused(db):
    size = filled(db)
    with open(db, "r+b") as f:
        f.truncate(size // 2)
    refused(db)


def test_corrupted_pages_are_refused(db):
    size = filled(db)
    page = 4096
    rng = random.Random(7)
    with open(db, "r+b") as f:
        for number in (size // page // 3, size // page // 2):
            f.seek(number * page)
            f.write(bytes(rng.randrange(256) for _ in range(page)))
    assert "damaged" in str(refused(db))


def test_empty_file_is_refused(db):
    open(db, "wb").close()
    assert "empty" in str(refused(db))


def test_file_that_is_not_sqlite_is_refused(db):
    with open(db, "w") as f:
        f.write("order_id,amount\n" * 20)
    refused(db)


def test_sqlite_file_that_is_not_a_broker_is_refused(db):
    with sqlite3.connect(db) as other:
        other.execute("CREATE TABLE t (x)")
    assert "not a sendonce broker" in str(refused(db))


def test_future_schema_version_is_refused(db):
    filled(db)
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    assert "schema version" in str(refused(db))


def test_intact_file_still_opens_and_remembers(db):
    filled(db)
    with LocalBackend(db) as broker:
        acks = broker.send("orders", [Message("x", message_id="order-7")], timeout=5)
        assert acks[0].outcome == "duplicate"


def clean_flag(db: str) -> str | None:
    with sqlite3.connect(db) as raw:
        row = raw.execute("SELECT value FROM meta WHERE key = 'clean'").fetchone()
    return None if row is None else row[0]


def corrupt_middle(db: str) -> None:
    size = os.path.getsize(db)
    with open(db, "r+b") as f:
        for number in range(2, size // 4096):
            f.seek(number * 4096)
            f.write(b"\xff" * 4096)


def test_clean_close_is_recorded_only_by_the_last_backend(db):
    filled(db)
    assert clean_flag(db) == "1"
    first = LocalBackend(db)
    assert clean_flag(db) == "0"
    second = LocalBackend(db)
    second.close()
    assert clean_flag(db) == "0"  # the first one still has it open
    first.close()
    assert clean_flag(db) == "1"


def test_large_cleanly_closed_file_skips_the_full_check_but_damage_still_surfaces(db, monkeypatch):
    from sendonce.backends.local import _store

    filled(db)
    corrupt_middle(db)
    monkeypatch.setattr(_store, "VERIFY_ALWAYS_BELOW", 0)  # pretend the file is large
    # The damage is reported on open or on first use, never as a raw sqlite3 error.
    with pytest.raises(BrokerFileError) as info:
        with LocalBackend(db) as broker:
            broker.message_ids("orders")
            broker.send("orders", [Message("x", message_id="order-1")], timeout=5)
    assert db in str(info.value)


def test_after_a_crash_a_large_file_is_fully_checked(db, monkeypatch, tmp_path):
    import signal
    import subprocess
    import sys

    from sendonce.backends.local import _store

    filled(db)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from sendonce.backends.local import LocalBackend\n"
            "b = LocalBackend(sys.argv[1]); print('open', flush=True); time.sleep(60)\n",
            db,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "open"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert clean_flag(db) == "0"
    corrupt_middle(db)
    monkeypatch.setattr(_store, "VERIFY_ALWAYS_BELOW", 0)
    assert "damaged" in str(refused(db))
