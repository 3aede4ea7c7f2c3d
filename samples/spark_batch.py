"""Publish a Spark DataFrame of orders exactly once, then publish it again.

Run: python samples/spark_batch.py [BROKER_FILE]

With no argument the local broker lives in a temporary directory. On a
cluster, pass an Azure Service Bus connection string as the url instead of
``local://...``: the local broker is one SQLite file on one machine.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from sendonce import EntityProfile, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark import publish


def main(broker_file: Path) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2,4]")  # ",4": Spark retries failed tasks
        .appName("sendonce-batch-sample")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        orders = spark.range(500, numPartitions=4).selectExpr(
            "id + 1000 as order_id",
            "2026 as year",  # from the data, never from the clock: ids must not change
            "concat('customer-', cast(id % 13 as string)) as customer",
            "cast(10 + id % 90 as decimal(10,2)) as amount",
        )
        url = f"local://{broker_file.resolve()}"
        entity = EntityProfile("payments")  # duplicate detection on, 10-minute window
        # The id names the business event; body=None sends the row as canonical JSON.
        spec = MessageSpec("{order_id}.{year}/payment", body=None)

        first = publish(orders, url, entity, spec)
        first.raise_for_failures()
        print(f"first run:  {first}")
        again = publish(orders, url, entity, spec)  # e.g. the job re-run after a crash
        again.raise_for_failures()
        print(f"second run: {again}")
    finally:
        spark.stop()

    backend = LocalBackend(str(broker_file))
    try:
        print(f"messages in {entity.name!r}: {backend.count(entity.name)}")
        for message in backend.peek(entity.name, max_messages=2):
            print(f"  {message.message_id}: {message.body.decode()}")
    finally:
        backend.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "broker.db")
