"""Publish orders exactly once to an Azure Service Bus queue (or the emulator).

Run:
    export SERVICEBUS_CONNECTION_STRING='Endpoint=sb://<namespace>.servicebus.windows.net/;SharedAccessKeyName=<name>;SharedAccessKey=<key>'
    export SERVICEBUS_QUEUE=orders
    python samples/servicebus_publish.py

The queue must have duplicate detection on (Standard or Premium tier). With a
key that may not read entity properties, or with the development emulator
(``UseDevelopmentEmulator=true``), the sample says which profile it assumes.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta
from decimal import Decimal

from sendonce import EntityProfile, IdempotentSender, MessageSpec, RetryPolicy
from sendonce.backends import AzureServiceBusBackend
from sendonce.errors import ConfigurationError, SendOnceError

ORDERS = [
    {"order_id": 12345, "year": 2017, "customer": "c-42", "amount": Decimal("99.90")},
    {"order_id": 12346, "year": 2017, "customer": "c-7", "amount": Decimal("15.00")},
    {"order_id": 12347, "year": 2017, "customer": "c-42", "amount": Decimal("7.25")},
]

USAGE = """\
servicebus_publish: set SERVICEBUS_CONNECTION_STRING (and SERVICEBUS_QUEUE) to run it.

  export SERVICEBUS_CONNECTION_STRING='Endpoint=sb://<namespace>.servicebus.windows.net/;SharedAccessKeyName=<name>;SharedAccessKey=<key>'
  export SERVICEBUS_QUEUE=orders          # a queue with duplicate detection on
  python samples/servicebus_publish.py

For the local emulator: run `sendonce emulator --db broker.db --port 5672`, then
  export SERVICEBUS_CONNECTION_STRING='Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true'
See docs/servicebus.md.
"""


def main() -> int:
    conn_str = os.environ.get("SERVICEBUS_CONNECTION_STRING", "").strip()
    queue = os.environ.get("SERVICEBUS_QUEUE", "").strip()
    if not conn_str or not queue:
        print(USAGE)
        return 0
    logging.basicConfig(level=logging.WARNING)
    # The id names the business event (order 12345 of 2017, its payment): a resend,
    # from this run or a restarted one, carries the same id and the broker drops it.
    spec = MessageSpec("{order_id}.{year}/payment", partition_key="{customer}")
    retry = RetryPolicy(max_attempts=5, attempt_timeout=20.0)
    try:
        with AzureServiceBusBackend.from_connection_string(conn_str) as backend:
            print(f"publishing {len(ORDERS)} orders to {queue!r} on {backend!r}")
            try:
                entity: EntityProfile | str = backend.describe(queue)
            except ConfigurationError as exc:
                entity = EntityProfile(queue, duplicate_detection_window=timedelta(minutes=10))
                print(f"note: {exc.message.split(';')[0]}.")
                print("      Assuming duplicate detection on, with a 10-minute window.")
            with IdempotentSender(backend, entity, retry=retry) as sender:
                first = sender.send_many(spec.to_message(order) for order in ORDERS)
                for result in first.results:
                    print(f"  {result.message_id}: {result.outcome} ({result.attempts} attempt(s))")
                print(f"first run: sent {first.sent}, failed {first.failed}")
                first.raise_for_failures()
                # A blind resend (as a restarted producer would do): same ids, so Service Bus
                # accepts and drops each copy without telling the sender. Each order is
                # stored once.
                again = sender.send_many(spec.to_message(order) for order in ORDERS)
                print(
                    f"resend:    sent {again.sent}, failed {again.failed} (dropped as duplicates)"
                )
                again.raise_for_failures()
    except SendOnceError as exc:  # sendonce errors are redacted: no key is ever printed
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
