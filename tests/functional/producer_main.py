"""A producer process for crash tests: publishes orders, checkpointing after each chunk.

Run as ``python producer_main.py DB CHECKPOINT COUNT CHUNK``; it resumes from the
checkpoint, so after a SIGKILL a restart republishes at most the chunk in flight.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sendonce import EntityProfile, IdempotentSender, MessageSpec, RetryPolicy
from sendonce.backends import LocalBackend


def main() -> None:
    db, checkpoint, count, chunk = (
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    spec = MessageSpec("{order_id}.{year}/payment", body="body")
    start = int(checkpoint.read_text()) if checkpoint.exists() else 0
    retry = RetryPolicy(initial_backoff=0.01, max_backoff=0.1)
    with (
        LocalBackend(db) as backend,
        IdempotentSender(backend, EntityProfile("orders"), retry=retry) as sender,
    ):
        for first in range(start, count, chunk):
            records = [
                {"order_id": i, "year": 2017, "body": f"order {i} paid"}
                for i in range(first, min(first + chunk, count))
            ]
            sender.send_many(spec.to_message(r) for r in records).raise_for_failures()
            print(f"committed {first + len(records)}", flush=True)
            tmp = checkpoint.with_suffix(".tmp")
            tmp.write_text(str(first + len(records)))
            tmp.replace(checkpoint)  # atomic: a kill never leaves a torn checkpoint
    print("done", flush=True)


if __name__ == "__main__":
    main()
