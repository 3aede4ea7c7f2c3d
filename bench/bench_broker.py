"""Benchmarks of the embedded local broker. Every figure is a ratio measured in one run.

    python bench/bench_broker.py            # full run (10M live ids; about 2-3 minutes)
    python bench/bench_broker.py --quick    # smaller sizes (1M live ids)
    python bench/bench_broker.py --smoke    # tiny sizes: runs every step, measures nothing

1. Batched accept rate of ``LocalBackend.send`` vs a raw ``sqlite3`` ``executemany``
   of the same rows into an equivalent indexed table (same columns, a unique index
   on the dedup key, same WAL/synchronous settings, same transaction per batch).
2. Accept rate with 10,000 vs 10,000,000 live ids remembered (the dedup lookup must
   be an indexed point lookup, so the ratio should stay near 1).
3. Four processes publishing at once vs one process (total messages per second).
4. Each durability mode, single sends and batches.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from _smoke import add_smoke

from sendonce import EntityProfile, Message
from sendonce.backends.local import LocalBackend

BATCH = 1000
# Per mode: messages per accept round and rounds, live ids (few, many) and messages sent
# over them, messages of the process comparison, single sends and batched messages.
SIZES = {
    "full": dict(
        accepted=100_000,
        rounds=3,
        live_small=10_000,
        live_large=10_000_000,
        live_sent=50_000,
        processes=200_000,
        singles=1_000,
        batched=50_000,
    ),
    "quick": dict(
        accepted=20_000,
        rounds=2,
        live_small=10_000,
        live_large=1_000_000,
        live_sent=20_000,
        processes=40_000,
        singles=300,
        batched=20_000,
    ),
    "smoke": dict(
        accepted=2_000,
        rounds=1,
        live_small=1_000,
        live_large=5_000,
        live_sent=1_000,
        processes=2_000,
        singles=10,
        batched=1_000,
    ),
}
BODY = b'{"order_id":123456,"amount":"12.50","currency":"EUR","customer":"c-42"}'


def messages(count: int, prefix: str) -> list[Message]:
    """Random ids (uuid4): every key lands on a random page of the id index (worst case)."""
    return [Message(BODY, message_id=f"{prefix}-{uuid.uuid4().hex}") for _ in range(count)]


def business_messages(count: int, prefix: str) -> list[Message]:
    """Increasing business ids, e.g. "{order_id}.{year}/payment": index appends (best case)."""
    return [Message(BODY, message_id=f"{prefix}{10**9 + i}.2026/payment") for i in range(count)]


def fresh(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    for suffix in ("", "-wal", "-shm", ".lock"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    return path


def timed(work: Callable[[], object]) -> float:
    """Wall-clock seconds of ``work``."""
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def timed_cpu(work: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``work``: CPU time is steadier on a shared machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def send_all(backend: LocalBackend, entity: str, batch: list[Message], size: int) -> None:
    for start in range(0, len(batch), size):
        backend.send(entity, batch[start : start + size], timeout=60)


# -- 1. accept rate vs raw executemany ---------------------------------------------------

RAW_SCHEMA = """
CREATE TABLE messages (
    qid INTEGER PRIMARY KEY, eid INTEGER NOT NULL, sub TEXT NOT NULL, seq INTEGER NOT NULL,
    message_id TEXT NOT NULL, partition_key TEXT, session_id TEXT, body BLOB NOT NULL,
    extra TEXT, enqueued INTEGER NOT NULL, scheduled INTEGER, visible INTEGER NOT NULL,
    raw BLOB
);
CREATE UNIQUE INDEX messages_key ON messages (eid, message_id, coalesce(partition_key, ''));
"""


def raw_executemany(path: str, batch: list[Message]) -> tuple[float, float]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(RAW_SCHEMA)
    now = int(time.time() * 1e6)

    def work() -> None:
        for start in range(0, len(batch), BATCH):
            rows = [
                (
                    1,
                    "",
                    start + i,
                    m.message_id,
                    m.partition_key,
                    m.session_id,
                    m.body_bytes,
                    None,
                    now,
                    None,
                    now,
                    None,
                )
                for i, m in enumerate(batch[start : start + BATCH])
            ]
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO messages (eid, sub, seq, message_id, partition_key, session_id, "
                "body, extra, enqueued, scheduled, visible, raw) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                rows,
            )
            conn.execute("COMMIT")

    wall, cpu = timed_cpu(work)
    conn.close()
    return len(batch) / wall, len(batch) / cpu


def broker_send(path: str, batch: list[Message]) -> tuple[float, float]:
    with LocalBackend(path) as backend:
        backend.create_entity(EntityProfile("orders"))
        wall, cpu = timed_cpu(lambda: send_all(backend, "orders", batch, BATCH))
    return len(batch) / wall, len(batch) / cpu


def bench_vs_raw(
    directory: str, count: int, rounds: int, make: Callable[[int, str], list[Message]]
) -> dict[str, float]:
    best = {"raw": 0.0, "broker": 0.0, "raw_cpu": 0.0, "broker_cpu": 0.0}
    for r in range(rounds):  # interleaved, best of: the machine is shared
        batch = make(count, f"r{r}")
        for name, run in (("raw", raw_executemany), ("broker", broker_send)):
            wall, cpu = run(fresh(directory, f"{name}.db"), batch)
            best[name] = max(best[name], wall)
            best[f"{name}_cpu"] = max(best[f"{name}_cpu"], cpu)
    best["ratio"] = best["broker"] / best["raw"]
    best["ratio_cpu"] = best["broker_cpu"] / best["raw_cpu"]
    return best


# -- 2. live ids ------------------------------------------------------------------------


def prefill(path: str, live: int) -> None:
    """A broker whose entity remembers ``live`` ids, inserted by one generated-series SQL."""
    with LocalBackend(path) as backend:
        backend.create_entity(EntityProfile("orders", duplicate_detection_window=timedelta(days=7)))
    stamp = int(datetime.now(UTC).timestamp() * 1e6)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n WHERE x < ?) "
        "INSERT INTO ids (eid, mid, pkey, stamp) "
        "SELECT 1, 'live-' || printf('%09d', x), '', ? FROM n",
        (live - 1, stamp),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def accept_rate(path: str, batch: list[Message]) -> tuple[float, float]:
    with LocalBackend(path) as backend:
        # Warm up (page cache) with a first slice, then measure the rest.
        send_all(backend, "orders", batch[: len(batch) // 5], BATCH)
        rest = batch[len(batch) // 5 :]
        wall, cpu = timed_cpu(lambda: send_all(backend, "orders", rest, BATCH))
    return len(rest) / wall, len(rest) / cpu


def bench_live_ids(
    directory: str, small: int, large: int, count: int, rounds: int = 3
) -> dict[str, float]:
    small_db, large_db = fresh(directory, "small.db"), fresh(directory, "large.db")
    fill_small = timed(lambda: prefill(small_db, small))
    fill_large = timed(lambda: prefill(large_db, large))
    best = {"small": 0.0, "large": 0.0, "small_cpu": 0.0, "large_cpu": 0.0}
    for r in range(rounds):
        for name, db in (("small", small_db), ("large", large_db)):
            wall, cpu = accept_rate(db, messages(count, f"{name}{r}"))
            best[name] = max(best[name], wall)
            best[f"{name}_cpu"] = max(best[f"{name}_cpu"], cpu)
    best["ratio"] = best["large"] / best["small"]
    best["ratio_cpu"] = best["large_cpu"] / best["small_cpu"]
    best["fill_small_s"] = fill_small
    best["fill_large_s"] = fill_large
    best["large_file_mb"] = os.path.getsize(large_db) / 1e6
    return best


# -- 3. four processes ------------------------------------------------------------------


def _publisher(path: str, prefix: str, count: int, ready: Any, go: Any, done: Any) -> None:
    batch = messages(count, prefix)
    with LocalBackend(path) as backend:
        ready.put(prefix)
        go.wait()
        send_all(backend, "orders", batch, BATCH)
        done.put(time.time())


def publish_with(processes: int, path: str, total: int) -> float:
    """Total msgs/s of ``processes`` publishers started together (spawned, then released)."""
    with LocalBackend(path) as backend:
        backend.create_entity(EntityProfile("orders"))
    context = multiprocessing.get_context("spawn")
    ready, done, go = context.Queue(), context.Queue(), context.Event()
    workers = [
        context.Process(
            target=_publisher, args=(path, f"p{k}", total // processes, ready, go, done)
        )
        for k in range(processes)
    ]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=120)
    start = time.time()
    go.set()
    end = max(float(done.get(timeout=600)) for _ in workers)
    for worker in workers:
        worker.join()
    return (total // processes) * processes / (end - start)


def bench_processes(directory: str, total: int) -> dict[str, float]:
    one = publish_with(1, fresh(directory, "one.db"), total)
    four = publish_with(4, fresh(directory, "four.db"), total)
    return {"one": one, "four": four, "ratio": four / one}


# -- 4. durability modes ----------------------------------------------------------------


def bench_durability(directory: str, singles: int, batched: int) -> dict[str, float]:
    out: dict[str, float] = {}
    modes: tuple[Literal["normal", "full"], ...] = ("normal", "full")
    for mode in modes:
        path = fresh(directory, f"{mode}.db")
        with LocalBackend(path, durability=mode) as backend:
            backend.create_entity(EntityProfile("orders"))
            one_by_one = messages(singles, f"{mode}1")
            out[f"{mode}_single"] = singles / timed(
                lambda b=backend, m=one_by_one: send_all(b, "orders", m, 1)  # type: ignore[misc]
            )
            many = messages(batched, f"{mode}b")
            out[f"{mode}_batch"] = batched / timed(
                lambda b=backend, m=many: send_all(b, "orders", m, BATCH)  # type: ignore[misc]
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--dir", help="where to put the broker files (default: a temp dir)")
    add_smoke(parser)
    args = parser.parse_args()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    size = SIZES[mode]
    directory = args.dir or tempfile.mkdtemp(prefix="sendonce-bench-")
    print(f"# sendonce local broker benchmark ({mode}), files in {directory}")
    print(
        f"# python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} cpus, batches of {BATCH}"
    )

    for label, make in (("random ids", messages), ("business ids", business_messages)):
        r = bench_vs_raw(directory, size["accepted"], size["rounds"], make)
        print(
            f"1. batched accept, {label}: broker {r['broker']:,.0f} msg/s, raw executemany "
            f"{r['raw']:,.0f} rows/s, ratio {r['ratio']:.2f} (target >= 0.7); per CPU second: "
            f"broker {r['broker_cpu']:,.0f}, raw {r['raw_cpu']:,.0f}, ratio {r['ratio_cpu']:.2f}"
        )

    small, large = size["live_small"], size["live_large"]
    r = bench_live_ids(directory, small, large, size["live_sent"], size["rounds"])
    print(
        f"2. live ids: {small:,}: {r['small']:,.0f} msg/s, {large:,}: {r['large']:,.0f} msg/s, "
        f"ratio {r['ratio']:.2f} (target >= 0.7), per CPU second ratio {r['ratio_cpu']:.2f}; "
        f"prefill {r['fill_large_s']:.1f} s, "
        f"file {r['large_file_mb']:,.0f} MB"
    )
    for name in ("small.db", "large.db"):
        fresh(directory, name)

    r = bench_processes(directory, size["processes"])
    print(
        f"3. processes: 1 process {r['one']:,.0f} msg/s, 4 processes {r['four']:,.0f} msg/s "
        f"total, ratio {r['ratio']:.2f}"
    )

    r = bench_durability(directory, size["singles"], size["batched"])
    print(
        f"4. durability: normal single {r['normal_single']:,.0f} msg/s, batch "
        f"{r['normal_batch']:,.0f} msg/s; full single {r['full_single']:,.0f} msg/s, batch "
        f"{r['full_batch']:,.0f} msg/s; full/normal single "
        f"{r['full_single'] / r['normal_single']:.2f}, batch "
        f"{r['full_batch'] / r['normal_batch']:.2f}"
    )


if __name__ == "__main__":
    main()
