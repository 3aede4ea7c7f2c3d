"""Spark -> Service Bus through the emulator: throughput over a round trip, with one or
several transfers in flight per task, and connection per partition vs reuse.

Run: python bench/bench_spark_servicebus.py [--rtt-ms 0 5] [--rows 40000]
         [--keyed-rows 6000] [--partitions 16] [--rounds 2] [--connection-reuse] [--smoke]

``publish`` with the real azure-servicebus client on the executors against
``sendonce.emulator.Emulator`` (one local broker file), on ``local[2]``, at each
``--rtt-ms`` through ``bench/delay_proxy.py``:

- ``plain``: a queue without partitioning (the sender batches);
- ``keyed``: a partitioned queue with duplicate detection, partition key = customer
  (one message per transfer), with ``MaxInFlight=1`` in the connection string
  (one transfer at a time per task, as before) and with the default lanes.

``--connection-reuse`` (RTT 0) compares ``keep_connections=0`` (each task opens and
closes its connection) with the default (a Python worker keeps its connection for
its next task). Rounds alternate the variants (the machine is shared); it prints
rows/s per run and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _network import load
from _smoke import add_smoke, apply_smoke
from bench_spark import orders, session
from delay_proxy import DelayProxy, with_port

from sendonce import EntityProfile, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator
from sendonce.spark import publish

PLAIN = EntityProfile("orders")
KEYED = EntityProfile("keyed", partitioned=True)


def rtt_table(spark: Any, args: argparse.Namespace, tmp: Path) -> None:
    plain_df = orders(spark, args.rows, args.partitions).cache()
    keyed_df = orders(spark, args.keyed_rows, args.partitions).cache()
    plain_df.count()
    keyed_df.count()
    plain_spec = MessageSpec("order-{order_id}.{customer}/created", body=None)
    keyed_spec = MessageSpec(
        "order-{order_id}.{customer}/created", body=None, partition_key="{customer}"
    )
    variants: list[tuple[str, Any, EntityProfile, MessageSpec, str, int]] = [
        ("plain", plain_df, PLAIN, plain_spec, "", args.rows),
        ("keyed, 1 in flight", keyed_df, KEYED, keyed_spec, ";MaxInFlight=1", args.keyed_rows),
        ("keyed, default lanes", keyed_df, KEYED, keyed_spec, "", args.keyed_rows),
    ]
    for rtt in args.rtt_ms:
        times: dict[str, list[float]] = {v[0]: [] for v in variants}
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else list(reversed(variants))
            for label, df, profile, spec, option, rows in order:
                db = tmp / f"rtt{rtt:g}-{label.replace(' ', '').replace(',', '')}-{round_}.db"
                with LocalBackend(db) as store:
                    store.create_entity(profile)
                with Emulator(db) as emu:
                    url = emu.connection_string.rstrip(";") + option
                    with contextlib.ExitStack() as stack:
                        if rtt > 0:
                            proxy = DelayProxy("127.0.0.1", emu.port, rtt=rtt / 1000)
                            url = with_port(url, stack.enter_context(proxy).port)
                        began = time.perf_counter()
                        report = publish(df, url, profile, spec, check_conflicts=False)
                        seconds = time.perf_counter() - began
                assert report.delivered == rows, report
                times[label].append(seconds)
                print(
                    f"  RTT {rtt:g} ms round {round_}: {label:<22} {seconds:6.2f} s "
                    f"{rows / seconds:>8,.0f} rows/s",
                    flush=True,
                )
        rate = {v[0]: v[5] / statistics.median(times[v[0]]) for v in variants}
        one, lanes = rate["keyed, 1 in flight"], rate["keyed, default lanes"]
        print(
            f"RTT {rtt:g} ms (load {load()}): plain {rate['plain']:,.0f} rows/s; keyed "
            f"{one:,.0f} rows/s with 1 in flight, {lanes:,.0f} with the default lanes "
            f"({lanes / one:.2f}x)"
        )


def connection_reuse(spark: Any, args: argparse.Namespace, tmp: Path) -> None:
    df = orders(spark, args.rows, args.partitions).cache()
    df.count()
    spec = MessageSpec("order-{order_id}.{customer}/created", body=None)
    times: dict[str, list[float]] = {"per partition": [], "per executor": []}
    keeps = {"per partition": 0.0, "per executor": 30.0}
    for round_ in range(args.rounds):
        order = list(keeps) if round_ % 2 == 0 else list(reversed(keeps))
        for label in order:
            db = tmp / f"{label.replace(' ', '-')}-{round_}.db"
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
    part, execu = (statistics.median(times[k]) for k in ("per partition", "per executor"))
    print(
        f"median per partition {args.rows / part:,.0f} rows/s, per executor "
        f"{args.rows / execu:,.0f} rows/s; per executor / per partition time {execu / part:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--keyed-rows", type=int, default=6_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 5.0])
    parser.add_argument("--connection-reuse", action="store_true")
    add_smoke(parser)
    args = apply_smoke(
        parser.parse_args(), rows=200, keyed_rows=40, partitions=2, rounds=1, rtt_ms=[0.0]
    )
    spark = session(args.master)
    print(f"{args.rows:,} rows, {args.partitions} partitions, {args.master}, JSON bodies")
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm.db"  # Python workers import the client once, outside the rounds
        with LocalBackend(warm) as store:
            store.create_entity(EntityProfile("orders"))
        with Emulator(warm) as emu:
            publish(
                orders(spark, 200, 2),
                emu.connection_string,
                EntityProfile("orders"),
                MessageSpec("order-{order_id}.{customer}/created", body=None),
            )
        if args.connection_reuse:
            connection_reuse(spark, args, Path(tmp))
        else:
            rtt_table(spark, args, Path(tmp))
    spark.stop()


if __name__ == "__main__":
    main()
