"""The exactly-once and report checks on a Spark Connect session, run as a subprocess.

A Connect session cannot start in a process that runs a classic one, so
test_connect.py runs this script in its own process and reads the JSON it prints.
Usage: python connect_checks.py WORKDIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from sendonce import EntityProfile, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark import (
    PartitionResult,
    PublishFailedError,
    batch_publisher,
    partition_publisher,
    publish,
)
from sendonce.spark._schema import master_of

HERE = Path(__file__).resolve().parent
ENTITY = EntityProfile("orders")
SPEC = MessageSpec("order-{order_id}", body=None)


def ids_on(path: Path) -> list[str]:
    backend = LocalBackend(str(path))
    try:
        return backend.message_ids("orders")
    finally:
        backend.close()


def main(workdir: Path) -> dict[str, Any]:
    os.environ.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.remote("local[2,4]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dlog4j2.configurationFile=file:{HERE / 'log4j2.properties'}",
        )
        .getOrCreate()
    )
    out: dict[str, Any] = {"is_connect": type(spark).__module__.startswith("pyspark.sql.connect")}
    out["master"] = master_of(spark)
    df = spark.range(200, numPartitions=2).selectExpr(
        "id as order_id",
        "concat('customer-', cast(id % 7 as string)) as customer",
        "timestamp'2024-03-10 12:00:00' + make_interval(0, 0, 0, 0, 0, id, 0) as placed_at",
    )
    expected = sorted(f"order-{i}" for i in range(200))

    def kill(result: PartitionResult) -> None:
        if result.attempt == 0:
            raise RuntimeError("injected: the first attempt dies after publishing")

    # publish, with every first attempt dying after it published
    path = workdir / "publish.db"
    report = publish(df, f"local://{path}", ENTITY, SPEC, after_partition=kill)
    ids = ids_on(path)
    out["publish_exactly_once"] = sorted(ids) == expected and len(ids) == 200
    out["publish_report"] = [report.rows, report.delivered, report.failed, report.attempts]
    again = publish(df, f"local://{path}", ENTITY, SPEC)
    out["second_run"] = [again.rows, again.sent, again.duplicates, again.failed]
    out["second_run_unchanged"] = ids_on(path) == ids

    # a job that fails: partition 1 dies on every attempt after publishing
    def always_kill_1(result: PartitionResult) -> None:
        if result.partition == 1:
            raise RuntimeError("injected: partition 1 always dies")

    path = workdir / "failed.db"
    try:
        publish(df, f"local://{path}", ENTITY, SPEC, after_partition=always_kill_1)
        out["failed_job"] = "no error"
    except PublishFailedError as failed:
        partial = failed.report
        out["failed_job"] = {
            "chained": failed.__cause__ is not None,
            "names_cause": "partition 1 always dies" in str(failed),
            "complete": None if partial is None else partial.complete,
            "delivered": None if partial is None else partial.delivered,
            "partition_1": None
            if partial is None
            else [p.sent + p.duplicates for p in partial.partitions if p.partition == 1],
            "on_broker": len(ids_on(path)),
        }

    # foreachPartition
    path = workdir / "partitions.db"
    df.foreachPartition(partition_publisher(f"local://{path}", ENTITY, SPEC, after_partition=kill))
    ids = ids_on(path)
    out["partition_publisher_exactly_once"] = sorted(ids) == expected and len(ids) == 200

    # foreachBatch
    path = workdir / "stream.db"
    source = workdir / "in"
    source.mkdir()
    for part in range(2):
        rows = [json.dumps({"order_id": part * 100 + i}) for i in range(100)]
        (source / f"part-{part}.json").write_text("\n".join(rows) + "\n")
    query = (
        spark.readStream.schema("order_id long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(batch_publisher(f"local://{path}", ENTITY, SPEC))
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    ids = ids_on(path)
    out["batch_publisher_exactly_once"] = sorted(ids) == expected and len(ids) == 200

    # The driver keeps its own backend open on the broker file during publish (issue 10)
    path = workdir / "kept-open.db"
    with LocalBackend(str(path)) as kept:
        kept.create_entity(ENTITY)
        publish(df, f"local://{path}", ENTITY, SPEC, after_partition=kill)
        seen_by_driver = sorted(kept.message_ids("orders"))
    ids = ids_on(path)
    out["driver_backend_open_exactly_once"] = (
        seen_by_driver == expected and sorted(ids) == expected and len(ids) == 200
    )
    spark.stop()
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))))
