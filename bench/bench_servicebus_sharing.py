"""One shared connection vs one connection per lane, through the emulator, in one run.

    python bench/bench_servicebus_sharing.py         # 3,000 keyed messages, 5 rounds, 5 ms
    python bench/bench_servicebus_sharing.py --rtt-ms 0 5 --messages 2000 --rounds 3
    python bench/bench_servicebus_sharing.py --aio           # the aio backend and sender
    python bench/bench_servicebus_sharing.py --smoke

Each round opens a fresh sync ``AzureServiceBusBackend`` (``max_in_flight=16``) and sends
``--messages`` keyed messages (32 keys) to a partitioned entity with ``send_many``, through
``bench/delay_proxy.py`` at each ``--rtt-ms``; rounds alternate between
``connection_sharing=True`` and ``False`` so a busy machine slows both alike. Printed per
mode: the AMQP connections the round opened, messages per second (wall) and the client
process's CPU per message (``process_time``: every thread, the connection loop's included).
The emulator runs in its own process (its CPU is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from _network import emulator_process, load, through_rtts
from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, IdempotentSender, Message, aio
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.backends.servicebus._connection import registered

PARTS = EntityProfile("parts", partitioned=True, duplicate_detection_window=timedelta(minutes=10))
KEYS = 32
LANES = 16


async def aio_round(conn_str: str, sharing: bool, messages: list[Message]) -> tuple[int, Any]:
    async with aio.AzureServiceBusBackend.from_connection_string(
        conn_str, profiles={"parts": PARTS}, max_in_flight=LANES, connection_sharing=sharing
    ) as backend:
        async with aio.IdempotentSender(backend, PARTS) as sender:
            report = await sender.send_many(messages)
        if sharing:
            connections = sum(c.connects for c in registered() if c.key.host == backend.namespace)
        else:
            connections = len(backend._own_lanes["parts"]._idle)
    return connections, report


def one_round(
    conn_str: str, sharing: bool, n: int, tag: str, use_aio: bool = False
) -> tuple[int, float, float]:
    """(connections opened, msg/s, CPU µs per message) of one fresh backend's ``send_many``."""
    messages = [
        Message(b"x" * 64, message_id=f"{tag}-{i}", partition_key=f"k{i % KEYS}") for i in range(n)
    ]
    wall, cpu = time.perf_counter(), time.process_time()
    if use_aio:
        connections, report = asyncio.run(aio_round(conn_str, sharing, messages))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if report.failed:
            raise SystemExit(f"{report.failed} messages failed: {report.failures[:3]}")
        return connections, n / wall, cpu / n * 1e6
    with AzureServiceBusBackend.from_connection_string(
        conn_str, profiles={"parts": PARTS}, max_in_flight=LANES, connection_sharing=sharing
    ) as backend:
        with IdempotentSender(backend, PARTS) as sender:
            report = sender.send_many(messages)
        if sharing:
            connections = sum(c.connects for c in registered() if c.key.host == backend.namespace)
        else:
            connections = len(backend._own_lanes["parts"]._idle)  # one connection per lane
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if report.failed:
        raise SystemExit(f"{report.failed} messages failed: {report.failures[:3]}")
    return connections, n / wall, cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[5.0])
    parser.add_argument("--aio", action="store_true", help="the aio backend and sender")
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), messages=60, rounds=1, rtt_ms=[0.0])
    with tempfile.TemporaryDirectory() as tmp:
        with (
            emulator_process(Path(tmp) / "broker.db", [PARTS]) as conn_str,
            through_rtts(conn_str, args.rtt_ms) as by_rtt,
        ):
            for rtt, conn in by_rtt.items():
                figures: dict[bool, list[tuple[int, float, float]]] = {True: [], False: []}
                one_round(
                    conn, True, min(args.messages, 200), f"warm-{rtt}", args.aio
                )  # imports, caches
                for r in range(args.rounds):
                    for sharing in (True, False) if r % 2 == 0 else (False, True):
                        tag = f"{rtt}-{r}-{int(sharing)}"
                        figures[sharing].append(
                            one_round(conn, sharing, args.messages, tag, args.aio)
                        )
                print(
                    f"{'aio' if args.aio else 'sync'}, rtt {rtt:g} ms, "
                    f"{args.messages} keyed messages ({KEYS} keys), "
                    f"max_in_flight={LANES}, {args.rounds} rounds each, load {load()}"
                )
                for sharing, rows in figures.items():
                    name = "shared connection" if sharing else "connection per lane"
                    rates = [row[1] for row in rows]
                    cpus = [row[2] for row in rows]
                    print(
                        f"  {name:20s} connections {max(row[0] for row in rows):3d}  "
                        f"msg/s median {statistics.median(rates):7.0f} "
                        f"(range {min(rates):.0f}-{max(rates):.0f})  "
                        f"CPU µs/msg median {statistics.median(cpus):5.0f} "
                        f"(range {min(cpus):.0f}-{max(cpus):.0f})"
                    )


if __name__ == "__main__":
    main()
