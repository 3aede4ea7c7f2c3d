"""Client-side cost of the Service Bus backend, measured against the bare client in one run.

    python bench/bench_servicebus.py            # 5,000 messages per round, 7 rounds
    python bench/bench_servicebus.py --quick    # 2,000 messages, 3 rounds
    python bench/bench_servicebus.py --smoke    # 50 messages, 1 round: runs, measures nothing

1. Conversion: ``Message`` -> ``to_servicebus_message`` (with its id check) vs building
   ``ServiceBusMessage`` directly with the same fields.
2. One transfer: ``AzureServiceBusBackend.send`` on a link that accepts at once (the
   client's ``send_messages`` replaced, so no network) vs ``create_message_batch`` +
   ``add_message`` + ``send_messages`` by hand on the same stub.

Rounds alternate between the two sides; the figure is the median ratio of CPU times
(process_time: the machine is shared, wall time is noisy). Network time,
which dominates a real send, is the emulator benchmark's subject (bench_emulator.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

from _smoke import add_smoke
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusMessageBatch

from sendonce import Message
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.backends.servicebus._convert import to_servicebus_message

BODY = '{"order_id":123456,"amount":"12.50","currency":"EUR","customer":"c-42"}'
CONN = "Endpoint=sb://bench.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=not-a-key"
BATCH = 100


def timed(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def stub_sender() -> Any:
    sender = mock.MagicMock()
    sender.create_message_batch.side_effect = lambda max_size_in_bytes=None: ServiceBusMessageBatch(
        max_size_in_bytes=max_size_in_bytes or 256 * 1024
    )
    sender.send_messages.return_value = None
    return sender


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    add_smoke(parser)
    args = parser.parse_args()
    count, rounds = (50, 1) if args.smoke else (2_000, 3) if args.quick else (5_000, 7)

    messages = [
        Message(BODY, message_id=f"order-{i}.2026/payment", partition_key=f"c-{i % 50}")
        for i in range(count)
    ]

    def raw_convert() -> None:
        for m in messages:
            ServiceBusMessage(m.body, message_id=m.message_id, partition_key=m.partition_key)

    def ours_convert() -> None:
        for m in messages:
            to_servicebus_message(m)

    transfers = [messages[i : i + BATCH] for i in range(0, count, BATCH)]
    sender = stub_sender()

    def raw_send() -> None:
        for group in transfers:
            batch = sender.create_message_batch()
            for m in group:
                batch.add_message(
                    ServiceBusMessage(
                        m.body, message_id=m.message_id, partition_key=m.partition_key
                    )
                )
            sender.send_messages(batch, timeout=30.0)

    with mock.patch.object(ServiceBusClient, "get_queue_sender", return_value=stub_sender()):
        backend = AzureServiceBusBackend.from_connection_string(CONN, connection_sharing=False)

        def ours_send() -> None:
            for group in transfers:
                backend.send("orders", group, timeout=30.0)

        results: dict[str, list[float]] = {"convert": [], "send": []}
        for _ in range(rounds):
            raw_c, ours_c = timed(raw_convert), timed(ours_convert)
            raw_s, ours_s = timed(raw_send), timed(ours_send)
            results["convert"].append(ours_c / raw_c)
            results["send"].append(ours_s / raw_s)
            rate = count / ours_s
            per_message = ours_c / count * 1e6
        backend.close()

    print(f"{count} messages x {rounds} rounds, transfers of {BATCH}")
    print(f"conversion  sendonce/raw time ratio: {statistics.median(results['convert']):.3f}")
    print(f"one-transfer send sendonce/raw ratio: {statistics.median(results['send']):.3f}")
    print(f"conversion cost: {per_message:.1f} us CPU per message")
    print(f"sendonce send path, no network: {rate:,.0f} messages per CPU second")


if __name__ == "__main__":
    main()
