"""What a durable send ledger costs: send_many with a ledger vs without, same broker.

N messages (default 100k) in one ``send_many`` to a fresh entity of one local broker
file, without a ledger, with a SQLite ledger, and (when PostgreSQL is installed) with a
PostgreSQL ledger on a throwaway loopback cluster. Rounds alternate; medians, and the
ratios to the run without a ledger, measured in this run. Target: SQLite ratio <= 1.3.

    python bench/bench_ledger.py [--messages 100000] [--repeats 3] [--no-postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sendonce import EntityProfile, IdempotentSender, Ledger, Message
from sendonce.backends.local import LocalBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "functional" / "ledger"))


def messages(n: int, tag: str) -> list[Message]:
    return [Message(f'{{"order_id": {i}}}', message_id=f"{tag}-{i}") for i in range(n)]


def one_run(broker: LocalBackend, entity: str, batch: list[Message], url: str | None) -> float:
    ledger = Ledger(url) if url else None
    try:
        with IdempotentSender(broker, EntityProfile(entity), ledger=ledger) as sender:
            start = time.perf_counter()
            report = sender.send_many(batch)
            elapsed = time.perf_counter() - start
        assert report.sent == len(batch), report
        return elapsed
    finally:
        if ledger is not None:
            ledger.close()


@contextlib.contextmanager
def postgres(enabled: bool) -> Iterator[str | None]:
    if not enabled:
        yield None
        return
    try:
        from pgserver import pg_bin, throwaway_cluster
    except ImportError:
        yield None
        return
    if pg_bin() is None:
        yield None
        return
    with throwaway_cluster() as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    n = args.messages
    times: dict[str, list[float]] = {"none": [], "sqlite": [], "postgres": []}
    with tempfile.TemporaryDirectory() as tmp, postgres(not args.no_postgres) as pg_url:
        root = Path(tmp)
        with LocalBackend(root / "broker.db") as broker:
            for r in range(args.repeats):
                runs: list[tuple[str, str | None]] = [
                    ("none", None),
                    ("sqlite", f"sqlite://{root / f'ledger{r}.db'}"),
                ]
                if pg_url is not None:
                    runs.append(("postgres", pg_url))
                for name, url in runs:
                    entity = f"{name}{r}"
                    times[name].append(one_run(broker, entity, messages(n, entity), url))
                    print(f"round {r} {name:9s} {times[name][-1]:.2f}s", flush=True)
    base = statistics.median(times["none"])
    print(f"\n{n} messages in one send_many, local broker, median of {args.repeats}:")
    for name, values in times.items():
        if not values:
            print(f"  {name:9s} (skipped)")
            continue
        med = statistics.median(values)
        print(f"  {name:9s} {med:6.2f}s  {n / med:9.0f} msg/s  ratio {med / base:.2f}")


if __name__ == "__main__":
    main()
