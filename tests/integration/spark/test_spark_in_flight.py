"""Spark -> Service Bus with several transfers in flight per task: exactly once, key order kept.

The url carries ``MaxInFlight=4`` (a task receives only the url), the entity is
partitioned with duplicate detection (one message per transfer), and faults strike
single transfers while others are in flight. Each key's rows sit in one Spark
partition, sorted, so the broker must hold each key's messages in that order.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sendonce import EntityProfile, MessageSpec, RetryPolicy
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator, Fault, FaultAction
from sendonce.spark import publish

pytestmark = [pytest.mark.spark, pytest.mark.emulator, pytest.mark.timeout(240)]

KEYED = EntityProfile("keyed", partitioned=True, duplicate_detection_window=timedelta(minutes=5))
SPEC = MessageSpec("{customer}.{order_id}", body=None, partition_key="{customer}")
RETRY = RetryPolicy(
    max_attempts=8, initial_backoff=0.05, max_backoff=0.5, attempt_timeout=3.0, jitter=False
)


def test_publish_with_lanes_in_flight_keeps_each_key_in_order_exactly_once(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        store.create_entity(KEYED)
    rows = 240
    df = (
        spark.range(rows, numPartitions=3)
        .selectExpr("id as order_id", "concat('c', cast(id % 9 as string)) as customer")
        .repartition(3, "customer")
        .sortWithinPartitions("order_id")
    )
    with Emulator(path, poll_interval=0.02) as emulator:
        emulator.faults.add(
            *[Fault(FaultAction.NONE, entity="keyed")] * 20,
            Fault(FaultAction.DETACH_AFTER_COMMIT, entity="keyed"),
            *[Fault(FaultAction.NONE, entity="keyed")] * 20,
            Fault(FaultAction.WITHHOLD, entity="keyed"),
            *[Fault(FaultAction.NONE, entity="keyed")] * 20,
            Fault(FaultAction.DROP_AFTER_COMMIT, entity="keyed"),
        )
        url = emulator.connection_string.rstrip(";") + ";MaxInFlight=4"
        report = publish(
            df, url, KEYED, SPEC, retry=RETRY, check_conflicts=False, keep_connections=1.0
        )
        assert emulator.faults.pending == 0
        deadline = time.monotonic() + 15
        while emulator.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert emulator.open_connections == 0  # every lane of every task closed
    assert (report.rows, report.failed) == (rows, 0)
    assert report.sent + report.duplicates == rows
    with LocalBackend(path) as store:
        stored = store.message_ids("keyed")
    assert Counter(stored) == {f"c{i % 9}.{i}": 1 for i in range(rows)}  # each row once
    by_key: dict[str, list[int]] = {}
    for message_id in stored:
        key, order = message_id.split(".")
        by_key.setdefault(key, []).append(int(order))
    for key, orders in by_key.items():
        assert orders == sorted(orders), f"{key} stored out of order: {orders}"
