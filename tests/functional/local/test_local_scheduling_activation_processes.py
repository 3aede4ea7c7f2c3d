"""Processes sharing one broker file activate each scheduled message exactly once.

Activation is a store operation triggered by whoever comes first (a receive, a send,
accepting a session): two processes racing on the same due messages must neither
deliver one twice nor lose one, and each gets one new sequence number.
"""

from __future__ import annotations

import multiprocessing
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sendonce import EntityProfile, Message
from sendonce.backends.local import LocalBackend

SCHEDULED = 200
PLACES = (("orders", None), ("events", "a"))


def race(db: str, until: float, fillers: bool) -> dict[str, list[tuple[str, int]]]:
    """Runs in a spawned process: receives from every place until ``until`` (epoch s)."""
    got: dict[str, list[tuple[str, int]]] = {entity: [] for entity, _ in PLACES}
    n = 0
    with LocalBackend(db) as backend:
        while time.time() < until:
            for entity, sub in PLACES:
                if fillers:  # a send activates too, before taking its own numbers
                    n += 1
                    backend.send(entity, [Message("f", message_id=f"filler-{n}")], timeout=30)
                for m in backend.receive(entity, subscription=sub, max_messages=50):
                    got[entity].append((m.message_id, m.sequence_number))
            time.sleep(0.005)
    return got


def test_two_processes_activate_each_scheduled_message_exactly_once(tmp_path: Path) -> None:
    db = str(tmp_path / "broker.db")
    at = datetime.now(UTC) + timedelta(seconds=1.5)
    scheduled_numbers: dict[str, set[int]] = {}
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
        broker.create_entity(EntityProfile("events", kind="topic"))
        broker.create_subscription("events", "a")
        for entity, _ in PLACES:
            messages = [Message("s", message_id=f"s-{i}") for i in range(SCHEDULED)]
            acks = broker.schedule(entity, messages, at, timeout=30)
            scheduled_numbers[entity] = {a.sequence_number or 0 for a in acks}
    until = at.timestamp() + 2.5
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        results = pool.starmap(race, [(db, until, False), (db, until, True)])
    with LocalBackend(db) as broker:
        for entity, sub in PLACES:
            received = results[0][entity] + results[1][entity]
            # Whatever the race left unreceived is still there, once.
            received += [
                (m.message_id, m.sequence_number)
                for m in broker.receive(entity, subscription=sub, max_messages=100_000)
            ]
            ids = [mid for mid, _ in received if mid.startswith("s-")]
            assert sorted(ids) == sorted(f"s-{i}" for i in range(SCHEDULED)), entity
            numbers = [seq for _, seq in received]
            assert len(set(numbers)) == len(numbers), entity
            activated = {seq for mid, seq in received if mid.startswith("s-")}
            assert not activated & scheduled_numbers[entity], entity
            assert broker.peek(entity, subscription=sub) == []
        assert broker.peek("events") == []  # nothing left waiting on the topic
