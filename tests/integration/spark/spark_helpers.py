"""Shared test data and broker readers for the Spark suite (imported, not a test module)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

from sendonce.backends.local import LocalBackend

# The suite's JVMs run short jobs on small data: C1 alone compiles what they run (C2, the
# optimising compiler, would spend CPU on code that runs for seconds, on a 2-core machine the
# other tests need) and one GC thread does. How fast the JVM compiles, nothing it does.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def quick_jvm_env() -> dict[str, str]:
    """For a process that starts its own Spark JVM (a sample, the demo): ``QUICK_JVM`` for
    every JVM it starts (the JVM notes the option on stderr)."""
    return {"JAVA_TOOL_OPTIONS": QUICK_JVM}


def spark_env() -> dict[str, str]:
    """What a Spark driver process needs in its environment on this machine kind."""
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def orders(spark: Any, n: int = 300, partitions: int = 3) -> Any:
    """n orders over a few partitions, with a decimal and a timestamp (one minute apart)."""
    return spark.range(n, numPartitions=partitions).selectExpr(
        "id as order_id",
        "concat('customer-', cast(id % 7 as string)) as customer",
        "cast(id * 1.25 as decimal(10,2)) as amount",
        "timestamp'2024-03-10 12:00:00' + make_interval(0, 0, 0, 0, 0, id, 0) as placed_at",
    )


def ids_on(path: Path, entity: str = "orders") -> list[str]:
    """Every message id on the broker file's entity (one entry per stored message)."""
    backend = LocalBackend(str(path))
    try:
        return backend.message_ids(entity)
    finally:
        backend.close()


def drain(path: Path, entity: str = "orders") -> dict[str, bytes]:
    """Receive every message: id -> body (asserting no id appears twice)."""
    backend = LocalBackend(str(path))
    out: dict[str, bytes] = {}
    try:
        while batch := backend.receive(entity, max_messages=500):
            for message in batch:
                assert message.message_id not in out, message.message_id
                out[message.message_id] = message.body
    finally:
        backend.close()
    return out


def expected(n: int, prefix: str = "order-") -> list[str]:
    return sorted(f"{prefix}{i}" for i in range(n))


_job_groups = itertools.count()


def publish_on_first_attempts(
    spark: Any, df: Any, url: str, entity: Any, spec: Any, *, ledger: str
) -> Any:
    """``sendonce.spark.publish(df, ...)``, asserting that no task attempt of its jobs failed
    (a re-run must not lean on Spark's retries) and that the report is complete."""
    from sendonce.spark import publish

    context = spark.sparkContext
    group = f"first-attempts-{next(_job_groups)}"
    context.setJobGroup(group, "a publish expected to need no task retry")
    try:
        report = publish(df, url, entity, spec, ledger=ledger)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    tracker = context.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    assert jobs, "the publish ran no Spark job"
    for job in jobs:
        info = tracker.getJobInfo(job)
        assert info is not None and info.status == "SUCCEEDED"
        for stage in info.stageIds:
            stage_info = tracker.getStageInfo(stage)
            if stage_info is None:  # a stage skipped or already forgotten by the tracker
                continue
            assert stage_info.numFailedTasks == 0, f"stage {stage}: a task attempt failed"
            assert stage_info.currentAttemptId == 0
    assert report.complete
    assert all(p.attempt == 0 for p in report.partitions)  # first attempts only
    return report
