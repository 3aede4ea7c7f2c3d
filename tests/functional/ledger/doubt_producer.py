"""A producer for the doubt-bound tests: one ``send_many`` of COUNT rows through a ledger.

Run as ``python doubt_producer.py BROKER_DB LEDGER_URL COUNT MAX_IN_FLIGHT MODE DEDUP
[ACK_DELAY]`` (MODE ``sync`` or ``aio``, DEDUP ``1`` or ``0``; ACK_DELAY seconds each
transfer's ack comes late, after it is stored: ``FaultyBackend``'s slow ack). The
entity is partitioned, rows spread over 7 partition keys, transfers of at most 50
messages, several of them in flight.
Prints ``sending`` once the call starts and a JSON summary at the end; Ctrl-C (SIGINT)
prints ``interrupted`` and exits 130. A SIGKILL leaves what it leaves: that is the point.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator

from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy, SendReport
from sendonce.aio import IdempotentSender as AsyncSender
from sendonce.aio import ThreadedBackend
from sendonce.backends import LocalBackend
from sendonce.testing import Fault, FaultyBackend


def rows(count: int) -> Iterator[Message]:
    for i in range(count):
        yield Message(f'{{"row": {i}}}', message_id=f"row-{i}", partition_key=f"k{i % 7}")


def summary(report: SendReport) -> str:
    return json.dumps(
        {
            "sent": report.sent,
            "in_doubt": report.in_doubt,
            "failed": report.failed,
            "from_ledger": len(report.from_ledger),
        }
    )


def main() -> None:
    db, url, count, in_flight, mode, dedup = sys.argv[1:7]
    delay = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
    broker = LocalBackend(db)
    backend = (
        FaultyBackend(broker, lambda *_: Fault.SLOW_ACK, slow_ack_delay=delay) if delay else broker
    )
    profile = EntityProfile("audit", partitioned=True, duplicate_detection=dedup == "1")
    options = {
        "retry": RetryPolicy(initial_backoff=0.01, max_backoff=0.1),
        "ledger": url,
        "max_batch_messages": 50,
        "max_in_flight": int(in_flight),
    }
    print("sending", flush=True)
    try:
        if mode == "sync":
            with IdempotentSender(backend, profile, **options) as sender:  # type: ignore[arg-type]
                report = sender.send_many(rows(int(count)))
        else:

            async def run() -> SendReport:
                async with (
                    ThreadedBackend(backend) as threaded,
                    AsyncSender(threaded, profile, **options) as sender,  # type: ignore[arg-type]
                ):
                    return await sender.send_many(rows(int(count)))

            report = asyncio.run(run())
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print(summary(report), flush=True)


if __name__ == "__main__":
    main()
