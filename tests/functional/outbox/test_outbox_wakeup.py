"""An idle relay waits on LISTEN: a commit wakes it long before its poll, and the idle table
is queried once per poll interval, not in a tight loop."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from sendonce import EntityProfile, Message
from sendonce.backends import LocalBackend
from sendonce.outbox import Relay, enqueue, install

pytestmark = pytest.mark.postgres


def _transactions(conn: psycopg.Connection, database: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (database,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_idle_relay_waits_for_notify_and_polls_slowly(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    database = outbox_url.rsplit("/", 1)[1]
    relay = Relay(outbox_url, broker, [EntityProfile("orders")], poll_interval=60)
    runner = threading.Thread(target=relay.run)
    runner.start()
    try:
        while relay.totals.rounds == 0 and runner.is_alive():  # started: its first claim
            time.sleep(0.05)
            with psycopg.connect(outbox_url) as conn:
                enqueue(conn, [Message("first", message_id="first")], entity="orders")
                conn.commit()
        # Woken by NOTIFY: each of these is published although the poll is a minute away.
        for n in range(3):
            with psycopg.connect(outbox_url) as conn:
                enqueue(conn, [Message(f"order {n}", message_id=f"order-{n}")], entity="orders")
                conn.commit()
            while f"order-{n}" not in broker.message_ids("orders"):
                assert runner.is_alive()
                time.sleep(0.02)
        # Idle: the outbox database sees (nearly) no transactions from the relay.
        with psycopg.connect(
            "/".join([*outbox_url.split("/")[:-1], "postgres"]), autocommit=True
        ) as observer:
            time.sleep(1.5)  # let the statistics of the last publishing settle
            before = _transactions(observer, database)
            time.sleep(3)
            idle = _transactions(observer, database) - before
    finally:
        relay.stop()
        runner.join(timeout=30)
        relay.close()
    assert not runner.is_alive()
    assert idle <= 3, f"{idle} transactions in 3 s of idling"
    assert broker.message_ids("orders")[-3:] == ["order-0", "order-1", "order-2"]
