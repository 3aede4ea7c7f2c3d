"""Issue 28 items 4 and 7, the library side: a new ledger is a decision, keys written by hand
find their rows, and reading a ledger (or a broker) read-only writes nothing beside it."""

from __future__ import annotations

import logging
import os
import pickle
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce._sqlite_share import read_only_options
from sendonce.backends import LocalBackend
from sendonce.errors import ConfigurationError
from sendonce.ledger import Confirmation, Key, Ledger, open_store
from sendonce.ledger._inspect import count_unconfirmed, entity_counts, unconfirmed


def test_a_key_without_partition_key_is_one_key_however_it_is_written() -> None:
    assert Key("a", None) == Key("a", "") == Key("a") == ("a", "")
    assert hash(Key("a", None)) == hash(Key("a", "")) == hash(("a", ""))
    assert Key("a", None).partition_key == ""
    assert Key("a", "p") != Key("a")
    assert Key("a", "p")._replace(partition_key=None) == Key("a")
    assert Key._make(["a", None]) == Key("a")
    assert pickle.loads(pickle.dumps(Key("a", None))) == Key("a")
    assert repr(Key("a", None)) == "Key(message_id='a', partition_key='')"


def test_lookup_finds_a_row_under_either_spelling(tmp_path: Path, ledger_url: str) -> None:
    with Ledger(ledger_url) as ledger:
        ledger._prepare(
            "audit",
            [Message("x", message_id="a")],
            [Key("a")],
            window=timedelta(0),
            margin=timedelta(seconds=5),
        )
        rows = ledger.lookup("audit", [Key("a", None)])
        assert rows[Key("a", None)] is rows[Key("a", "")]
        assert set(ledger.lookup("audit", ["a", ("a", None), Key("a", "")])) == {Key("a")}
        ledger.confirm("audit", {Key("a", None): "sent"})
        assert ledger.lookup("audit", ["a"])[Key("a")].confirmed_at is not None


def test_create_false_refuses_a_ledger_that_does_not_exist(
    ledger_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Ledger(ledger_url, create=False)
    assert refused.value.field == "ledger"
    if ledger_url.startswith("sqlite:"):
        path = ledger_url[len("sqlite://") :]
        assert f"there is no ledger file {path!r}" in str(refused.value)
        assert not os.path.exists(path) and not os.path.exists(path + ".lock")
    else:
        assert "holds no sendonce ledger" in str(refused.value)
    with caplog.at_level(logging.WARNING, logger="sendonce.ledger"), Ledger(ledger_url) as made:
        assert made.created
    assert "created a new, empty ledger at" in caplog.text
    with Ledger(ledger_url, create=False) as found:
        assert not found.created


def test_a_bad_create_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Ledger(f"sqlite://{tmp_path / 'l.db'}", create="yes")  # type: ignore[arg-type]
    assert refused.value.field == "create"
    assert not (tmp_path / "l.db").exists()


def test_the_read_only_options_create_nothing_beside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(f"sqlite://{path}"):
        assert read_only_options(str(path)) == ["mode=ro"]  # open here: its -wal and -shm exist
    assert read_only_options(str(path)) == ["mode=ro&immutable=1"]  # closed: the file alone
    writer = sqlite3.connect(path)  # a crash's leftovers: a -wal holding pages, no -shm
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE t (x)")
    writer.execute("INSERT INTO t VALUES (1)")
    writer.commit()
    Path(str(path) + "-shm").unlink()
    assert os.path.getsize(str(path) + "-wal") > 0
    assert read_only_options(str(path)) == []
    with pytest.raises(ConfigurationError) as refused:
        open_store(f"sqlite://{path}", read_only=True)
    assert "reading it would create one beside it" in str(refused.value)
    assert not os.path.exists(str(path) + "-shm")
    writer.close()


def test_a_read_only_ledger_is_read_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(f"sqlite://{path}") as ledger:
        ledger._prepare(
            "audit",
            [Message(f"e{i}", message_id=f"a{i}") for i in range(5)],
            [Key(f"a{i}") for i in range(5)],
            window=timedelta(0),
            margin=timedelta(seconds=5),
        )
    before = sorted(os.listdir(tmp_path))
    store = open_store(f"sqlite://{path}", read_only=True)
    try:
        assert [c.unconfirmed for c in entity_counts(store)] == [5]
        assert count_unconfirmed(store, "audit") == 5
        assert [u.key for u in unconfirmed(store, "audit", limit=2, offset=1)] == [
            Key("a1"),
            Key("a2"),
        ]
        assert Key("a3") in store.lookup("audit", [Key("a3")])
        assert sorted(os.listdir(tmp_path)) == before  # no -wal, -shm nor .lock while open
        with pytest.raises(ConfigurationError):
            store.confirm("audit", Confirmation((), {Key("a1"): "sent"}), datetime.now(UTC))
    finally:
        store.close()
    assert sorted(os.listdir(tmp_path)) == before


def test_a_read_only_broker_handle_leaves_nothing_beside_the_file(tmp_path: Path) -> None:
    """What the broker's read-only handles do (and the ledger's share): no -wal, no -shm."""
    path = tmp_path / "b.db"
    with LocalBackend(path) as broker:
        broker.create_entity(EntityProfile("orders"))
        with IdempotentSender(broker, "orders") as sender:
            sender.send(Message("x", message_id="1"))
    before = sorted(os.listdir(tmp_path))
    with LocalBackend(path, read_only=True) as reader:
        assert reader.message_ids("orders") == ["1"]
        assert sorted(os.listdir(tmp_path)) == before
    assert sorted(os.listdir(tmp_path)) == before
