"""Spark -> Service Bus through the emulator: throughput, and connection per partition vs reuse.

Run: python bench/bench_spark_servicebus.py [--rows 40000] [--partitions 16] [--rounds 2]

``publish`` with the real azure-servicebus client on the executors against
``sendonce.emulator.Emulator`` (one local broker file), on ``local[2]``:

- ``per partition``: ``keep_connections=0``, each task opens and closes its connection;
- ``per executor``: the default, a Python worker keeps its connection for its next task.

Rounds alternate the two (the machine is shared); it prints rows/s per run and the
ratio of the medians (per executor / per partition time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_spark import orders, session

from sendonce import EntityProfile, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator
from sendonce.spark import publish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    spark = session(args.master)
    df = orders(spark, args.rows, args.partitions).cache()
    df.count()
    spec = MessageSpec("order-{order_id}.{customer}/created", body=None)
    print(f"{args.rows:,} rows, {args.partitions} partitions, {args.master}, JSON bodies")
    times: dict[str, list[float]] = {"per partition": [], "per executor": []}
    keeps = {"per partition": 0.0, "per executor": 30.0}
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm.db"  # Python workers import the client once, outside the rounds
        with LocalBackend(warm) as store:
            store.create_entity(EntityProfile("orders"))
        with Emulator(warm) as emu:
            publish(df.limit(200), emu.connection_string, EntityProfile("orders"), spec)
        for round_ in range(args.rounds):
            order = list(keeps) if round_ % 2 == 0 else list(reversed(keeps))
            for label in order:
                db = Path(tmp) / f"{label.replace(' ', '-')}-{round_}.db"
                entity = EntityProfile("orders")
                with LocalBackend(db) as store:
                    store.create_entity(entity)
                with Emulator(db) as emu:
                    began = time.perf_counter()
                    report = publish(
                        df,
                        emu.connection_string,
                        entity,
                        spec,
                        check_conflicts=False,
                        keep_connections=keeps[label],
                    )
                    seconds = time.perf_counter() - began
                    opened = emu.connections_accepted
                assert report.delivered == args.rows, report
                times[label].append(seconds)
                print(
                    f"  round {round_}: {label:<14} {seconds:6.2f} s "
                    f"{args.rows / seconds:>8,.0f} rows/s  {opened} connections",
                    flush=True,
                )
    spark.stop()
    part, execu = (statistics.median(times[k]) for k in ("per partition", "per executor"))
    print(
        f"median per partition {args.rows / part:,.0f} rows/s, per executor "
        f"{args.rows / execu:,.0f} rows/s; per executor / per partition time {execu / part:.2f}x"
    )


if __name__ == "__main__":
    main()
