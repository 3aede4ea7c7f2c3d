"""A Structured Streaming job that publishes each input row exactly once, across restarts.

Run: python samples/spark_streaming.py [WORKDIR]

Order files arrive in a directory; a query with a checkpoint publishes each
micro-batch with ``foreachBatch(batch_publisher(...))``. The sample runs the
query twice over the same checkpoint, the second time after more files
arrived: a batch replayed after a crash would carry the same ids, so the
broker keeps one copy of each order.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from sendonce import EntityProfile, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark import PublishReport, batch_publisher


def write_orders(directory: Path, part: int, count: int) -> None:
    lines = [
        json.dumps({"order_id": part * 1000 + i, "customer": f"c-{i % 7}", "amount": "9.90"})
        for i in range(count)
    ]
    (directory / f"orders-{part}.json").write_text("\n".join(lines) + "\n")


def main(workdir: Path) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("sendonce-streaming-sample")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    inbox = workdir / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    url = f"local://{(workdir / 'broker.db').resolve()}"
    entity = EntityProfile("orders")

    def report(batch_id: int, batch: PublishReport) -> None:
        print(f"  batch {batch_id}: {batch}")

    publisher = batch_publisher(
        url, entity, MessageSpec("order-{order_id}", body=None), on_batch=report
    )

    def run_query() -> None:
        query = (
            spark.readStream.schema("order_id long, customer string, amount string")
            .option("maxFilesPerTrigger", 1)
            .json(str(inbox))
            .writeStream.foreachBatch(publisher)
            .option("checkpointLocation", str(workdir / "checkpoint"))
            .trigger(availableNow=True)  # process what is there, then stop
            .start()
        )
        query.awaitTermination()

    try:
        write_orders(inbox, 0, 100)
        write_orders(inbox, 1, 100)
        print("first run:")
        run_query()
        write_orders(inbox, 2, 50)
        print("restart from the checkpoint, one more file:")
        run_query()
    finally:
        spark.stop()

    backend = LocalBackend(str(workdir / "broker.db"))
    try:
        ids = backend.message_ids(entity.name)
    finally:
        backend.close()
    print(f"messages in {entity.name!r}: {len(ids)} ({len(set(ids))} distinct orders of 250)")
    if len(ids) != 250 or len(set(ids)) != 250:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
