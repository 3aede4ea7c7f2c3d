"""Spark publishing with a PostgreSQL send ledger: re-runs beyond the window send nothing twice.

Real local Spark (local[2,4]), a real broker file, a real throwaway PostgreSQL cluster.
Executors open the ledger from its url.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import ids_on, orders

from sendonce import EntityProfile, IdempotentSender, Ledger, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.ledger import Key, body_digest
from sendonce.spark import PartitionResult, publish

SPEC = MessageSpec("order-{order_id}", body="customer")
WINDOW = timedelta(minutes=10)

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


@pytest.fixture
def pg_url(postgres_database: Any) -> str:
    """A fresh database on the run's cluster (tests/conftest.py)."""
    url: str = postgres_database("spark_ledger")
    return url


def test_a_publish_rerun_two_windows_later_sends_only_what_is_missing(
    spark: Any, broker: tuple[str, Path], pg_url: str
) -> None:
    url, path = broker
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)
    yesterday = datetime.now(UTC) - 2 * WINDOW
    rows = orders(spark, 300, 4)
    first_half = [SPEC.to_message(r.asDict()) for r in rows.collect() if r.order_id < 150]
    crashed = SPEC.to_message({"order_id": 150, "customer": "customer-3"})
    # "Yesterday's" run: half the rows confirmed, one sent-but-unconfirmed, then it died.
    with (
        LocalBackend(str(path), clock=lambda: yesterday) as old_broker,
        Ledger(pg_url, clock=lambda: yesterday) as ledger,
    ):
        with IdempotentSender(old_broker, profile, ledger=ledger) as sender:
            assert sender.send_many(first_half).sent == 150
        key = Key(crashed.message_id, "")
        ledger.store.record_intents(
            "orders", [key], [body_digest(crashed)], first_attempt=yesterday, owner="dead"
        )
    report = publish(rows, url, profile, SPEC, ledger=pg_url)
    assert (report.sent, report.duplicates, report.failed) == (149, 150, 1)
    assert [f[0] for p in report.partitions for f in p.failures] == ["order-150"]
    stored = ids_on(path)
    assert len(stored) == len(set(stored)) == 299  # nothing twice; the in-doubt one reported
    assert "order-150" not in stored


def test_a_late_reexecution_is_let_through_and_sends_nothing_twice(
    spark: Any, broker: tuple[str, Path], pg_url: str
) -> None:
    """Executors see a clock an hour ahead: without a ledger the guard refuses the retries."""
    url, path = broker
    driver = os.getpid()

    def skewed() -> float:
        return time.time() + (3600.0 if os.getpid() != driver else 0.0)

    def kill(result: PartitionResult) -> None:  # a closure: workers cannot import this module
        if result.attempt == 0:
            raise RuntimeError("injected: the first attempt dies after publishing")

    profile = EntityProfile("late", duplicate_detection_window=WINDOW)
    report = publish(
        orders(spark, 60, 2), url, profile, SPEC, after_partition=kill, clock=skewed, ledger=pg_url
    )
    assert (report.sent, report.duplicates, report.failed) == (0, 60, 0)
    stored = ids_on(path, "late")
    assert sorted(stored) == sorted(f"order-{i}" for i in range(60))
