"""The memory and the first-transfer latency of ``send_many`` over a generator.

Three figures (docs/benchmarks.md, "Streaming send_many"):

- peak RSS of one process that sends N generated messages (~40-byte bodies) to the local
  broker with ``IdempotentSender.send_many(generator)``, ``memory_size=100_000`` so the
  id memory is the same size in every run: N small vs N big (default 200k vs 2M), and
  their ratio (target <= 1.3x: the call holds a bounded buffer, not its input);
- what the id memory costs per id at its default size (1M ids), from ``tracemalloc``;
- the time from the call to the first transfer handed to the backend, for generators of
  several lengths, with and without a SQLite ledger, sync and aio (target <= 50 ms,
  whatever the length).

Each RSS run is a fresh interpreter (``--child``), its peak read from /proc (VmHWM).

    python bench/bench_sender_memory.py [--small 200000] [--big 2000000] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce._sender_core import DEFAULT_MEMORY_SIZE, _IdMemory
from sendonce.aio import IdempotentSender as AsyncSender
from sendonce.aio import ThreadedBackend
from sendonce.backends import LocalBackend

PROFILE = EntityProfile("orders")
NO_DEDUP = EntityProfile("audit", duplicate_detection=False, partitioned=True)


def rows(n: int, keyed: bool = False) -> Iterator[Message]:
    for i in range(n):
        yield Message(
            f'{{"order_id": {i}, "amount": "{i % 997}.00"}}',
            message_id=f"{i}.2017/payment",
            partition_key=f"k{i % 16}" if keyed else None,
        )


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def sqlite_heap_mib() -> float | None:
    """The high-water mark of SQLite's own heap in this process (the local broker's page
    cache grows with its file), in MiB; None where the library cannot be asked."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.sqlite3_memory_highwater.restype = ctypes.c_int64
        return float(lib.sqlite3_memory_highwater(0)) / 2**20
    except (OSError, AttributeError):
        return None


def child(n: int, directory: str) -> None:
    """One measured run: send ``n`` generated messages, print the peak RSS as JSON."""
    with LocalBackend(Path(directory) / f"rss-{n}.db", durability="normal") as backend:
        backend.create_entity(PROFILE, exist_ok=True)
        sender = IdempotentSender(backend, PROFILE, memory_size=100_000)
        report = sender.send_many(rows(n))
        assert (report.sent, report.failed) == (n, 0), report
        print(json.dumps({"n": n, "peak_mib": peak_rss_mib(), "sqlite_mib": sqlite_heap_mib()}))


def measure_rss(n: int, directory: str) -> tuple[float, float | None]:
    script = Path(__file__).resolve()
    out = subprocess.run(
        [sys.executable, str(script), "--child", str(n), "--dir", directory],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    return float(figures["peak_mib"]), figures["sqlite_mib"]


def id_memory_cost(count: int) -> float:
    """Bytes per id the id memory holds at ``count`` ids (the ids' strings included: the
    memory keeps them alive once the messages are gone)."""
    gc.collect()
    tracemalloc.start()
    memory = _IdMemory(None, count)
    base = tracemalloc.get_traced_memory()[0]
    step = 10_000
    for start in range(0, count, step):
        seen: dict[object, int] = {}
        for i in range(start, min(start + step, count)):
            message = Message(f'{{"order_id": {i}}}', message_id=f"{i}.2017/payment")
            seen[message.message_id] = message._body_hash
        memory.add(seen, 0.0)
        del seen, message
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(memory.entries) == count
    return used / count


class Timed(LocalBackend):
    """The local broker, noting when the first transfer reaches it."""

    first: float | None = None

    def send(self, entity: str, messages: Any, *, timeout: float, atomic: bool = False) -> Any:
        if self.first is None:
            self.first = time.perf_counter()
        return super().send(entity, messages, timeout=timeout, atomic=atomic)


def until_first(backend: Timed, n: int, keyed: bool) -> Iterator[Message]:
    """``n`` rows, or fewer: the input ends once the first transfer has left (the figure
    is taken; a call that reads its whole input first reads all ``n``)."""
    for message in rows(n, keyed):
        if backend.first is not None:
            return
        yield message


def first_transfer_ms(directory: Path, n: int, ledger: bool, aio: bool) -> float:
    """Milliseconds from the call over an ``n``-row generator to its first transfer."""
    tag = f"{n}-{int(ledger)}-{int(aio)}"
    url = f"sqlite://{directory / f'ledger-{tag}.db'}" if ledger else None
    profile = NO_DEDUP if ledger else PROFILE
    backend = Timed(directory / f"first-{tag}.db", durability="normal")
    backend.create_entity(profile, exist_ok=True)
    keyed = profile.partitioned
    try:
        if aio:

            async def run() -> float:
                async with AsyncSender(
                    ThreadedBackend(backend), profile, ledger=url, max_in_flight=16
                ) as sender:
                    start = time.perf_counter()
                    await sender.send_many(until_first(backend, n, keyed))
                    return start

            start = asyncio.run(run())
        else:
            with IdempotentSender(backend, profile, ledger=url) as sender:
                start = time.perf_counter()
                sender.send_many(until_first(backend, n, keyed))
    finally:
        backend.close()
    assert backend.first is not None
    return (backend.first - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", type=int, default=200_000)
    parser.add_argument("--big", type=int, default=2_000_000)
    parser.add_argument("--ids", type=int, default=DEFAULT_MEMORY_SIZE)
    parser.add_argument("--lengths", default="20000,200000,1000000")
    parser.add_argument("--parts", default="rss,ids,first", help="rss, ids, first")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), small=2000, big=6000, ids=20_000, lengths="3000")
    if args.child is not None:
        child(args.child, args.dir)
        return
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        if "rss" in parts:
            (small, small_db), (big, big_db) = (
                measure_rss(args.small, tmp),
                measure_rss(args.big, tmp),
            )
            print("peak RSS, send_many over a generator to the local broker, memory_size=100_000:")
            for n, peak, db in ((args.small, small, small_db), (args.big, big, big_db)):
                print(f"  {n:>9,} messages: {peak:7.1f} MiB (SQLite's own heap: {db or 0:.1f} MiB)")
            print(f"  ratio, {args.big // args.small}x the input: {big / small:.2f}x")
            if small_db is not None and big_db is not None:
                mine = (big - big_db) / (small - small_db)
                print(f"  ratio without SQLite's heap (the sender's share): {mine:.2f}x")
        if "ids" in parts:
            cost = id_memory_cost(args.ids)
            print(f"id memory at {args.ids:,} ids: {cost:.0f} bytes per id")
        if "first" in parts:
            print("first transfer after the call (ms; target <= 50):")
            for n in [int(x) for x in args.lengths.split(",")]:
                for aio in (False, True):
                    for ledger in (False, True):
                        ms = first_transfer_ms(Path(tmp), n, ledger, aio)
                        what = f"{'aio ' if aio else 'sync'} {'ledger' if ledger else 'no ledger'}"
                        print(f"  {n:>9,} messages, {what:<16}: {ms:6.1f}")


if __name__ == "__main__":
    main()
