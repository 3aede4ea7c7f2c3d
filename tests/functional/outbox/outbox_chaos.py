"""The outbox demo's processes, and its proof: web-style producers and relays killed at random.

``python outbox_chaos.py producer OUTBOX INCARNATION SEED`` runs four threads, each doing
web-style transactions forever: insert an order, enqueue its message (partition key: the
customer), bump the customer's version (a witness of commit order per customer, taken
*after* the enqueue so that a relay ordering by row id would be caught), and commit, or roll
back one time in six.

``python outbox_chaos.py relay OUTBOX BROKER SEED`` runs a relay until SIGTERM; on a
``local:`` broker every send goes through a ``FaultyBackend`` that refuses or loses the
ack of some calls (a cut connection before or after the broker stored the messages).

``check(outbox, broker_ids)`` is the proof: the broker holds every committed order's message
exactly once, none of a rolled-back order, and per customer in the versions' order.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg

from sendonce import EntityProfile, Message, RetryPolicy
from sendonce.backends import connect
from sendonce.outbox import Relay, enqueue, install
from sendonce.testing import Fault, FaultyBackend

CUSTOMERS = 12
ORDERS = EntityProfile("orders")
THREADS = 4


def prepare(url: str) -> None:
    """The business tables and the outbox."""
    install(url)
    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, customer int NOT NULL, version int)"
        )
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, version int NOT NULL)")
        conn.execute(
            "INSERT INTO customers SELECT g, 0 FROM generate_series(0, %s) AS g", (CUSTOMERS - 1,)
        )
        conn.commit()


def _producer_thread(url: str, incarnation: int, thread: int, seed: int) -> None:
    rng = random.Random(seed * 1000 + thread)
    with psycopg.connect(url) as conn:
        for n in range(1_000_000):
            order_id = incarnation * 10_000_000 + thread * 1_000_000 + n
            customer = rng.randrange(CUSTOMERS)
            conn.execute("INSERT INTO orders (id, customer) VALUES (%s, %s)", (order_id, customer))
            message = Message(
                f'{{"order": {order_id}, "customer": {customer}}}',
                message_id=f"order-{order_id}",
                partition_key=f"c{customer}",
            )
            enqueue(conn, [message], entity="orders")
            row = conn.execute(
                "UPDATE customers SET version = version + 1 WHERE id = %s RETURNING version",
                (customer,),
            ).fetchone()
            assert row is not None
            conn.execute("UPDATE orders SET version = %s WHERE id = %s", (row[0], order_id))
            if rng.random() < 1 / 6:
                conn.rollback()
            else:
                conn.commit()


def producer(url: str, incarnation: int, seed: int) -> None:
    threads = [
        threading.Thread(target=_producer_thread, args=(url, incarnation, t, seed), daemon=True)
        for t in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def relay(url: str, broker: str, seed: int) -> None:
    rng = random.Random(seed)
    backend: Any = connect(broker)
    if broker.startswith("local:"):

        def cut(index: int, entity: str, batch: Sequence[Message]) -> Fault:
            draw = rng.random()
            if draw < 0.08:
                return Fault.BEFORE_COMMIT
            if draw < 0.16:
                return Fault.AFTER_COMMIT
            return Fault.NONE

        backend = FaultyBackend(backend, cut)
    retry = RetryPolicy(max_attempts=4, initial_backoff=0.05, max_backoff=0.3, attempt_timeout=5)
    worker = Relay(
        url,
        backend,
        [ORDERS],
        retry=retry,
        lease=timedelta(seconds=2),
        poll_interval=0.5,
        batch_size=40,
        per_key=8,
        backoff_max=1.0,
    )
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    with worker:
        worker.run()
    backend.close()


def check(url: str, broker_ids: list[str]) -> dict[str, int]:
    """The proof; returns the counts it checked."""
    with psycopg.connect(url) as conn:
        committed = {
            f"order-{oid}": (customer, version)
            for oid, customer, version in conn.execute(
                "SELECT id, customer, version FROM orders"
            ).fetchall()
        }
        pending = conn.execute(
            "SELECT count(*) FROM sendonce_outbox WHERE published_at IS NULL"
        ).fetchone()
        dead = conn.execute("SELECT count(*) FROM sendonce_outbox_dead").fetchone()
    assert pending == (0,) and dead == (0,), (pending, dead)
    assert len(broker_ids) == len(set(broker_ids)), "a message was published twice"
    assert set(broker_ids) == set(committed), (
        f"missing {sorted(set(committed) - set(broker_ids))[:5]}, "
        f"not committed {sorted(set(broker_ids) - set(committed))[:5]}"
    )
    last: dict[int, int] = {}
    for mid in broker_ids:
        customer, version = committed[mid]
        assert version > last.get(customer, 0), f"{mid}: customer {customer} out of order"
        last[customer] = version
    return {"orders": len(committed), "customers": len(last)}


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    if role == "producer":
        producer(url, int(sys.argv[3]), int(sys.argv[4]))
    elif role == "relay":
        relay(url, sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown role {role!r}")
