"""The Spark demo: publish orders exactly once while task attempts are killed after sending.

Run ``sendonce demo --spark``. A local Spark job publishes generated
orders to the embedded broker (one SQLite file in a temporary directory). The
first attempt of every partition is killed *after* it has sent its rows, so
Spark re-runs each partition and every order is sent a second time. The
broker's duplicate detection drops the copies because the ids come from the
order, not from the attempt. The demo then reads the broker's message ids and
exits 0 only if every order is there exactly once.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["run_demo"]

ENTITY_NAME = "orders"
PARTITIONS = 4
_LOG4J = """\
rootLogger.level=error
rootLogger.appenderRef.stderr.ref=console
appender.console.type=Console
appender.console.name=console
appender.console.target=SYSTEM_ERR
appender.console.layout.type=PatternLayout
appender.console.layout.pattern=%p %c{1}: %m%n
logger.spark.name=org.apache.spark
logger.spark.level=off
logger.pyspark.name=org.apache.spark.api.python
logger.pyspark.level=off
"""


def _session(workdir: Path) -> tuple[Any, bool]:
    """A quiet local session that retries failed tasks (``local[2,4]``); (session, created)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Spark's Python workers run `python3` from PATH unless PYSPARK_PYTHON says otherwise
    # (docs/spark.md); the demo points them at the interpreter it runs in, where sendonce is.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    log4j = workdir / "log4j2.properties"
    log4j.write_text(_LOG4J)
    spark = (
        SparkSession.builder.master(f"local[2,{PARTITIONS}]")
        .appName("sendonce-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .getOrCreate()
    )
    return spark, True


def _demo(workdir: Path, rows: int) -> int:
    from .. import EntityProfile, MessageSpec
    from ..backends.local import LocalBackend
    from ..spark import PartitionResult, publish

    broker = workdir / "broker.db"
    url = f"local://{broker}"
    print(f"sendonce Spark demo: {rows} orders, {PARTITIONS} partitions, broker {broker}")
    began = time.perf_counter()
    spark, created = _session(workdir)
    try:
        orders = spark.range(rows, numPartitions=PARTITIONS).selectExpr(
            "id + 100000 as order_id",
            "concat('customer-', cast(id % 97 as string)) as customer",
            "cast(5 + (id % 400) * 0.25 as decimal(10,2)) as amount",
            "timestamp'2026-11-01 09:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) as placed_at",
        )
        spec = MessageSpec("order-{order_id}/created", body=None)

        def kill_first_attempt(result: PartitionResult) -> None:
            # Runs on the executor after the partition's rows were sent.
            if result.attempt == 0:
                raise RuntimeError(
                    f"demo: killing attempt 0 of partition {result.partition} after it sent "
                    f"{result.sent} messages"
                )

        print("publishing; the first attempt of every partition is killed after sending ...")
        report = publish(
            orders, url, EntityProfile(ENTITY_NAME), spec, after_partition=kill_first_attempt
        )
    finally:
        if created:
            spark.stop()

    backend = LocalBackend(str(broker))
    try:
        stored = backend.message_ids(ENTITY_NAME)
        in_queue = backend.count(ENTITY_NAME)
        sample = backend.peek(ENTITY_NAME, max_messages=3)
    finally:
        backend.close()
    print("  first messages in the queue:")
    for message in sample:
        body = message.body.decode("utf-8")
        print(f"    {message.message_id:<22} {body[:90]}{'...' if len(body) > 90 else ''}")
    counts = Counter(stored)
    expected = {f"order-{100000 + i}/created" for i in range(rows)}
    repeated = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(expected - counts.keys())
    unexpected = sorted(counts.keys() - expected)
    retried = sum(1 for attempts in report.attempts.values() if attempts > 1)
    exactly_once = not repeated and not missing and not unexpected and in_queue == rows

    print(f"  rows in the DataFrame:          {report.rows}")
    print(f"  task attempts killed:           {retried} (every partition re-ran)")
    print(f"  messages sent, all attempts:    {rows + report.sent + report.duplicates}")
    print(f"  duplicates dropped by broker:   {report.duplicates}")
    print(f"  messages in the queue:          {in_queue}")
    print(f"  orders missing / twice / extra: {len(missing)} / {len(repeated)} / {len(unexpected)}")
    print(f"  time:                           {time.perf_counter() - began:.1f}s")
    if exactly_once:
        print(f"OK: each of the {rows} orders is in the queue exactly once.")
        return 0
    print(
        "FAILED: exactly-once does not hold: "
        f"missing {missing[:5]}, twice {repeated[:5]}, unexpected {unexpected[:5]}"
    )
    return 1


def run_demo(workdir: str | None = None, rows: int = 2000) -> int:
    """Run the demo in ``workdir`` (a temporary directory by default); 0 if exactly-once held."""
    if not isinstance(rows, int) or rows < 1:
        raise ValueError("rows must be a positive int")
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        print(f"the Spark demo needs the spark extra: pip install 'sendonce[spark]' ({exc})")
        return 2
    if workdir is not None:
        path = Path(workdir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return _demo(path, rows)
    with tempfile.TemporaryDirectory(prefix="sendonce-demo-") as tmp:
        return _demo(Path(tmp), rows)


if __name__ == "__main__":
    sys.exit(run_demo())
