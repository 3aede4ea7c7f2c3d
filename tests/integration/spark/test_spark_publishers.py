"""partition_publisher and batch_publisher: foreachPartition and foreachBatch, exactly once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import drain, expected, ids_on, orders

from sendonce import EntityProfile, MessageSpec
from sendonce.spark import (
    PartitionResult,
    batch_publisher,
    partition_publisher,
    publish,
)

pytestmark = pytest.mark.spark

ENTITY = EntityProfile("orders")


def test_partition_publisher_survives_first_attempts_failing_after_publishing(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    df = orders(spark, 240, 3)

    def kill(result: PartitionResult) -> None:
        if result.attempt == 0:
            raise RuntimeError("injected: dies after publishing")

    df.foreachPartition(
        partition_publisher(url, ENTITY, MessageSpec("order-{order_id}"), after_partition=kill)
    )
    ids = ids_on(path)
    assert sorted(ids) == expected(240) and len(ids) == 240


def test_a_failed_row_fails_the_task_so_spark_retries_it(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    df = orders(spark, 30, 2).selectExpr(
        "order_id", "case when order_id = 4 then null else customer end as customer"
    )
    with pytest.raises(Exception, match="were not sent"):
        df.foreachPartition(partition_publisher(url, ENTITY, MessageSpec("{customer}.{order_id}")))
    assert "customer-4.4" not in ids_on(path)


def test_both_row_paths_build_the_same_ids_and_bodies(spark: Any, tmp_path: Path) -> None:
    """Arrow (publish) and Row (foreachPartition) read timestamps, decimals and structs alike."""
    df = orders(spark, 50, 2).selectExpr(
        "*",
        "named_struct('at', placed_at, 'tags', array('a', customer)) as detail",
        "map('k', placed_at) as extra",
    )
    spec = MessageSpec("{customer}/{placed_at}/{amount}", body=None)
    urls = {name: f"local://{tmp_path / name}.db" for name in ("arrow", "rows", "dynamic")}
    publish(df, urls["arrow"], ENTITY, spec)
    df.foreachPartition(partition_publisher(urls["rows"], ENTITY, spec, schema=df.schema))
    df.foreachPartition(partition_publisher(urls["dynamic"], ENTITY, spec))

    arrow = drain(tmp_path / "arrow.db")
    assert len(arrow) == 50
    assert "customer-1/2024-03-10T12:01:00Z/1.25" in arrow
    body = json.loads(arrow["customer-1/2024-03-10T12:01:00Z/1.25"])
    assert body["placed_at"] == "2024-03-10T12:01:00+00:00"
    assert body["detail"] == {"at": "2024-03-10T12:01:00+00:00", "tags": ["a", "customer-1"]}
    assert body["extra"] == {"k": "2024-03-10T12:01:00+00:00"}
    assert drain(tmp_path / "rows.db") == arrow
    assert drain(tmp_path / "dynamic.db") == arrow


def test_streaming_query_delivers_each_row_once_across_a_restart(
    spark: Any, broker: tuple[str, Path], tmp_path: Path
) -> None:
    """The first run publishes batch 0 then crashes before committing it; the restart replays."""
    url, path = broker
    source = tmp_path / "in"
    source.mkdir()
    for part in range(3):
        lines = [json.dumps({"order_id": part * 100 + i, "item": f"item-{i}"}) for i in range(40)]
        (source / f"part-{part}.json").write_text("\n".join(lines) + "\n")
    checkpoint = str(tmp_path / "checkpoint")
    publisher = batch_publisher(url, ENTITY, MessageSpec("order-{order_id}", body="item"))
    crash = {"armed": True}

    def publish_then_maybe_crash(batch_df: Any, batch_id: int) -> None:
        publisher(batch_df, batch_id)
        if crash["armed"]:
            raise RuntimeError("injected: the driver dies before the batch is committed")

    def run(fn: Any) -> Any:
        stream = (
            spark.readStream.schema("order_id long, item string")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        query = (
            stream.writeStream.foreachBatch(fn)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        return query

    first = run(publish_then_maybe_crash)
    with pytest.raises(Exception, match="injected"):
        first.awaitTermination(120)
    assert len(ids_on(path)) == 40  # batch 0 landed, but was never committed

    crash["armed"] = False
    second = run(publish_then_maybe_crash)
    second.awaitTermination(120)
    assert second.exception() is None
    ids = ids_on(path)
    assert sorted(ids) == sorted(f"order-{p * 100 + i}" for p in range(3) for i in range(40))
    assert len(ids) == 120


def test_row_paths_agree_when_the_session_time_zone_is_not_the_workers(
    spark: Any, tmp_path: Path
) -> None:
    """Rows carry naive timestamps in the worker's local zone, not the session zone."""
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = orders(spark, 20, 2)  # the literal is read as 12:00 New York time (EDT)
        spec = MessageSpec("{order_id}@{placed_at}", body=None)
        arrow, rows = f"local://{tmp_path / 'arrow.db'}", f"local://{tmp_path / 'rows.db'}"
        publish(df, arrow, ENTITY, spec)
        df.foreachPartition(partition_publisher(rows, ENTITY, spec, schema=df.schema))
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    published = drain(tmp_path / "arrow.db")
    assert "1@2024-03-10T16:01:00Z" in published
    assert drain(tmp_path / "rows.db") == published
