"""The PostgreSQL store under contention, against a real throwaway PostgreSQL cluster.

Overlapping writers in different orders never deadlock; opening a store (every Spark
task does) never waits behind another producer's open write transaction; connect
options travel in the url.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from sendonce import ConfigurationError, LedgerError
from sendonce.ledger import Confirmation, Key
from sendonce.ledger._pgkeys import packed_key
from sendonce.ledger._postgres import _SCHEMA_2, PostgresStore

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(ledger_url: str) -> str:
    if not ledger_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    return ledger_url


@pytest.fixture
def deadlocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every deadlock the server reports to any connection of this process (a spy: the
    statements still run on the real server)."""
    seen: list[str] = []
    execute = psycopg.Connection.execute

    def spying(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return execute(self, *args, **kwargs)
        except psycopg.errors.DeadlockDetected as exc:
            seen.append(str(exc))
            raise

    monkeypatch.setattr(psycopg.Connection, "execute", spying)
    yield seen


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_overlapping_writers_in_opposite_orders_never_deadlock(
    pg_url: str, deadlocks: list[str]
) -> None:
    """Two producers write the same 2,000 keys at once, one forwards, one backwards."""
    stores = [PostgresStore(pg_url), PostgresStore(pg_url)]
    errors: list[BaseException] = []
    try:
        for round_ in range(8):
            keys = [Key(f"order-{round_}-{i:05d}", "") for i in range(2000)]
            orders = [keys, keys[::-1]]
            start = threading.Barrier(2)

            def write(
                n: int, keys_in_order: list[Key], owner: str, start: threading.Barrier
            ) -> None:
                try:
                    start.wait()
                    stores[n].record_intents(
                        "orders",
                        keys_in_order,
                        [b"\x01digest"] * len(keys_in_order),
                        first_attempt=datetime.now(UTC),
                        owner=owner,
                    )
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [
                threading.Thread(target=write, args=(n, orders[n], f"w{n}-{round_}", start))
                for n in range(2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            if deadlocks:
                break
            rows = stores[0].lookup("orders", keys)
            assert len(rows) == 2000  # every key written once, by one of the two
    finally:
        for store in stores:
            store.close()
    assert deadlocks == []


def _blocked(admin: Any) -> int:
    row = admin.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
    return int(row[0])


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_opening_never_waits_behind_an_open_write_transaction(pg_url: str) -> None:
    """A producer mid-transaction on the ledger table; a new store (a Spark task) opens."""
    PostgresStore(pg_url).close()  # the schema exists: later opens only check its version
    opened: list[object] = []
    with (
        psycopg.connect(pg_url) as writer,
        psycopg.connect(pg_url, autocommit=True) as admin,
    ):
        writer.execute(
            "INSERT INTO sendonce_ledger (k, digest, first_attempt, owner) "
            "VALUES (%s, '\\x01', now(), 'w')",
            (packed_key("orders", Key("order-1")),),
        )  # left open: its transaction holds the table's ROW EXCLUSIVE lock

        def open_store() -> None:
            opened.append(PostgresStore(pg_url))

        opener = threading.Thread(target=open_store)
        opener.start()
        waited = False
        while opener.is_alive():
            opener.join(0.05)
            if opener.is_alive() and _blocked(admin):
                waited = True
                break
        writer.rollback()  # lets a waiting open through either way
        opener.join()
    for store in opened:
        store.close()  # type: ignore[attr-defined]
    assert not waited, "opening the store waited behind another transaction's lock"
    assert len(opened) == 1


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_connect_options_are_read_from_the_url(pg_url: str) -> None:
    url = f"{pg_url}?connect_timeout=4&attempts=2"
    store = PostgresStore(url)
    try:
        assert (store.connect_timeout, store.attempts, store.url) == (4.0, 2, url)
        assert store.lookup("orders", [Key("order-1", "")]) == {}  # libpq took the rest
    finally:
        store.close()
    assert PostgresStore(url, attempts=5).attempts == 5  # an argument wins over the url


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("attempts=0", "attempts"),
        ("attempts=two", "attempts"),
        ("attempts=1.5", "attempts"),
        ("connect_timeout=0", "connect_timeout"),
        ("connect_timeout=soon", "connect_timeout"),
    ],
)
def test_bad_connect_options_in_the_url_name_the_option(query: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        PostgresStore(f"postgresql://me:hunter2@127.0.0.1:1/db?{query}")
    assert info.value.field == "ledger" and named in str(info.value)
    assert "hunter2" not in str(info.value)


def test_attempts_from_the_url_bound_the_tries_on_an_unreachable_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(LedgerError) as info:
        PostgresStore("postgresql://me:hunter2@127.0.0.1:1/db?attempts=2&connect_timeout=1")
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 1 and "attempt 2 of 2" in retries[0].getMessage()
    assert "hunter2" not in str(info.value) + retries[0].getMessage()


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_a_database_written_before_the_version_row_is_adopted(pg_url: str) -> None:
    """The tables of an earlier sendonce, no version row: the first open writes it, keys kept."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(_SCHEMA_2)  # the first format's tables, as an earlier sendonce left them
        conn.execute("DROP TABLE sendonce_ledger_meta")
        conn.execute(
            "INSERT INTO sendonce_ledger VALUES ('orders', 'order-1', '', '\\x0164', now(), 'o')"
        )
    adopted = PostgresStore(pg_url)
    try:
        assert list(adopted.lookup("orders", [Key("order-1", "")])) == [Key("order-1", "")]
    finally:
        adopted.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT value FROM sendonce_ledger_meta").fetchone()
        assert row == ("3",)
        conn.execute("UPDATE sendonce_ledger_meta SET value = '99'")
    with pytest.raises(ConfigurationError) as info:
        PostgresStore(pg_url)
    assert info.value.field == "ledger" and "'99'" in str(info.value)


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_pruning_skips_a_key_a_producer_holds_and_keeps_its_confirmation(pg_url: str) -> None:
    """A producer mid-transaction on an expired key: pruning neither waits for it nor strips
    that key's transfer confirmation (it would come back unconfirmed: in doubt)."""
    old = datetime(2020, 1, 1, tzinfo=UTC)
    keys = [Key(f"order-{i}", "") for i in range(3)]
    store = PostgresStore(pg_url)
    try:
        store.record_intents("orders", keys, [b"\x01d"] * 3, first_attempt=old, owner="t")
        store.confirm("orders", Confirmation(("t",), {}), old)
        with (
            psycopg.connect(pg_url) as writer,
            psycopg.connect(pg_url, autocommit=True) as admin,
        ):
            writer.execute(  # a re-run's intent write, not committed yet, holds order-1
                "UPDATE sendonce_ledger SET owner = owner WHERE k = %s",
                (packed_key("orders", Key("order-1")),),
            )
            done: list[int] = []
            pruner = threading.Thread(
                target=lambda: done.append(store.prune(datetime.now(UTC), 100))
            )
            pruner.start()
            waited = False
            while pruner.is_alive():
                pruner.join(0.05)
                if pruner.is_alive() and _blocked(admin):
                    waited = True
                    break
            writer.rollback()
            pruner.join()
        assert not waited, "pruning waited behind a producer's transaction"
        assert done == [2]
        [row] = store.lookup("orders", keys).values()
        assert row.key == Key("order-1", "") and row.outcome == "sent"
        assert store.prune(datetime.now(UTC), 100) == 1
    finally:
        store.close()
