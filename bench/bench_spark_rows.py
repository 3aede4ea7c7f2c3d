"""Where a ``partition_publisher`` task's Python time goes, per row, without a Spark session.

Run: python bench/bench_spark_rows.py [--rows 200000] [--repeats 3] [--smoke]

Builds the bench's five columns as pyspark ``Row`` objects (naive local timestamps, as
Spark hands them to ``foreachPartition``), then times, on one core, per row:

- ``bare loop``: read the five fields by name (what bench_spark.py's bare loop does);
- each stage of ``TaskJob.rows``: rows to columns, normalising, encoding (ids, JSON
  bodies, messages), and ``send_many`` into a real local broker file.

Spark's own cost (the JVM, unpickling ``Row`` objects) is not here: bench_spark.py
measures the whole. This one says which of our stages to work on. Medians of
``--repeats`` runs, each on a new broker file.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, IdempotentSender, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark._rows import (
    BatchEncoder,
    ColumnPlan,
    columns_of_rows,
    normalize_columns,
)

FIELDS = ("order_id", "customer", "amount", "placed_at", "status")
CHUNK = 10_000  # what TaskJob.rows hands the encoder at a time


def rows_like_spark(count: int) -> list[Any]:
    from pyspark.sql import Row

    make = Row(*FIELDS)
    base = datetime(2026, 1, 1)
    return [
        make(
            i,
            f"customer-{i % 1009}",
            Decimal(i % 100000) / 100,
            base + timedelta(seconds=i),
            "new" if i % 3 == 0 else "paid",
        )
        for i in range(count)
    ]


def bare(rows: list[Any]) -> None:
    for row in rows:
        row.order_id, row.customer, row.amount, row.placed_at, row.status  # noqa: B018


def staged(rows: list[Any], url: str, spec: MessageSpec) -> dict[str, float]:
    """One partition through the stages TaskJob.rows runs, each timed."""
    plan = ColumnPlan(FIELDS, (None,) * len(FIELDS), (), True, dynamic=True)
    encoder = BatchEncoder(spec, plan)
    spent = dict.fromkeys(("rows to columns", "normalise", "encode", "send_many"), 0.0)
    backend = LocalBackend(url.removeprefix("local://"))
    backend.create_entity(EntityProfile("orders"))
    with IdempotentSender(backend, "orders") as sender:
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start : start + CHUNK]
            t0 = time.perf_counter()
            columns = columns_of_rows(plan, chunk)
            t1 = time.perf_counter()
            columns = normalize_columns(plan, columns)
            t2 = time.perf_counter()
            encoded = encoder.encode(columns, len(chunk))
            t3 = time.perf_counter()
            report = sender.send_many(encoded.messages)
            t4 = time.perf_counter()
            assert report.sent == len(chunk), report
            for label, seconds in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                spent[label] += seconds
    backend.close()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), rows=300, repeats=1)
    rows = rows_like_spark(args.rows)
    # Spark streams rows; here they are all alive at once. Keep the garbage collector from
    # walking them on every collection, which would bill our stages for the harness's heap.
    gc.freeze()
    spec = MessageSpec("order-{order_id}.{customer}/created")
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            began = time.perf_counter()
            bare(rows)
            result = {"bare loop (read 5 fields by name)": time.perf_counter() - began}
            result.update(staged(rows, f"local://{Path(tmp) / f'r{repeat}.db'}", spec))
            runs.append(result)
    n = args.rows
    print(f"{n:,} Row objects, chunks of {CHUNK:,}, median of {args.repeats}, µs per row:")
    total = 0.0
    for label in runs[0]:
        us = statistics.median(r[label] for r in runs) / n * 1e6
        if not label.startswith("bare"):
            total += us
        print(f"  {label:<36} {us:6.2f}")
    print(f"  {'partition_publisher, all stages':<36} {total:6.2f}")


if __name__ == "__main__":
    main()
