"""A producer that streams a generator through a ledger and SIGKILLs itself at a named
moment of the bounded buffer (tests/functional/ledger/test_ledger_streaming.py).

Run as ``python stream_producer.py BROKER_DB LEDGER_URL COUNT MOMENT N``; ``MOMENT`` is

- ``none``: no kill; prints the report's counts as JSON;
- ``buffer-full``: inside the ``N``-th transfer, after the broker stored it (the input
  waits on the full buffer; the transfer's keys are unconfirmed);
- ``before-store``: inside the ``N``-th transfer, before the broker stored anything;
- ``chunk-boundary``: when the generator is asked for the first message of chunk ``N``
  (every chunk before is sent and confirmed);
- ``ledger-stage``: just after the ``N``-th intent write of the call is durable (mid-chunk:
  intents written, their transfers not started).

The entity has no duplicate detection, so only the ledger stands between a re-run and a
duplicate. Chunks are small (``FIRST_CHUNK`` 8, a 64 KiB buffer) so a few hundred
messages make many chunks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import sendonce._buffer
from sendonce import EntityProfile, IdempotentSender, Ledger, Message, RetryPolicy
from sendonce.backends import LocalBackend

PROFILE = EntityProfile("orders", duplicate_detection=False)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Killing(LocalBackend):
    """The local broker, killing the process inside its ``n``-th transfer."""

    def __init__(self, path: str, moment: str, n: int) -> None:
        super().__init__(path)
        self.moment, self.n, self.transfers = moment, n, 0

    def send(self, entity: str, messages: Sequence[Message], **kwargs: Any) -> Any:
        self.transfers += 1
        if self.moment == "before-store" and self.transfers == self.n:
            die()
        acks = super().send(entity, messages, **kwargs)
        if self.moment == "buffer-full" and self.transfers == self.n:
            die()
        return acks


TAKEN = [0, 0]  # chunks taken so far, messages in them


def count_takes() -> None:
    """Note each chunk the sender takes from its buffer (to find a chunk's boundary)."""
    take = sendonce._buffer.Chunks.take

    def taken(self: sendonce._buffer.Chunks) -> tuple[list[Message], int]:
        chunk, base = take(self)
        TAKEN[0] += 1
        TAKEN[1] = base + len(chunk)
        return chunk, base

    sendonce._buffer.Chunks.take = taken  # type: ignore[method-assign]


def rows(count: int, moment: str, n: int) -> Iterator[Message]:
    for i in range(count):
        # Asked for the first message of chunk n: the n chunks before are sent and
        # confirmed, and this one is not read yet.
        if moment == "chunk-boundary" and TAKEN[0] == n and i == TAKEN[1]:
            die()
        yield Message(f"order {i} paid", message_id=f"{i}.2017/payment")


def main() -> None:
    db, url, count, moment, n = sys.argv[1:6]
    sendonce._buffer.FIRST_CHUNK = 8
    count_takes()
    kill_at = int(n)
    with Ledger(url) as ledger:
        if moment == "ledger-stage":
            prepare, writes = ledger._prepare, [0]

            def prepared(*args: Any, **kwargs: Any) -> Any:
                result = prepare(*args, **kwargs)
                writes[0] += 1
                if writes[0] == kill_at:
                    die()
                return result

            ledger._prepare = prepared  # type: ignore[method-assign]
        with (
            Killing(db, moment, kill_at) as backend,
            IdempotentSender(
                backend,
                PROFILE,
                retry=RetryPolicy(max_attempts=1),
                ledger=ledger,
                max_batch_messages=5,
                max_buffer_bytes=64 * 1024,
            ) as sender,
        ):
            report = sender.send_many(rows(int(count), moment, kill_at))
    print(
        json.dumps(
            {
                "sent": report.sent,
                "duplicates": report.duplicates,
                "from_ledger": len(report.from_ledger),
                "in_doubt": report.in_doubt,
                "failed": report.failed,
                "total": report.total,
                "ids": [r.message_id for r in report.results]
                + [f.message_id for f in report.failures],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
