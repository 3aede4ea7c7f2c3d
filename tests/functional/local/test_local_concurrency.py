"""Many processes publishing into one broker file at once."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend

PROCESSES = 4
PER_PROCESS = 50_000
DISTINCT = PROCESSES * PER_PROCESS // 2


def ids_of(worker: int) -> range:
    # Worker k sends [25k*k, 25k*k + 50k): its second half is the next worker's first half
    # (ring: the last worker wraps around onto the first).
    start = worker * PER_PROCESS // 2
    return range(start, start + PER_PROCESS)


def publish(db: str, worker: int) -> dict[str, object]:
    """Runs in a spawned process: the real sender over a backend of its own."""
    from sendonce import IdempotentSender, Message

    messages = [
        Message(f"body {i % DISTINCT}", message_id=f"order-{i % DISTINCT}") for i in ids_of(worker)
    ]
    errors: list[str] = []
    sent = duplicates = 0
    with LocalBackend(db) as backend, IdempotentSender(backend, "orders") as sender:
        for start in range(0, len(messages), 5_000):
            report = sender.send_many(messages[start : start + 5_000])
            sent += report.sent
            duplicates += report.duplicates
            errors += [f"{f.message_id}: {f.error!r}" for f in report.failures]
    return {"sent": sent, "duplicates": duplicates, "errors": errors}


def test_four_processes_publish_overlapping_ids_exactly_once(tmp_path: Path):
    db = str(tmp_path / "broker.db")
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        results = pool.starmap(publish, [(db, k) for k in range(PROCESSES)])
    for result in results:
        assert result["errors"] == []
        assert result["sent"] + result["duplicates"] == PER_PROCESS  # type: ignore[operator]
    assert sum(r["sent"] for r in results) >= DISTINCT  # type: ignore[misc]
    with LocalBackend(db) as broker:
        stored = broker.message_ids("orders")
    assert len(stored) == DISTINCT
    assert set(stored) == {f"order-{i}" for i in range(DISTINCT)}
