"""publish(): exactly once under failed task attempts, reruns, and driver-side refusals."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, ids_on, orders

from sendonce import EntityProfile, MessageIdError, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark import (
    ConflictingRowsError,
    PartitionResult,
    PublishFailedError,
    SchemaError,
    publish,
)

pytestmark = pytest.mark.spark

ENTITY = EntityProfile("orders")
SPEC = MessageSpec("order-{order_id}", body=None)


def test_each_first_attempt_fails_after_publishing_and_each_row_lands_once(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker

    def kill_first_attempt(result: PartitionResult) -> None:
        if result.attempt == 0:
            raise RuntimeError(f"injected: attempt 0 of partition {result.partition} dies")

    report = publish(orders(spark), url, ENTITY, SPEC, after_partition=kill_first_attempt)

    ids = ids_on(path)
    assert sorted(ids) == expected(300)  # each order present, none twice
    assert len(ids) == len(set(ids))
    assert report.rows == 300
    assert report.delivered == 300
    assert report.failed == 0
    # The retried attempts found every row already sent by their dead predecessors.
    assert report.attempts == {0: 2, 1: 2, 2: 2}
    assert report.duplicates == 300 and report.sent == 0


def test_publishing_twice_sends_only_duplicates_the_second_time(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    df = orders(spark, 200, 2)
    first = publish(df, url, ENTITY, SPEC)
    assert (first.rows, first.sent, first.duplicates, first.failed) == (200, 200, 0, 0)
    before = ids_on(path)

    second = publish(df, url, ENTITY, SPEC)

    assert (second.rows, second.sent, second.duplicates, second.failed) == (200, 0, 200, 0)
    assert ids_on(path) == before
    assert sorted(before) == expected(200)
    second.raise_for_failures()  # nothing failed: no exception


def test_conflicting_rows_are_refused_on_the_driver_with_nothing_sent(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    df = orders(spark, 50, 2).unionByName(
        spark.createDataFrame(
            [(7, "someone-else", Decimal("1.00"))],
            "order_id long, customer string, amount decimal(10,2)",
        ).selectExpr("*", "timestamp'2024-03-10 12:00:07' as placed_at")
    )
    with pytest.raises(ConflictingRowsError) as caught:
        publish(df, url, ENTITY, SPEC)
    assert caught.value.message_ids == ["order-7"]
    assert "order-7" in str(caught.value)
    assert ids_on(path) == []


def test_identical_rows_under_one_id_are_a_plain_duplicate(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    df = orders(spark, 40, 2)
    report = publish(df.unionByName(df.where("order_id < 5")), url, ENTITY, SPEC)
    assert sorted(ids_on(path)) == expected(40)
    assert report.rows == 45 and report.delivered == 45 and report.duplicates >= 5


def test_a_missing_column_is_refused_on_the_driver_naming_it(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    spec = MessageSpec("order-{order_id}/{line_no}", body="customer")
    with pytest.raises(SchemaError) as caught:
        publish(orders(spark, 10), url, ENTITY, spec)
    assert caught.value.field == "line_no"
    assert "'line_no'" in str(caught.value) and "order_id" in str(caught.value)
    assert not path.exists()


@pytest.mark.parametrize(
    ("expr", "type_name"),
    [
        ("cast(order_id as double)", "double"),
        ("order_id % 2 = 0", "boolean"),
        ("cast(placed_at as timestamp_ntz)", "timestamp_ntz"),
    ],
)
def test_column_types_that_cannot_build_ids_are_refused_on_the_driver(
    spark: Any, broker: tuple[str, Path], expr: str, type_name: str
) -> None:
    url, path = broker
    df = orders(spark, 10).selectExpr("*", f"{expr} as key")
    with pytest.raises(SchemaError) as caught:
        publish(df, url, ENTITY, MessageSpec("o-{key}"))
    assert caught.value.field == "key" and type_name in str(caught.value)
    assert not path.exists()


def test_a_body_column_that_is_not_text_is_refused(spark: Any, broker: tuple[str, Path]) -> None:
    url, _ = broker
    with pytest.raises(SchemaError, match="'amount'"):
        publish(orders(spark, 10), url, ENTITY, MessageSpec("o-{order_id}", body="amount"))


def test_a_null_id_column_is_refused_on_the_driver(spark: Any, broker: tuple[str, Path]) -> None:
    url, path = broker
    df = orders(spark, 20).selectExpr(
        "case when order_id = 3 then null else customer end as customer", "order_id", "amount"
    )
    with pytest.raises(MessageIdError) as caught:
        publish(df, url, ENTITY, MessageSpec("{customer}.{order_id}"))
    assert caught.value.field == "customer"
    assert ids_on(path) == []


def test_report_counts_and_partitions_with_the_entity_given_by_name(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    backend = LocalBackend(str(path))
    backend.create_entity(ENTITY)
    backend.close()
    report = publish(
        orders(spark, 120, 4), url, "orders", MessageSpec("o-{order_id}", body="customer")
    )
    assert [p.partition for p in report.partitions] == [0, 1, 2, 3]
    assert sum(p.rows for p in report.partitions) == 120 == report.sent
    assert report.failures == []
    assert "rows=120" in repr(report)
    backend = LocalBackend(str(path))
    try:
        received = backend.receive("orders", max_messages=5)
        assert {m.body for m in received} <= {f"customer-{i}".encode() for i in range(7)} | {
            f"customer-{i}" for i in range(7)
        }
    finally:
        backend.close()


def test_a_callable_body_is_checked_for_conflicts_on_the_executors(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    df = orders(spark, 30, 2)
    clash = MessageSpec("c-{customer}", body=lambda r: f"order {r['order_id']}")
    with pytest.raises(ConflictingRowsError) as caught:
        publish(df, url, ENTITY, clash)
    assert all(i.startswith("c-customer-") for i in caught.value.message_ids)
    assert ids_on(path) == []
    fine = MessageSpec("c-{customer}", body=lambda r: f"customer {r['customer']}")
    report = publish(df, url, ENTITY, fine)
    assert report.delivered == 30 and sorted(ids_on(path)) == [f"c-customer-{i}" for i in range(7)]


def test_rows_that_fail_in_a_task_are_counted_and_named_not_retried(
    spark: Any, broker: tuple[str, Path]
) -> None:
    """An over-long id is only found on the executor: reported, the other rows are sent."""
    url, path = broker
    df = orders(spark, 20, 2).selectExpr(
        "order_id", "case when order_id = 5 then repeat('x', 200) else customer end as customer"
    )
    report = publish(df, url, ENTITY, MessageSpec("{order_id}/{customer}", body="customer"))
    assert (report.rows, report.sent, report.failed) == (20, 19, 1)
    assert report.attempts == {0: 1, 1: 1}  # a content error does not make Spark retry
    [failure] = report.failures
    assert failure.error == "MessageIdError" and "128" in failure.detail
    with pytest.raises(PublishFailedError, match="1 of 20 row"):
        report.raise_for_failures()
    assert len(ids_on(path)) == 19


def test_an_empty_dataframe_publishes_nothing(spark: Any, broker: tuple[str, Path]) -> None:
    url, path = broker
    report = publish(orders(spark, 0, 2), url, ENTITY, SPEC)
    assert (report.rows, report.sent, report.failed) == (0, 0, 0)
    assert ids_on(path) == []
