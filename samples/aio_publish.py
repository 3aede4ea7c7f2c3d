"""Publish from an event loop (as a FastAPI or aiohttp handler would), exactly once.

Fifty concurrent "requests" carry twenty orders (clients retry requests), and the
first transfer loses its acknowledgment after the broker stored it. Every order
still lands once.

Run: python samples/aio_publish.py [BROKER_FILE]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from sendonce import EntityProfile, MessageSpec, SendResult
from sendonce.aio import IdempotentSender, ThreadedBackend
from sendonce.backends.local import LocalBackend
from sendonce.testing import Fault, FaultyBackend

SPEC = MessageSpec("{order_id}/created")
ENTITY = EntityProfile("orders")


async def handle_request(sender: IdempotentSender, order: Mapping[str, object]) -> SendResult:
    """What a request handler does: build the message from the order, await the send."""
    return await sender.send(SPEC.to_message(order))


async def main(broker_file: Path) -> None:
    orders = [{"order_id": 1000 + i, "amount": 10 * i} for i in range(20)]
    requests = [orders[i % 20] for i in range(50)]  # 30 client retries among 50 requests
    # In production: sendonce.aio.connect("local:///path.db") or a Service Bus connection
    # string. Here the local broker sits behind FaultyBackend to lose one acknowledgment.
    faulty = FaultyBackend(LocalBackend(broker_file), [Fault.AFTER_COMMIT])
    async with ThreadedBackend(faulty) as backend:
        async with IdempotentSender(backend, ENTITY) as sender:
            results = await asyncio.gather(*(handle_request(sender, o) for o in requests))
        outcomes = Counter(r.outcome for r in results)
        retried = [r.message_id for r in results if r.attempts > 1]
        sent, duplicates = outcomes["sent"], outcomes["duplicate"]
        print(f"{len(results)} requests: {sent} sent, {duplicates} duplicate")
        print(f"resent after a lost acknowledgment: {', '.join(retried)}")
        stored = Counter(await backend.message_ids(ENTITY.name))
    print(f"messages in the queue: {sum(stored.values())} for {len(orders)} orders")
    assert set(stored.values()) == {1} and len(stored) == len(orders)
    print("every order exactly once")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(Path(sys.argv[1])))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(main(Path(tmp) / "broker.db"))
