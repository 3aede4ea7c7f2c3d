"""One producer incarnation of a ledger fault schedule (run as a script by the test).

``python ledger_producer.py CONFIG_JSON`` with broker, ledger url, ids, chunk size, the
fast clock (origin, speed, offset), the entity's dedup, ``in_doubt``, a seeded fault
script for ``FaultyBackend`` and an optional self-kill right after the broker committed
call k (before any ack reaches the sender: the in-doubt case). Prints one JSON line per
chunk: the ids confirmed to it (sent/duplicate) and the ids reported failed, by error type.

``sigint_at_write`` (n) sends SIGINT to the producer's main thread as soon as intent write
n has committed (from the ledger's worker thread: later transfers' intents are then written
ahead of their attempts). The producer catches ``KeyboardInterrupt``, prints one line
``{"interrupted": ..., "leftover": [...]}`` naming every intent this incarnation wrote and
left unconfirmed although it never attempted the id (there must be none), and exits 130.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sendonce import EntityProfile, IdempotentSender, Ledger, Message, RetryPolicy
from sendonce.backends import LocalBackend
from sendonce.backends._base import Ack
from sendonce.ledger import Key
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


class Attempts:
    """Passes sends through and records every id this process attempted (before the send)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ids: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> list[Ack]:
        self.ids.update(m.message_id for m in messages)
        acks: list[Ack] = self.inner.send(entity, messages, **kw)
        return acks


class InterruptAfterWrite:
    """A ledger store that SIGINTs the main thread once intent write ``at`` committed."""

    def __init__(self, inner: Any, at: int | None) -> None:
        self.inner, self.at, self.writes = inner, at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def record_intents(self, *args: Any, **kw: Any) -> Any:
        rows = self.inner.record_intents(*args, **kw)
        self.writes += 1
        if self.writes == self.at:
            main = threading.main_thread().ident
            assert main is not None
            signal.pthread_kill(main, signal.SIGINT)
        return rows


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
    # Attempts outside the faults: an attempt the script fails is an attempt all the same
    attempts = Attempts(FaultyBackend(KillAfterCommit(broker, cfg["kill_at"]), script))
    backend = attempts
    began = wall()
    with Ledger(cfg["ledger"], clock=wall, in_doubt=cfg["in_doubt"]) as plain:
        store = InterruptAfterWrite(plain.store, cfg.get("sigint_at_write"))
        ledger = Ledger(store, clock=wall, in_doubt=cfg["in_doubt"])  # type: ignore[arg-type]
        sender = IdempotentSender(
            backend,
            profile,
            retry=retry,
            ledger=ledger,
            max_batch_messages=cfg["batch"],
            max_in_flight=cfg.get("max_in_flight", 1),
        )
        ids: list[int] = cfg["ids"]
        try:
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
        except KeyboardInterrupt:
            rows = plain.store.lookup("orders", [Key(f"id-{i}", "") for i in ids])
            leftover = sorted(
                k.message_id
                for k, row in rows.items()
                if row.confirmed_at is None
                and row.first_attempt >= began
                and k.message_id not in attempts.ids
            )
            print(json.dumps({"interrupted": True, "leftover": leftover}), flush=True)
            sender.close()
            broker.close()
            sys.exit(130)
        sender.close()
    broker.close()


if __name__ == "__main__":
    main()
