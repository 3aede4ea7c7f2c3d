"""How long an asyncio ``send_many`` over a big generator keeps the event loop from other tasks.

A probe task wakes every 10 ms (``await asyncio.sleep(0.01)``) and records the longest gap
between two wakeups while ``sendonce.aio.IdempotentSender.send_many`` sends a generator of
small messages to the local broker (a SQLite file). Also printed: how many rows the
generator had yielded when the probe first ran during the call (a loop that plans the whole
input first lets nothing run before all of it is read), and the call's wall time. One run
per case, on whatever the machine is doing: note ``uptime``'s load beside the figures.

    python bench/bench_aio_stall.py [--rows 200000] [--cases dedup dedup+ledger ...] [--no-gc]

``--no-gc`` turns CPython's cyclic garbage collector off for the run: what is left is the
call's own work (a full collection walks every message the call holds, all of them at
once since every message is validated before any is sent).

``PYTHONPATH=OTHER/src python bench/bench_aio_stall.py`` measures another source tree.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, Message
from sendonce.aio import IdempotentSender

CASES = {
    # name: (duplicate detection, partitioned, ledger)
    "dedup": (True, False, False),
    "dedup+ledger": (True, False, True),
    "nodedup": (False, False, False),
    "nodedup+ledger": (False, False, True),
    "nodedup-partitioned+ledger": (False, True, True),
    # one message per transfer (the service refuses batches there): minutes at 200k rows
    "partitioned": (True, True, False),
    "partitioned+ledger": (True, True, True),
}
DEFAULT_CASES = [case for case in CASES if not case.startswith("partitioned")]


async def probe_one(
    directory: Path, case: str, rows: int, in_flight: int
) -> tuple[float, int, float]:
    """(longest gap between the probe's wakeups in s, rows yielded at its first wakeup,
    the call's wall time in s)."""
    dedup, partitioned, with_ledger = CASES[case]
    profile = EntityProfile(
        f"stall-{case.replace('+', '-')}", duplicate_detection=dedup, partitioned=partitioned
    )
    ledger = f"sqlite://{directory / (case + '.ledger.db')}" if with_ledger else None
    yielded = [0]

    def generate() -> Iterator[Message]:
        for i in range(rows):
            yielded[0] += 1
            yield Message(f'{{"row": {i}}}', message_id=f"row-{i}")

    longest, first_seen = 0.0, -1
    async with IdempotentSender(
        f"local:{directory / 'broker.db'}",
        profile,
        ledger=ledger,
        max_in_flight=in_flight,
        require_duplicate_detection=False,
    ) as sender:
        call = asyncio.ensure_future(sender.send_many(generate()))
        began = last = time.perf_counter()
        while not call.done():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now
            if first_seen < 0:
                first_seen = yielded[0]
        report = await call
        took = time.perf_counter() - began
    assert report.sent == rows, (report.sent, report.failed)
    return longest, first_seen, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=DEFAULT_CASES)
    parser.add_argument("--in-flight", type=int, default=16, help="the sender's max_in_flight")
    parser.add_argument("--no-gc", action="store_true", help="cyclic garbage collector off")
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), rows=300)
    if args.no_gc:
        gc.disable()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    collector = "off" if args.no_gc else "on"
    print(
        f"send_many over a generator of {args.rows} rows, local broker; gc {collector}; load {load}"
    )
    print(f"  {'case':<28} {'longest stall':>14} {'rows read at first wakeup':>26} {'call':>8}")
    with tempfile.TemporaryDirectory() as directory:
        for case in args.cases:
            longest, first, took = asyncio.run(
                probe_one(Path(directory), case, args.rows, args.in_flight)
            )
            print(f"  {case:<28} {longest:>13.2f}s {first:>26} {took:>7.1f}s")


if __name__ == "__main__":
    main()
