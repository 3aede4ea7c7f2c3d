"""enqueue on the caller's transaction, and a relay publishing it exactly once, in commit order.

Real PostgreSQL (a throwaway cluster), the real local broker, real concurrent transactions.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from sendonce import EntityProfile, Message, MessageSpec
from sendonce.backends import LocalBackend
from sendonce.outbox import Relay, enqueue, install, stats

pytestmark = pytest.mark.postgres

ORDERS = EntityProfile("orders", partitioned=True)


def messages(key: str, *numbers: int) -> list[Message]:
    return [Message(f"{key} {n}", message_id=f"{key}-{n}", partition_key=key) for n in numbers]


def per_key(ids: list[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for mid in ids:
        grouped[mid.rsplit("-", 1)[0]].append(mid)
    return dict(grouped)


def test_committed_rows_are_published_once_and_rolled_back_rows_never(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    spec = MessageSpec("order-{order_id}/created", partition_key="{customer}")
    with psycopg.connect(outbox_url) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text)")
        conn.commit()
        for order_id in range(20):
            order = {"order_id": order_id, "customer": f"c{order_id % 4}"}
            conn.execute("INSERT INTO orders VALUES (%s, %s)", (order_id, order["customer"]))
            assert enqueue(conn, [spec.to_message(order)], entity="orders") == 1
            if order_id % 5 == 4:
                conn.rollback()
            else:
                conn.commit()
        committed = [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id")]
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        totals = relay.drain()
        assert relay.drain().published == 0  # nothing left to publish again
    assert totals.published == len(committed) == 16
    ids = broker.message_ids("orders")
    assert sorted(ids) == sorted(f"order-{i}/created" for i in committed)
    assert len(set(ids)) == len(ids)
    (entity,) = stats(outbox_url)
    assert (entity.pending, entity.leased, entity.published, entity.dead) == (0, 0, 16, 0)


def test_sqlalchemy_session_and_connection_enqueue_in_their_transaction(
    outbox_url: str, broker: LocalBackend
) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    install(outbox_url)
    engine = sqlalchemy.create_engine(outbox_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(engine) as session:
            session.execute(sqlalchemy.text("CREATE TABLE orders (id int PRIMARY KEY)"))
            session.commit()
            session.execute(sqlalchemy.text("INSERT INTO orders VALUES (1)"))
            enqueue(session, messages("s", 1), entity="orders")
            session.commit()
            session.execute(sqlalchemy.text("INSERT INTO orders VALUES (2)"))
            enqueue(session, messages("s", 2), entity="orders")
            session.rollback()
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text("INSERT INTO orders VALUES (3)"))
            enqueue(connection, messages("s", 3), entity="orders")
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("INSERT INTO orders VALUES (4)"))
            enqueue(connection, messages("s", 4), entity="orders")
            connection.rollback()
    finally:
        engine.dispose()
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        relay.drain()
    assert broker.message_ids("orders") == ["s-1", "s-3"]


def _backend_pid(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]


def _waiting_on_lock(observer: psycopg.Connection, pid: int) -> bool:
    row = observer.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"


def test_order_per_key_is_commit_order_when_transactions_interleave(
    outbox_url: str, broker: LocalBackend
) -> None:
    """The hard case: two transactions on one key in flight at once.

    T1 begins first (its business row and another key's message get the lower ids), then
    T2 enqueues on key K and commits, then T1 enqueues on K and commits: K's messages are
    published T2's first (commit order), not in the order the transactions began or the
    order of their ids. And a third transaction T3 that enqueues on K while T4 holds K is
    made to wait, so it can never commit its K message ahead of T4's.
    """
    install(outbox_url)
    with (
        psycopg.connect(outbox_url) as t1,
        psycopg.connect(outbox_url) as t2,
        psycopg.connect(outbox_url, autocommit=True) as observer,
        Relay(outbox_url, broker, [ORDERS]) as relay,
    ):
        t1.execute("CREATE TABLE IF NOT EXISTS audit (note text)")
        t1.commit()
        t1.execute("INSERT INTO audit VALUES ('t1 began')")
        enqueue(t1, messages("other", 1), entity="orders")  # T1 holds the lower row id
        enqueue(t2, messages("K", 2), entity="orders")
        t2.commit()
        enqueue(t1, messages("K", 1), entity="orders")
        assert relay.drain().published == 1  # K-2 only: T1 has not committed
        t1.commit()
        relay.drain()
        ids = [r[0] for r in observer.execute("SELECT message_id FROM sendonce_outbox ORDER BY id")]
        assert ids.index("K-2") < ids.index("K-1")  # insert order says otherwise for 'other-1'
        assert per_key(broker.message_ids("orders"))["K"] == ["K-2", "K-1"]

        # T4 enqueues on K and stays open; T3's enqueue on K waits for it.
        enqueue(t1, messages("K", 4), entity="orders")
        waiter_done = threading.Event()

        def t3_enqueue() -> None:
            enqueue(t2, messages("K", 3), entity="orders")
            t2.commit()
            waiter_done.set()

        pid = _backend_pid(t2)
        t2.commit()
        thread = threading.Thread(target=t3_enqueue)
        thread.start()
        try:
            while not _waiting_on_lock(observer, pid):
                assert thread.is_alive() and not waiter_done.is_set()
            assert relay.drain().published == 0  # nothing of K is committed
            t1.commit()  # T4 commits first: its message precedes T3's
        finally:
            thread.join(timeout=30)
        assert waiter_done.is_set()
        relay.drain()
    assert per_key(broker.message_ids("orders"))["K"] == ["K-2", "K-1", "K-4", "K-3"]


def test_a_rolled_back_transaction_on_a_key_leaves_no_gap_and_no_message(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    with psycopg.connect(outbox_url) as t1, psycopg.connect(outbox_url) as t2:
        enqueue(t1, messages("K", 1), entity="orders")
        done = threading.Event()

        def second() -> None:
            enqueue(t2, messages("K", 2), entity="orders")
            t2.commit()
            done.set()

        pid = _backend_pid(t2)
        thread = threading.Thread(target=second)
        thread.start()
        with psycopg.connect(outbox_url, autocommit=True) as observer:
            while not _waiting_on_lock(observer, pid):
                assert not done.is_set()
        t1.rollback()
        thread.join(timeout=30)
        assert done.is_set()
        seqs = t1.execute("SELECT message_id, seq FROM sendonce_outbox").fetchall()
        t1.rollback()
    assert seqs == [("K-2", 1)]
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        relay.drain()
    assert broker.message_ids("orders") == ["K-2"]


def test_many_relays_on_one_table_publish_each_row_once_in_order_per_key(
    outbox_url: str, tmp_path: Path
) -> None:
    install(outbox_url)
    keys = [f"c{k}" for k in range(40)]
    with psycopg.connect(outbox_url) as conn:
        for n in range(25):
            batch = [m for key in keys for m in messages(key, n)]
            enqueue(conn, batch, entity="orders")
            conn.commit()
    totals = []
    errors: list[BaseException] = []

    def relay_thread() -> None:
        try:
            with (
                LocalBackend(tmp_path / "broker.db") as backend,
                Relay(outbox_url, backend, [ORDERS], batch_size=7, per_key=3) as relay,
            ):
                totals.append(relay.drain())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=relay_thread) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    with LocalBackend(tmp_path / "broker.db") as broker:
        with Relay(outbox_url, broker, [ORDERS]) as relay:  # whatever a drain ended early on
            relay.drain()
        ids = broker.message_ids("orders")
    assert len(ids) == len(set(ids)) == 40 * 25
    for key, got in per_key(ids).items():
        assert got == [f"{key}-{n}" for n in range(25)]
    assert sum(t.published for t in totals) <= 1000


def test_a_dead_relays_lease_is_taken_over_after_it_expires(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    with psycopg.connect(outbox_url) as conn:
        enqueue(conn, messages("K", 1, 2, 3), entity="orders")
        conn.commit()
    with Relay(outbox_url, broker, [ORDERS], lease=timedelta(seconds=1)) as dead:
        from datetime import UTC, datetime

        claimed = dead.store.claim(
            ["orders"],
            "a relay that died",
            limit=10,
            per_key=10,
            lease=timedelta(seconds=1),
            now=datetime.now(UTC),
        )
        assert [r.message.message_id for r in claimed] == ["K-1", "K-2", "K-3"]
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        assert relay.drain().published == 0  # leased by the dead relay
        while relay.drain().published < 3:
            pass  # until the lease expires (1 s)
    assert broker.message_ids("orders") == ["K-1", "K-2", "K-3"]


def test_claims_take_keys_in_turn_so_a_busy_key_cannot_starve_the_rest(outbox_url: str) -> None:
    """Each claim goes on from the key where the last one stopped: with leases that expire at
    once (a relay that keeps failing them), four claims of three keys reach all ten keys;
    a claim always starting from the first key would take k0-k2 every time."""
    from datetime import UTC, datetime

    from sendonce.outbox._store import RelayStore

    install(outbox_url)
    with psycopg.connect(outbox_url) as conn:
        for k in range(10):
            enqueue(conn, messages(f"k{k}", 1, 2), entity="orders")
        conn.commit()
    store = RelayStore(outbox_url)
    try:
        claims = [
            store.claim(
                ["orders"], "tester", limit=3, per_key=0, lease=timedelta(0), now=datetime.now(UTC)
            )
            for _ in range(4)
        ]
    finally:
        store.close()
    keys_per_claim = [sorted({row.okey for row in rows}) for rows in claims]
    assert all(len(keys) == 3 for keys in keys_per_claim), keys_per_claim
    assert all(row.head and row.seq == 1 for rows in claims for row in rows)  # heads only
    assert {key for keys in keys_per_claim for key in keys} == {f"k{k}" for k in range(10)}
