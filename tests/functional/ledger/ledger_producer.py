"""A producer process for ledger crash tests: sends orders through a ledger, chunk by chunk.

Run as ``python ledger_producer.py BROKER_DB LEDGER_URL COUNT CHUNK OFFSET_S DEDUP``; both the
broker's and the ledger's clock run OFFSET_S seconds ahead of real time (a re-run "days
later"). It keeps no checkpoint: the ledger is what makes a restart skip what was sent.
Prints ``progress N`` after each chunk and a final JSON summary.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta

from sendonce import EntityProfile, IdempotentSender, Ledger, Message, RetryPolicy
from sendonce.backends import LocalBackend

WINDOW = timedelta(minutes=10)


def main() -> None:
    db, url, count, chunk, offset, dedup = sys.argv[1:7]
    shift = timedelta(seconds=float(offset))

    def clock() -> datetime:
        return datetime.now(UTC) + shift

    profile = EntityProfile(
        "orders", duplicate_detection=dedup == "1", duplicate_detection_window=WINDOW
    )
    retry = RetryPolicy(initial_backoff=0.01, max_backoff=0.1)
    summary = {"sent": 0, "from_ledger": 0, "in_doubt": [], "failed": 0}
    with (
        LocalBackend(db, clock=clock) as backend,
        Ledger(url, clock=clock) as ledger,
        IdempotentSender(
            backend, profile, retry=retry, ledger=ledger, max_batch_messages=50
        ) as sender,
    ):
        total, size = int(count), int(chunk)
        for first in range(0, total, size):
            messages = [
                Message(f"order {i} paid", message_id=f"{i}.2017/payment")
                for i in range(first, min(first + size, total))
            ]
            report = sender.send_many(messages)
            summary["sent"] += report.sent
            summary["from_ledger"] += len(report.from_ledger)
            summary["in_doubt"] += report.in_doubt  # type: ignore[operator]
            summary["failed"] += report.failed
            print(f"progress {first + len(messages)}", flush=True)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
