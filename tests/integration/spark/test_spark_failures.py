"""publish() when the Spark job fails: a sendonce error carrying what was confirmed before."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, ids_on, orders

from sendonce import EntityProfile, MessageSpec, SendError
from sendonce.spark import PartitionResult, PublishFailedError, publish

pytestmark = pytest.mark.spark

ENTITY = EntityProfile("orders")
SPEC = MessageSpec("order-{order_id}", body=None)


@pytest.fixture()
def small_arrow_batches(spark: Any) -> Iterator[None]:
    """Arrow batches of 50 rows, so a partition is confirmed in several steps."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "50")
    yield
    spark.conf.set(key, before)


def test_a_partition_that_always_fails_raises_publish_failed_with_confirmed_counts(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker

    def partition_1_always_dies(result: PartitionResult) -> None:
        if result.partition == 1:
            raise RuntimeError(f"injected: attempt {result.attempt} of partition 1 dies")

    with pytest.raises(PublishFailedError) as caught:
        publish(orders(spark), url, ENTITY, SPEC, after_partition=partition_1_always_dies)

    error = caught.value
    assert isinstance(error, SendError)
    assert error.__cause__ is not None  # Spark's own error, chained
    assert "RuntimeError: injected: attempt 3 of partition 1 dies" in str(error)
    assert "again is safe" in str(error)
    report = error.report
    assert report is not None and not report.complete
    by_partition = {p.partition: p for p in report.partitions}
    # Every attempt of partition 1 published its 100 rows before dying: 100 on the broker,
    # sent once by the first attempt, found as duplicates by the three retries.
    assert (by_partition[1].rows, by_partition[1].sent, by_partition[1].duplicates) == (100, 100, 0)
    assert by_partition[1].attempt == 3
    ids = ids_on(path)
    assert len(ids) == len(set(ids)) == report.delivered  # the report matches the broker

    copy = pickle.loads(pickle.dumps(error))  # crosses processes with its report
    assert copy.report == report and str(copy) == str(error)

    rerun = publish(orders(spark), url, ENTITY, SPEC)
    assert sorted(ids_on(path)) == expected(300)  # the re-run completed it, nothing twice
    assert (rerun.duplicates, rerun.sent) == (report.delivered, 300 - report.delivered)


def test_a_python_worker_killed_mid_partition_reports_the_batches_confirmed_before(
    spark: Any, broker: tuple[str, Path], small_arrow_batches: None
) -> None:
    url, path = broker

    def body(row: Any) -> str:
        if row["order_id"] == 175:  # partition 1 holds 100..199: its 2nd batch of 50
            os._exit(17)  # the Python worker dies without a word, on every attempt
        return f"order {row['order_id']}"

    spec = MessageSpec("order-{order_id}", body=body)
    with pytest.raises(PublishFailedError) as caught:
        publish(orders(spark), url, ENTITY, spec, check_conflicts=False)

    report = caught.value.report
    assert report is not None and not report.complete
    by_partition = {p.partition: p for p in report.partitions}
    # The first batch (100..149) was confirmed; the second died while being built.
    assert (by_partition[1].sent, by_partition[1].duplicates) == (50, 0)
    assert by_partition[1].rows >= 50
    ids = ids_on(path)
    assert len(ids) == len(set(ids)) == report.delivered
    assert {f"order-{i}" for i in range(100, 150)} <= set(ids)
    assert not {f"order-{i}" for i in range(150, 200)} & set(ids)
