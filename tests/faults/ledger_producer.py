"""One producer incarnation of a ledger fault schedule (run as a script by the test).

``python ledger_producer.py CONFIG_JSON`` with broker, ledger url, ids, chunk size, the
fast clock (origin, speed, offset), the entity's dedup, ``in_doubt``, a seeded fault
script for ``FaultyBackend`` and an optional self-kill right after the broker committed
call k (before any ack reaches the sender: the in-doubt case). Prints one JSON line per
chunk: the ids confirmed to it (sent/duplicate) and the ids reported failed, by error type.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sendonce import EntityProfile, IdempotentSender, Ledger, Message, RetryPolicy
from sendonce.backends import LocalBackend
from sendonce.backends._base import Ack
from sendonce.testing import Fault, FaultyBackend

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FAULTS = [Fault.BEFORE_COMMIT, Fault.AFTER_COMMIT, Fault.PERMANENT]


class KillAfterCommit:
    """Passes sends through and SIGKILLs this process right after call ``at`` committed."""

    def __init__(self, inner: Any, at: int | None) -> None:
        self.inner, self.at, self.calls = inner, at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> list[Ack]:
        acks: list[Ack] = self.inner.send(entity, messages, **kw)
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGKILL)
        return acks


def main() -> None:
    cfg = json.loads(sys.argv[1])
    speed, origin = cfg["speed"], cfg["origin"]
    offset = timedelta(seconds=cfg["offset"])

    def wall() -> datetime:
        return T0 + offset + timedelta(seconds=(time.time() - origin) * speed)

    def seconds() -> float:
        return (wall() - T0).total_seconds()

    def sleep(s: float) -> None:
        time.sleep(s / speed)

    window = timedelta(seconds=cfg["window"])
    profile = EntityProfile(
        "orders", duplicate_detection=cfg["dedup"], duplicate_detection_window=window
    )
    retry = RetryPolicy(
        max_attempts=4,
        initial_backoff=0.05,
        max_backoff=0.2,
        attempt_timeout=window.total_seconds() / 4,
        safety_margin=timedelta(seconds=max(1.0, 0.4 * speed)),
        clock=seconds,
        sleep=sleep,
    )
    rng = random.Random(cfg["fault_seed"])

    def script(index: int, entity: str, messages: Sequence[Message]) -> Fault:
        if rng.random() < cfg["fault_rate"]:
            return rng.choice(FAULTS)
        return Fault.NONE

    broker = LocalBackend(cfg["broker"], clock=wall)
    backend = FaultyBackend(KillAfterCommit(broker, cfg["kill_at"]), script)
    with (
        Ledger(cfg["ledger"], clock=wall, in_doubt=cfg["in_doubt"]) as ledger,
        IdempotentSender(
            backend, profile, retry=retry, ledger=ledger, max_batch_messages=cfg["batch"]
        ) as sender,
    ):
        ids: list[int] = cfg["ids"]
        for start in range(0, len(ids), cfg["chunk"]):
            chunk = [
                Message(f"body {i}", message_id=f"id-{i}") for i in ids[start:][: cfg["chunk"]]
            ]
            report = sender.send_many(chunk)
            failed: dict[str, list[str]] = {}
            for f in report.failures:
                failed.setdefault(type(f.error).__name__, []).append(f.message_id)
            line = {"confirmed": [r.message_id for r in report.results], "failed": failed}
            print(json.dumps(line), flush=True)
    broker.close()


if __name__ == "__main__":
    main()
