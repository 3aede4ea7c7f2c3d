"""Driver for the standalone-cluster tests, run in its own process (one SparkContext each).

Usage: python cluster_checks.py MASTER_URL CONNECTION_STRING SCENARIO MARKS_DIR
Each attempt that finishes publishing leaves ``p{partition}-a{attempt}-{host}`` in
MARKS_DIR. Prints ``RESULT {json}``: the report of a publish to the emulator under SCENARIO:

- ``speculation``: partition 0's first attempt sleeps after publishing; a speculative
  copy runs on the other host, resends every row (the broker drops the copies) and wins;
- ``executor-killed``: partition 1's first attempt SIGKILLs its executor JVM in the middle
  of the partition (its first Arrow batch already confirmed); Spark reruns it elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sendonce import EntityProfile, MessageSpec, RetryPolicy
from sendonce.spark import PartitionResult, publish

HERE = Path(__file__).resolve().parent
ROWS, PARTITIONS = 400, 4


def session(master: str, scenario: str) -> Any:
    os.environ.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(f"sendonce-{scenario}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "4")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dlog4j2.configurationFile=file:{HERE / 'log4j2.properties'}",
        )
    )
    if scenario == "speculation":
        builder = (
            builder.config("spark.speculation", "true")
            .config("spark.speculation.interval", "200ms")
            .config("spark.speculation.multiplier", "1.5")
            .config("spark.speculation.quantile", "0.5")
            .config("spark.speculation.minTaskRuntime", "1s")
        )
    return builder.getOrCreate()


def executor_jvm() -> int:
    """The pid of the executor JVM above this Python worker (worker -> daemon -> JVM)."""
    pid = os.getppid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no executor JVM above this process")


def main(master: str, url: str, scenario: str, marks: Path) -> dict[str, Any]:
    spark = session(master, scenario)
    df = spark.range(ROWS, numPartitions=PARTITIONS).selectExpr(
        "id as order_id", "concat('customer-', cast(id % 7 as string)) as customer"
    )
    retry = RetryPolicy(max_attempts=6, initial_backoff=0.05, attempt_timeout=5.0, jitter=False)
    spec = MessageSpec("order-{order_id}", body=None)
    slow = scenario == "speculation"

    def after(result: PartitionResult) -> None:
        """Marks which attempt finished publishing where; partition 0's first one then hangs."""
        host = os.environ.get("SPARK_LOCAL_IP", "?")
        (marks / f"p{result.partition}-a{result.attempt}-{host}").touch()
        if slow and result.partition == 0 and result.attempt == 0:
            time.sleep(60)  # sent everything, then hangs: Spark speculates

    if scenario == "speculation":
        pass
    elif scenario == "executor-killed":

        def body(row: Any) -> str:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if row["order_id"] == 175 and ctx is not None and ctx.attemptNumber() == 0:
                os.kill(executor_jvm(), signal.SIGKILL)  # rows 100..149 already confirmed
                time.sleep(60)
            return json.dumps({"order_id": row["order_id"], "customer": row["customer"]})

        spec = MessageSpec("order-{order_id}", body=body)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    began = time.monotonic()
    report = publish(
        df,
        url,
        EntityProfile("orders"),
        spec,
        retry=retry,
        check_conflicts=False,
        after_partition=after,
        keep_connections=1.0,
    )
    out = {
        "seconds": time.monotonic() - began,
        "rows": report.rows,
        "delivered": report.delivered,
        "failed": report.failed,
        "complete": report.complete,
        "attempts": {str(p.partition): p.attempt for p in report.partitions},
        "finished": sorted(f.name for f in marks.iterdir()),
    }
    spark.stop()
    return out


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    print("RESULT " + json.dumps(result), flush=True)
