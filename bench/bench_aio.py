"""The asyncio sender against the sync sender and the raw client, on loopback and over a
network's round trip.

Local broker: N single sends by the sync sender (a plain loop) vs the aio sender
over ThreadedBackend, awaited one by one and as N concurrent tasks; the ratio is
the cost of the event loop and the worker-thread hop per call.

Emulator (real azure-servicebus over a socket, the emulator in its own process),
at each ``--rtt-ms`` through a delay proxy (``bench/delay_proxy.py``):

- ``--concurrent`` (400) concurrent ``sendonce.aio`` ``send()`` calls from tasks, vs
  the raw aio client: one sender with 400 concurrent ``send_messages`` (unsafe,
  azure-sdk-for-python #36334, but what users compare with), and 8 sender links
  worked by 8 tasks; the target is >= the one-sender figure and >= 0.7 x
  ``max_in_flight`` / RTT; the same sends on backends with ``--lanes`` other
  ``max_in_flight`` values show how the default was chosen;
- ``send_many`` of ``--many`` messages over ``--keys`` partition keys to a
  partitioned entity with duplicate detection (one message per transfer), sync and
  aio, vs the sequential line: raw single sends one at a time (1/RTT).

Links are warmed before timing; rounds alternate the variants; medians and ratios
come from this one run.

    python bench/bench_aio.py [--rtt-ms 0 5 20] [--concurrent 400] [--many 1600] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _network import CpuMeter, emulator_process, load, through_rtts
from _smoke import add_smoke, apply_smoke
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from sendonce import EntityProfile, IdempotentSender, Message, aio
from sendonce.backends import AzureServiceBusBackend
from sendonce.backends.local import LocalBackend

PROFILE = EntityProfile("orders")
PARTS = EntityProfile("parts", partitioned=True)
RAW_LINKS = 8


def messages(n: int, tag: str) -> list[Message]:
    return [Message(f'{{"order_id": {i}}}', message_id=f"{tag}-{i}") for i in range(n)]


def sync_local(path: Path, batch: list[Message]) -> float:
    with LocalBackend(path) as backend, IdempotentSender(backend, PROFILE) as sender:
        start = time.perf_counter()
        for m in batch:
            sender.send(m)
        return time.perf_counter() - start


async def aio_local(path: Path, batch: list[Message], concurrent: bool) -> float:
    async with (
        aio.ThreadedBackend(LocalBackend(path)) as backend,
        aio.IdempotentSender(backend, PROFILE) as sender,
    ):
        start = time.perf_counter()
        if concurrent:
            await asyncio.gather(*(sender.send(m) for m in batch))
        else:
            for m in batch:
                await sender.send(m)
        return time.perf_counter() - start


def rounds(repeats: int, runs: dict[str, Callable[[int], float]]) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeats):
        names = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in names:
            times[name].append(runs[name](r))
    return {name: statistics.median(t) for name, t in times.items()}


def report(title: str, n: int, medians: dict[str, float]) -> None:
    base = medians["sync"]
    print(f"{title}: {n} single sends, median of rounds")
    for name, seconds in medians.items():
        print(
            f"  {name:<16} {seconds * 1000:8.1f} ms  {n / seconds:9.0f} sends/s  "
            f"{seconds / base:5.2f}x sync"
        )


def keyed(n: int, keys: int, tag: str) -> list[Message]:
    return [
        Message(f'{{"order_id": {i}}}', message_id=f"{tag}-{i}", partition_key=f"k{i % keys}")
        for i in range(n)
    ]


async def timed(run: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await run()
    return time.perf_counter() - start


class Network:
    """Every variant's client, opened and warmed once per RTT, timed in alternating rounds."""

    def __init__(self, conn: str, args: argparse.Namespace) -> None:
        self.conn = conn
        self.args = args

    async def run(self, repeats: int) -> dict[str, tuple[int, float]]:
        args = self.args
        profiles = {"orders": PROFILE, "parts": PARTS}
        n, m = args.concurrent, args.many
        async with (
            aio.AzureServiceBusBackend.from_connection_string(self.conn, profiles=profiles) as b,
            aio.IdempotentSender(b, PROFILE) as sender,
            aio.IdempotentSender(b, PARTS) as parts,
            ServiceBusClient.from_connection_string(self.conn, retry_total=0) as client,
        ):
            sync_backend = AzureServiceBusBackend.from_connection_string(
                self.conn, profiles=profiles
            )
            sync_parts = IdempotentSender(sync_backend, PARTS)
            raw = client.get_queue_sender("orders")
            links = [client.get_queue_sender("orders") for _ in range(RAW_LINKS)]
            # warm every link: an attach costs several round trips
            warm = b.max_in_flight * 2
            await asyncio.gather(*(sender.send(x) for x in messages(warm, "warm-so")))
            await parts.send_many(keyed(warm, args.keys, "warm-parts"))
            await asyncio.to_thread(sync_parts.send_many, keyed(warm, args.keys, "warm-sp"))
            for i, link in enumerate([raw, *links]):
                await link.send_messages(ServiceBusMessage(b"w", message_id=f"warm-raw-{i}"))
            # the same 400 sends on backends with other lane counts: how to size the default
            sized: dict[int, aio.IdempotentSender] = {}
            others: list[aio.AzureServiceBusBackend] = []
            for lanes in args.lanes:
                other = aio.AzureServiceBusBackend.from_connection_string(
                    self.conn, profiles=profiles, max_in_flight=lanes
                )
                others.append(other)
                sized[lanes] = aio.IdempotentSender(other, PROFILE)
                await sized[lanes].open()
                warmed = messages(lanes * 2, f"warm-{lanes}")
                await asyncio.gather(*(sized[lanes].send(x) for x in warmed))

            def so_gather_on(lanes: int) -> Callable[[str], Awaitable[None]]:
                async def run(tag: str) -> None:
                    chosen = sized[lanes]
                    await asyncio.gather(*(chosen.send(x) for x in messages(n, tag)))

                return run

            async def so_gather(tag: str) -> None:
                await asyncio.gather(*(sender.send(x) for x in messages(n, tag)))

            async def raw_gather(tag: str) -> None:
                batch = [
                    ServiceBusMessage(x.body, message_id=x.message_id) for x in messages(n, tag)
                ]
                await asyncio.gather(*(raw.send_messages(x, timeout=30) for x in batch))

            async def raw_links(tag: str) -> None:
                queue: asyncio.Queue[Message] = asyncio.Queue()
                for x in messages(n, tag):
                    queue.put_nowait(x)

                async def lane(link: Any) -> None:
                    while not queue.empty():
                        x = queue.get_nowait()
                        await link.send_messages(
                            ServiceBusMessage(x.body, message_id=x.message_id), timeout=30
                        )

                await asyncio.gather(*(lane(link) for link in links))

            async def raw_sequential(tag: str) -> None:
                for x in messages(args.sequential, tag):
                    await raw.send_messages(
                        ServiceBusMessage(x.body, message_id=x.message_id), timeout=30
                    )

            async def so_many(tag: str) -> None:
                report = await parts.send_many(keyed(m, args.keys, tag))
                assert report.sent == m, report

            async def sync_many(tag: str) -> None:
                report = await asyncio.to_thread(sync_parts.send_many, keyed(m, args.keys, tag))
                assert report.sent == m, report

            variants: dict[str, tuple[int, Callable[[str], Awaitable[None]]]] = {
                "aio send() x concurrent": (n, so_gather),
                "raw one sender, gather": (n, raw_gather),
                f"raw {RAW_LINKS} links": (n, raw_links),
                "raw sequential (1/RTT)": (args.sequential, raw_sequential),
                "aio send_many, keyed": (m, so_many),
                "sync send_many, keyed": (m, sync_many),
                **{f"aio send(), {k} lanes": (n, so_gather_on(k)) for k in args.lanes},
            }
            times: dict[str, list[float]] = {k: [] for k in variants}
            self.cpu = {k: CpuMeter() for k in variants}
            for r in range(repeats):
                names = list(variants) if r % 2 == 0 else list(reversed(variants))
                for name in names:
                    _, fn = variants[name]
                    tag = f"{name.split()[0]}{len(times[name])}-{r}-{id(self)}"
                    self.cpu[name].start()
                    times[name].append(await timed(lambda fn=fn, tag=tag: fn(tag)))
                    self.cpu[name].stop()
            self.cpu_counts = {k: variants[k][0] * repeats for k in variants}
            for link in [raw, *links]:
                await link.close()
            await asyncio.to_thread(sync_parts.close)
            await asyncio.to_thread(sync_backend.close)
            for chosen in sized.values():
                await chosen.close()
            for other in others:
                await other.close()
            self.max_in_flight = b.max_in_flight
        return {k: (variants[k][0], statistics.median(v)) for k, v in times.items()}


def cpu_report(network: Network) -> None:
    """Where the CPU went, per message: this process (of which its garbage collector), the
    delay proxy, the emulator."""
    print("  CPU µs per message (all rounds): client (gc) / proxy / emulator")
    for name, meter in network.cpu.items():
        n = network.cpu_counts[name]
        used = meter.used
        proxy = sum(v for k, v in used.items() if k.startswith("proxy"))
        print(
            f"    {name:<26} {used['client'] / n * 1e6:6.0f} ({used['client gc'] / n * 1e6:3.0f})"
            f" / {proxy / n * 1e6:5.0f} / {used.get('emulator', 0.0) / n * 1e6:5.0f}"
        )


def network_report(rtt: float, results: dict[str, tuple[int, float]], lanes: int) -> None:
    rate = {k: n / t for k, (n, t) in results.items()}
    print(f"RTT {rtt:g} ms (load {load()}): messages/s, median of rounds")
    for name, value in rate.items():
        print(f"  {name:<26} {value:9.0f}")
    so, one = rate["aio send() x concurrent"], rate["raw one sender, gather"]
    line = rate["raw sequential (1/RTT)"]
    print(f"  aio send() / raw one sender:            {so / one:5.2f}x (target >= 1.0)")
    if rtt > 0:
        target = 0.7 * lanes / (rtt / 1000)
        print(
            f"  aio send() / (0.7 x {lanes} / RTT = {target:.0f}/s): {so / target:5.2f}x "
            "(target >= 1.0)"
        )
    print(f"  aio send_many keyed / sequential line:  {rate['aio send_many, keyed'] / line:5.2f}x")
    print(f"  sync send_many keyed / sequential line: {rate['sync send_many, keyed'] / line:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sends", type=int, default=1000, help="local broker sends")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 5.0])
    parser.add_argument("--concurrent", type=int, default=400)
    parser.add_argument("--many", type=int, default=1600)
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--sequential", type=int, default=100)
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument(
        "--lanes", type=int, nargs="*", default=[4, 8, 32], help="other max_in_flight to time"
    )
    add_smoke(parser)
    args = apply_smoke(
        parser.parse_args(),
        sends=20,
        repeats=1,
        rtt_ms=[0.0],
        concurrent=8,
        many=32,
        keys=4,
        sequential=4,
        lanes=[2],
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.no_local:
            n = args.sends

            def path(kind: str, r: int) -> Path:
                return root / f"{kind}-{r}.db"

            local = rounds(
                args.repeats,
                {
                    "sync": lambda r: sync_local(path("s", r), messages(n, "s")),
                    "aio sequential": lambda r: asyncio.run(
                        aio_local(path("a", r), messages(n, "a"), False)
                    ),
                    "aio concurrent": lambda r: asyncio.run(
                        aio_local(path("c", r), messages(n, "c"), True)
                    ),
                },
            )
            report("local broker", n, local)

        with (
            emulator_process(root / "emulator.db", [PROFILE, PARTS]) as conn,
            through_rtts(conn, args.rtt_ms) as conns,
        ):
            for rtt, url in conns.items():
                network = Network(url, args)
                results = asyncio.run(network.run(args.repeats))
                network_report(rtt, results, network.max_in_flight)
                cpu_report(network)


if __name__ == "__main__":
    main()
