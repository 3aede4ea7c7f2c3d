"""The asyncio sender against the sync sender, on the same backends.

Local broker: N single sends by the sync sender (a plain loop) vs the aio sender
over ThreadedBackend, awaited one by one and as N concurrent tasks; the ratio is
the cost of the event loop and the worker-thread hop per call.

Emulator (real azure-servicebus over a local socket): N single sends through the
sync AzureServiceBusBackend vs the aio one, sequential and as concurrent tasks.
Rounds alternate; medians are reported, as ratios measured in this run.

    python bench/bench_aio.py [--sends 1000] [--emulator-sends 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sendonce import EntityProfile, IdempotentSender, Message, aio
from sendonce.backends import AzureServiceBusBackend
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

PROFILE = EntityProfile("orders")


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


def sync_sb(conn: str, batch: list[Message]) -> float:
    with (
        AzureServiceBusBackend.from_connection_string(conn, profiles={"orders": PROFILE}) as b,
        IdempotentSender(b, PROFILE) as sender,
    ):
        sender.send(Message("warm", message_id=f"warm-{batch[0].message_id}"))  # open the link
        start = time.perf_counter()
        for m in batch:
            sender.send(m)
        return time.perf_counter() - start


async def aio_sb(conn: str, batch: list[Message], concurrent: bool) -> float:
    async with (
        aio.AzureServiceBusBackend.from_connection_string(conn, profiles={"orders": PROFILE}) as b,
        aio.IdempotentSender(b, PROFILE) as sender,
    ):
        await sender.send(Message("warm", message_id=f"warm-{batch[0].message_id}"))
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
        for name, run in runs.items():
            times[name].append(run(r))
    return {name: statistics.median(t) for name, t in times.items()}


def report(title: str, n: int, medians: dict[str, float]) -> None:
    base = medians["sync"]
    print(f"{title}: {n} single sends, median of rounds")
    for name, seconds in medians.items():
        print(
            f"  {name:<16} {seconds * 1000:8.1f} ms  {n / seconds:9.0f} sends/s  "
            f"{seconds / base:5.2f}x sync"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sends", type=int, default=1000)
    parser.add_argument("--emulator-sends", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
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

        m = args.emulator_sends
        db = root / "emulator.db"
        with LocalBackend(db) as store:
            store.create_entity(PROFILE)
        with Emulator(db, poll_interval=0.02) as emu:
            conn = emu.connection_string
            remote = rounds(
                args.repeats,
                {
                    "sync": lambda r: sync_sb(conn, messages(m, f"s{r}")),
                    "aio sequential": lambda r: asyncio.run(
                        aio_sb(conn, messages(m, f"a{r}"), False)
                    ),
                    "aio concurrent": lambda r: asyncio.run(
                        aio_sb(conn, messages(m, f"c{r}"), True)
                    ),
                },
            )
        report("emulator (azure-servicebus over a local socket)", m, remote)


if __name__ == "__main__":
    main()
