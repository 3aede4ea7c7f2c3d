"""Spark publishing speed: publish() against a bare foreachPartition, measured in one run.

Run: python bench/bench_spark.py [--rows 1000000] [--master local[2]] [--body json|column]
     [--rounds 2] [--smoke]

Each variant reads the same five columns of the same DataFrame on ``local[2]``:

- ``bare foreachPartition``: iterate the rows, read the five fields by name, send nothing;
- ``bare mapInArrow``: the same columns through Arrow (``to_pylist``), send nothing;
- ``publish``: the full call -- driver checks (schema, null ids, conflicting rows),
  Arrow stage building ids and bodies, one sender per partition, the local broker;
- ``publish, no conflict check``: the same without the distributed conflict check;
- ``partition_publisher``: the ``foreachPartition`` path, same broker and spec.

It prints rows per second and the ratio of each to the bare foreachPartition. With
``--rounds N`` the variants run N times, in reverse order every other round (the machine
is shared: neighbouring runs see similar load), and it prints each round's ratios and the
median ratio per variant.
Every variant first runs once on 10,000 rows, so that no round pays the JVM's or the
Python workers' start-up (the first variant of round 1 used to).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark import partition_publisher, publish

FIELDS = ("order_id", "customer", "amount", "placed_at", "status")


def session(master: str) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("sendonce-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def orders(spark: Any, rows: int, partitions: int) -> Any:
    return spark.range(rows, numPartitions=partitions).selectExpr(
        "id as order_id",
        "concat('customer-', cast(id % 1009 as string)) as customer",
        "cast(id % 100000 * 0.01 as decimal(10,2)) as amount",
        "timestamp'2026-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) as placed_at",
        "case when id % 3 = 0 then 'new' else 'paid' end as status",
    )


def bare_rows(rows: Iterator[Any]) -> None:
    for row in rows:
        row.order_id, row.customer, row.amount, row.placed_at, row.status  # noqa: B018


def bare_arrow(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    count = 0
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in FIELDS]
        count += len(columns[0])
    yield pa.RecordBatch.from_pylist([{"n": count}])


def timed(label: str, fn: Callable[[], object], rows: int, results: dict[str, float]) -> None:
    began = time.perf_counter()
    fn()
    seconds = time.perf_counter() - began
    results[label] = seconds
    print(f"  {label:<34} {seconds:7.2f} s  {rows / seconds:>10,.0f} rows/s", flush=True)


def _urls(tmp: str, tag: str) -> dict[str, str]:
    return {name: f"local://{Path(tmp) / name}-{tag}.db" for name in ("a", "b", "c")}


def variants(
    df: Any, urls: dict[str, str], entity: EntityProfile, spec: MessageSpec
) -> list[tuple[str, Callable[[], object]]]:
    """Each variant as (label, run); the publishing ones write to their own broker file."""
    return [
        ("bare foreachPartition", lambda: df.foreachPartition(bare_rows)),
        ("bare mapInArrow", lambda: df.select(*FIELDS).mapInArrow(bare_arrow, "n long").collect()),
        ("publish", lambda: publish(df, urls["a"], entity, spec)),
        (
            "publish, no conflict check",
            lambda: publish(df, urls["b"], entity, spec, check_conflicts=False),
        ),
        (
            "partition_publisher (foreachPartition)",
            lambda: df.foreachPartition(partition_publisher(urls["c"], entity, spec)),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--body", choices=("json", "column"), default="json")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm-rows", type=int, default=10_000, help=argparse.SUPPRESS)
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), rows=400, partitions=2, rounds=1, warm_rows=40)
    rows = args.rows
    spark = session(args.master)
    df = orders(spark, rows, args.partitions)
    body = None if args.body == "json" else "customer"
    spec = MessageSpec("order-{order_id}.{customer}/created", body=body)
    entity = EntityProfile("orders")
    print(
        f"{rows:,} rows, {args.partitions} partitions, master {args.master}, "
        f"id {spec.message_id.template!r}, body {'JSON of the row' if body is None else body}"
    )
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        # Warm the JVM and every variant's Python workers (their imports included) on a
        # small DataFrame: otherwise the first variant of round 1 pays the start-up.
        warm = orders(spark, args.warm_rows, args.partitions)
        for _, fn in variants(warm, _urls(tmp, "warm"), entity, spec):
            fn()
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}:", flush=True)
            todo = variants(df, _urls(tmp, str(round_)), entity, spec)
            if round_ % 2:
                todo.reverse()
            results: dict[str, float] = {}
            for label, fn in todo:
                timed(label, fn, rows, results)
            rounds.append(results)
            for name in ("a", "b", "c"):
                backend = LocalBackend(str(Path(tmp) / f"{name}-{round_}.db"))
                stored = backend.count("orders")
                backend.close()
                assert stored == rows, f"{name}: {stored} messages for {rows} rows"
    spark.stop()
    print("ratios to the bare foreachPartition of the same round (lower is faster):")
    labels = list(rounds[0])
    for label in labels:
        ratios = [r[label] / r["bare foreachPartition"] for r in rounds]
        shown = "  ".join(f"{x:5.2f}x" for x in ratios)
        print(f"  {label:<38} {shown}   median {statistics.median(ratios):5.2f}x")


if __name__ == "__main__":
    main()
