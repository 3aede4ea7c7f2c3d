"""Entity names in the ledger ignore case, as on Service Bus and in the local broker.

``Orders`` and ``orders`` are one entity there, so an intent recorded under one spelling
is found, confirmed and released under another. Ledgers written before (SQLite schema
2, PostgreSQL schema 1) are upgraded when opened; one that holds keys under two
spellings of one name is refused, naming both, and left as it was.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from ledger_helpers import T0, WINDOW, Clock, msg

from sendonce import (
    ConfigurationError,
    EntityProfile,
    IdempotentSender,
    Ledger,
    LedgerError,
    RetryPolicy,
)
from sendonce.backends import LocalBackend
from sendonce.ledger import Confirmation, Key, body_digest
from sendonce.ledger._inspect import unconfirmed
from sendonce.ledger._pgkeys import ENTITY_SQL
from sendonce.ledger._postgres import PostgresStore

KEYS = [Key(f"order-{i}", "") for i in range(3)]


def test_an_intent_recorded_for_one_spelling_is_found_for_every_other(
    ledger_url: str, clock: Clock
) -> None:
    with Ledger(ledger_url, clock=clock) as ledger:
        store = ledger.store
        store.record_intents("Orders", KEYS, [b"\x01d"] * 3, first_attempt=T0, owner="t1")
        found = store.lookup("orders", KEYS)
        assert sorted(found) == sorted(KEYS) and store.lookup("ORDERS", KEYS).keys() == found.keys()
        assert [u.key for u in unconfirmed(store, "oRDERS", limit=10)] == KEYS
        # a second spelling writes no second row: the key is there already
        again = store.record_intents("ORDERS", KEYS[:1], [b"\x01d"], first_attempt=T0, owner="t2")
        assert again[KEYS[0]].owner == "t1"
        store.confirm("orders", Confirmation((), {KEYS[0]: "sent"}), T0)
        store.release("ORDERS", [KEYS[1]], "t1")
        rows = store.lookup("Orders", KEYS)
        assert rows[KEYS[0]].outcome == "sent" and KEYS[1] not in rows
        assert rows[KEYS[2]].confirmed_at is None
        # another entity stays another entity
        assert store.lookup("orders-2", KEYS) == {}


def test_a_rerun_under_another_spelling_skips_what_the_ledger_confirmed(
    ledger_url: str, broker: LocalBackend, clock: Clock
) -> None:
    retry = RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)
    audit = EntityProfile("Audit", duplicate_detection=False)  # only the ledger dedups here
    with Ledger(ledger_url, clock=clock) as ledger:
        with IdempotentSender(broker, audit, retry=retry, ledger=ledger) as sender:
            assert sender.send_many([msg(i) for i in range(3)]).sent == 3
        clock.now += 2 * WINDOW
        lower = EntityProfile("audit", duplicate_detection=False)
        with IdempotentSender(broker, lower, retry=retry, ledger=ledger) as sender:
            again = sender.send_many([msg(i) for i in range(4)])
    assert sorted(again.from_ledger) == ["order-0", "order-1", "order-2"]
    assert again.sent == 1
    assert sorted(broker.message_ids("AUDIT")) == [f"order-{i}" for i in range(4)]


# -- SQLite: schema 2 files ----------------------------------------------------------------

# Schema 2 as sendonce wrote it before names ignored case (no NOCASE index).
_V2_SCHEMA = """
CREATE TABLE ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO ledger_meta VALUES ('format', 'sendonce-ledger'), ('schema_version', '2');
CREATE TABLE ledger_entities (eid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE ledger_transfers (
    tid INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL UNIQUE,
    first_attempt INTEGER NOT NULL, keys INTEGER NOT NULL DEFAULT 0,
    confirmed_at INTEGER, outcome TEXT
);
CREATE TABLE ledger_keys (
    k TEXT NOT NULL UNIQUE, tid INTEGER NOT NULL, digest TEXT NOT NULL,
    confirmed_at INTEGER, outcome TEXT
);
"""


def _us(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _v2_file(path: Path, entities: dict[str, list[str]]) -> None:
    """A schema 2 ledger: per entity name, confirmed keys (message ids) in one transfer."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(_V2_SCHEMA)
    at = _us(T0)
    for eid, (name, ids) in enumerate(entities.items(), start=1):
        conn.execute("INSERT INTO ledger_entities VALUES (?, ?)", (eid, name))
        if not ids:
            continue
        tid = conn.execute(
            "INSERT INTO ledger_transfers (owner, first_attempt, keys, confirmed_at, outcome) "
            "VALUES (?, ?, ?, ?, 'sent') RETURNING tid",
            (f"owner-{eid}", at, len(ids), at + 5),
        ).fetchone()[0]
        digests = {i: body_digest(msg(int(i.rsplit("-", 1)[1]))).hex() for i in ids}
        conn.executemany(
            "INSERT INTO ledger_keys (k, tid, digest) VALUES (?, ?, ?)",
            [(f"{eid}:000{i}", tid, digests[i]) for i in ids],
        )
    conn.commit()
    conn.close()


def _version(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'")
        return str(row.fetchone()[0])
    finally:
        conn.close()


def test_a_schema_2_file_is_upgraded_and_its_keys_answer_to_any_spelling(
    tmp_path: Path, broker: LocalBackend, clock: Clock
) -> None:
    path = tmp_path / "ledger.db"
    _v2_file(path, {"Orders": ["order-0", "order-1"], "Returns": ["order-0"]})
    retry = RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)
    clock.now = T0 + 2 * WINDOW
    with Ledger(f"sqlite://{path}", clock=clock) as ledger:
        assert sorted(ledger.store.lookup("ORDERS", KEYS)) == KEYS[:2]
        assert list(ledger.store.lookup("returns", KEYS)) == KEYS[:1]
        with IdempotentSender(broker, EntityProfile("orders"), retry=retry, ledger=ledger) as s:
            report = s.send_many([msg(i) for i in range(3)])
    assert sorted(report.from_ledger) == ["order-0", "order-1"] and report.sent == 1
    assert _version(path) == "3"
    conn = sqlite3.connect(path)
    names = conn.execute("SELECT name FROM ledger_entities ORDER BY eid").fetchall()
    conn.close()
    assert names == [("Orders",), ("Returns",)]  # the name as first recorded stays


def test_a_schema_2_file_with_keys_under_two_spellings_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    _v2_file(path, {"Orders": ["order-0"], "orders": ["order-1"], "other": ["order-2"]})
    with pytest.raises(LedgerError) as info:
        Ledger(f"sqlite://{path}")
    text = str(info.value)
    assert "'Orders'" in text and "'orders'" in text and "differ only by case" in text
    assert str(path) in text
    # nothing changed: the sendonce that wrote it can still use it
    assert _version(path) == "2"
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM ledger_entities").fetchone() == (3,)
    assert conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name LIKE '%nocase%'"
    ).fetchone() == (0,)
    conn.close()
    # and refusing it again says the same, whatever process asks
    with pytest.raises(LedgerError, match="differ only by case"):
        Ledger(f"sqlite://{path}")


def test_a_spelling_that_holds_no_keys_is_dropped_by_the_upgrade(tmp_path: Path) -> None:
    """Its keys were pruned (or never written): only a name, so nothing is merged."""
    path = tmp_path / "ledger.db"
    _v2_file(path, {"orders": [], "Orders": ["order-0"], "ORDERS": []})
    with Ledger(f"sqlite://{path}") as ledger:
        assert list(ledger.store.lookup("orders", KEYS)) == KEYS[:1]
        ledger.store.record_intents(
            "oRdErS", KEYS[1:2], [b"\x01d"], first_attempt=T0, owner="later"
        )
        assert sorted(ledger.store.lookup("Orders", KEYS)) == KEYS[:2]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM ledger_entities").fetchall() == [("Orders",)]
    conn.close()


# -- PostgreSQL: schema 1 databases ------------------------------------------------------

# Schema 1 as sendonce created it (the tables are unchanged; only the names' case is).
_PG_V1 = """
CREATE TABLE sendonce_ledger (
    entity text NOT NULL, message_id text NOT NULL, partition_key text NOT NULL,
    digest bytea NOT NULL, first_attempt timestamptz NOT NULL, owner text NOT NULL,
    confirmed_at timestamptz, outcome text,
    PRIMARY KEY (entity, message_id, partition_key)
);
CREATE INDEX sendonce_ledger_age ON sendonce_ledger (first_attempt);
CREATE TABLE sendonce_ledger_transfers (
    entity text NOT NULL, owner text NOT NULL, confirmed_at timestamptz NOT NULL,
    PRIMARY KEY (entity, owner)
);
CREATE INDEX sendonce_ledger_transfers_age ON sendonce_ledger_transfers (confirmed_at);
"""


@pytest.fixture
def pg_url(ledger_url: str) -> str:
    if not ledger_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    return ledger_url


def _pg_v1(url: str, rows: list[tuple[str, str, str | None]], *, version_row: bool) -> None:
    """(entity, message id, transfer owner confirmed as a whole or None) rows, schema 1."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_PG_V1)
        if version_row:
            conn.execute(
                "CREATE TABLE sendonce_ledger_meta (key text PRIMARY KEY, value text NOT NULL)"
            )
            conn.execute("INSERT INTO sendonce_ledger_meta VALUES ('schema_version', '1')")
        for entity, mid, owner in rows:
            conn.execute(
                "INSERT INTO sendonce_ledger VALUES (%s, %s, '', %s, %s, %s, NULL, NULL)",
                (entity, mid, body_digest(msg(int(mid.rsplit("-", 1)[1]))), T0, owner or "o"),
            )
            if owner:
                conn.execute(
                    "INSERT INTO sendonce_ledger_transfers VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (entity, owner, T0),
                )


def _pg_version(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT value FROM sendonce_ledger_meta").fetchone()
        return str(row[0])


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("version_row", [True, False], ids=["v1", "before-the-version-row"])
def test_a_schema_1_database_is_upgraded_and_its_keys_answer_to_any_spelling(
    pg_url: str, broker: LocalBackend, clock: Clock, version_row: bool
) -> None:
    _pg_v1(
        pg_url,
        [("Orders", "order-0", "t"), ("Orders", "order-1", "t"), ("Returns", "order-0", None)],
        version_row=version_row,
    )
    retry = RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)
    clock.now = T0 + 2 * WINDOW
    with Ledger(pg_url, clock=clock) as ledger:
        rows = ledger.store.lookup("ORDERS", KEYS)
        assert sorted(rows) == KEYS[:2]
        assert all(r.outcome == "sent" for r in rows.values())  # the transfer's row followed
        assert ledger.store.lookup("returns", KEYS)[KEYS[0]].confirmed_at is None
        with IdempotentSender(broker, EntityProfile("orders"), retry=retry, ledger=ledger) as s:
            report = s.send_many([msg(i) for i in range(3)])
    assert sorted(report.from_ledger) == ["order-0", "order-1"] and report.sent == 1
    assert _pg_version(pg_url) == "3"  # through 2 (names folded) to 3 (keys packed)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        names = conn.execute(
            f"SELECT DISTINCT {ENTITY_SQL} FROM sendonce_ledger AS l UNION "
            "SELECT entity FROM sendonce_ledger_transfers ORDER BY 1"
        ).fetchall()
    assert names == [("orders",), ("returns",)]


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_a_schema_1_database_with_two_spellings_is_refused_naming_both(pg_url: str) -> None:
    rows: list[tuple[str, str, str | None]] = [
        ("Orders", "order-0", "t"),
        ("orders", "order-1", None),
        ("other", "order-2", None),
    ]
    _pg_v1(pg_url, rows, version_row=True)
    with pytest.raises(ConfigurationError) as info:
        PostgresStore(pg_url)
    text = str(info.value)
    assert info.value.field == "ledger"
    assert "'Orders'" in text and "'orders'" in text and "differ only by case" in text
    assert _pg_version(pg_url) == "1"  # rolled back: the sendonce that wrote it still reads it
    with psycopg.connect(pg_url, autocommit=True) as conn:
        kept = conn.execute(
            "SELECT entity FROM sendonce_ledger ORDER BY 1"  # schema 1's table, untouched
        ).fetchall()
    assert kept == [("Orders",), ("orders",), ("other",)]
