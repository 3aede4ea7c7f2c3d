"""CPU per ``send()`` of the asyncio sender with many concurrent callers, no network.

The aio ``AzureServiceBusBackend`` runs over a null transport: the client's sender
is replaced by one that accepts each transfer after one pass of the event loop
(``asyncio.sleep(0)``), so every cost left is the process's own. N tasks call
``sendonce.aio`` ``send()`` at once (N - ``max_in_flight`` of them wait for a
lane); the baseline is a bare ``asyncio.gather`` of N ``send_messages`` calls on
the same null sender, each building its ``ServiceBusMessage``. Rounds alternate;
the figure is CPU µs per send (``time.process_time``) and the ratio of the two, from
this one run. A cost that grows with N is a cost per waiting caller.

    python bench/bench_aio_cpu.py [--callers 16 400 2000] [--sends 8000] [--repeats 5] [--smoke]
    python bench/bench_aio_cpu.py --profile 400     # cProfile of sendonce's side

``--src DIR`` (repeatable) measures other source trees (an older commit checked out
elsewhere) in one run: each round runs every tree in its own process, alternating, so a
busy machine slows each alike.

    python bench/bench_aio_cpu.py --src OLD/src --src src
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

from _smoke import add_smoke, apply_smoke
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus.aio import ServiceBusClient

from sendonce import EntityProfile, Message, aio

PROFILE = EntityProfile("orders")
CONN = "Endpoint=sb://bench.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=not-a-key"
BODY = '{"order_id": 123456, "amount": "12.50"}'


class NullSender:
    """What the backend needs of ``azure.servicebus.aio.ServiceBusSender``, accepting at once."""

    async def create_message_batch(self, max_size_in_bytes: int | None = None) -> Any:
        return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or 256 * 1024)

    async def send_messages(self, message: Any, *, timeout: float | None = None) -> None:
        await asyncio.sleep(0)  # the answer comes on a later pass of the loop

    async def close(self) -> None:
        return None


def messages(n: int, tag: str) -> list[Message]:
    return [Message(BODY, message_id=f"{tag}-{i}") for i in range(n)]


async def in_waves(callers: int, total: int, one: Callable[[int], Awaitable[Any]]) -> None:
    """``total`` calls, ``callers`` at a time (each wave is one ``gather``)."""
    for start in range(0, total, callers):
        await asyncio.gather(*(one(i) for i in range(start, min(start + callers, total))))


async def measure(callers: list[int], total: int, repeats: int) -> dict[int, dict[str, float]]:
    null = NullSender()
    with mock.patch.object(ServiceBusClient, "get_queue_sender", return_value=null):
        backend = aio.AzureServiceBusBackend.from_connection_string(
            CONN, profiles={"orders": PROFILE}, connection_sharing=False  # the null sender
        )
        async with backend, aio.IdempotentSender(backend, PROFILE) as sender:
            rounds = 0

            def variants(n: int) -> dict[str, Callable[[], Awaitable[None]]]:
                batch = messages(total, f"r{rounds}-{n}")

                async def ours() -> None:
                    await in_waves(n, total, lambda i: sender.send(batch[i]))

                async def bare() -> None:
                    async def one(i: int) -> None:
                        m = batch[i]
                        await null.send_messages(
                            ServiceBusMessage(m.body, message_id=m.message_id), timeout=30.0
                        )

                    await in_waves(n, total, one)

                return {"sendonce": ours, "bare gather": bare}

            await in_waves(16, 64, lambda i: sender.send(Message(BODY, message_id=f"w{i}")))
            out: dict[int, dict[str, list[float]]] = {n: {} for n in callers}
            for r in range(repeats):
                rounds = r
                for n in callers:
                    runs = variants(n)
                    names = list(runs) if r % 2 == 0 else list(reversed(runs))
                    for name in names:
                        start = time.process_time()
                        await runs[name]()
                        used = time.process_time() - start
                        out[n].setdefault(name, []).append(used / total * 1e6)
    return {n: {k: statistics.median(v) for k, v in by.items()} for n, by in out.items()}


async def profiled(callers: int, total: int) -> None:
    null = NullSender()
    with mock.patch.object(ServiceBusClient, "get_queue_sender", return_value=null):
        backend = aio.AzureServiceBusBackend.from_connection_string(
            CONN, profiles={"orders": PROFILE}, connection_sharing=False  # the null sender
        )
        async with backend, aio.IdempotentSender(backend, PROFILE) as sender:
            batch = messages(total, "p")
            await in_waves(16, 64, lambda i: sender.send(Message(BODY, message_id=f"w{i}")))
            profile = cProfile.Profile()
            profile.enable()
            await in_waves(callers, total, lambda i: sender.send(batch[i]))
            profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(30)


def compare(sources: list[str], args: argparse.Namespace) -> None:
    """Each round, every source tree in its own process (alternating order); medians."""
    runs: dict[str, dict[int, list[float]]] = {src: {} for src in sources}
    for r in range(args.repeats):
        order = sources if r % 2 == 0 else list(reversed(sources))
        for src in order:
            env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
            command = [sys.executable, __file__, "--json", "--repeats", "1"]
            command += ["--sends", str(args.sends), "--callers", *map(str, args.callers)]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            for n, by in json.loads(out.stdout).items():
                runs[src].setdefault(int(n), []).append(by["sendonce"] / by["bare gather"])
    print(f"sendonce / bare gather CPU per send, median of {args.repeats} alternating rounds")
    print(f"  {'callers':>8} " + " ".join(f"{src[-28:]:>28}" for src in sources))
    for n in args.callers:
        cells = " ".join(f"{statistics.median(runs[src][n]):>27.2f}x" for src in sources)
        print(f"  {n:>8} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--callers", type=int, nargs="+", default=[16, 400, 2000])
    parser.add_argument("--sends", type=int, default=8000, help="sends per variant and round")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", type=int, metavar="CALLERS", help="cProfile instead")
    parser.add_argument("--src", action="append", help="a source tree to compare (repeatable)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), callers=[4, 32], sends=64, repeats=1)
    if args.profile:
        asyncio.run(profiled(args.profile, args.sends))
        return
    if args.src:
        compare(args.src, args)
        return
    results = asyncio.run(measure(args.callers, args.sends, args.repeats))
    if args.json:
        print(json.dumps(results))
        return
    print(f"CPU µs per send, null transport, median of {args.repeats} alternating rounds")
    print(f"  {'callers':>8} {'sendonce':>10} {'bare gather':>12} {'ratio':>7}")
    for n, by in results.items():
        ours, bare = by["sendonce"], by["bare gather"]
        print(f"  {n:>8} {ours:>10.1f} {bare:>12.1f} {ours / bare:>6.2f}x")


if __name__ == "__main__":
    main()
