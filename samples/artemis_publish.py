"""Publish orders exactly once to Red Hat AMQ Broker / Apache ActiveMQ Artemis.

Run:
    pip install "sendonce[artemis]"
    export ARTEMIS_URL='amqp://app:secret@broker.example:5672'   # amqps://... for TLS
    export ARTEMIS_ADDRESS=orders
    python samples/artemis_publish.py

Artemis drops a message whose ``_AMQ_DUPL_ID`` it still holds in the address's id cache
(the last ``id-cache-size`` ids, 20,000 by default). The sample reads the address's
settings through the broker's management; where the user may not read them, or the
address does not exist yet (the first send creates it), it declares the default cache.
Running it twice stores each order once. ``ARTEMIS_LEDGER=sqlite:///ledger.db`` adds a
send ledger, which keeps re-runs exact even after the broker forgot the ids (a restart
without ``persist-id-cache``, a deleted address). See docs/artemis.md.
"""

from __future__ import annotations

import logging
import os
import sys
from decimal import Decimal

from sendonce import EntityProfile, IdempotentSender, Ledger, MessageSpec, RetryPolicy
from sendonce.backends import connect
from sendonce.errors import ConfigurationError, SendOnceError

ORDERS = [
    {"order_id": 12345, "year": 2017, "customer": "c-42", "amount": Decimal("99.90")},
    {"order_id": 12346, "year": 2017, "customer": "c-7", "amount": Decimal("15.00")},
    {"order_id": 12347, "year": 2017, "customer": "c-42", "amount": Decimal("7.25")},
]

USAGE = """\
artemis_publish: set ARTEMIS_URL (and ARTEMIS_ADDRESS) to run it.

  export ARTEMIS_URL='amqp://app:secret@broker.example:5672'   # amqps://... for TLS
  export ARTEMIS_ADDRESS=orders
  export ARTEMIS_LEDGER=sqlite:///ledger.db                    # optional
  python samples/artemis_publish.py

See docs/artemis.md.
"""


def main() -> int:
    url = os.environ.get("ARTEMIS_URL", "").strip()
    address = os.environ.get("ARTEMIS_ADDRESS", "").strip()
    ledger_url = os.environ.get("ARTEMIS_LEDGER", "").strip() or None
    if not url or not address:
        print(USAGE)
        return 0
    logging.basicConfig(level=logging.WARNING)
    # The id names the business event (order 12345 of 2017, its payment): a resend, from
    # this run or a restarted one, carries the same _AMQ_DUPL_ID and the broker drops it.
    # The customer keeps each customer's orders in order (Artemis has no partitions).
    spec = MessageSpec("{order_id}.{year}/payment", partition_key="{customer}")
    retry = RetryPolicy(max_attempts=5, attempt_timeout=20.0)
    try:
        with connect(url) as backend:
            print(f"publishing {len(ORDERS)} orders to {address!r} on {backend!r}")
            try:
                entity: EntityProfile | str = backend.describe(address)
            except ConfigurationError as exc:
                if exc.field != "entity":  # a wrong url or password: nothing to assume
                    raise
                entity = EntityProfile(address, id_cache_size=20_000)
                print(f"note: {exc.message.split(';')[0]}.")
                print("      Assuming the default id cache of 20,000 ids.")
            ledger = Ledger(ledger_url, create=True) if ledger_url else None
            try:
                with IdempotentSender(backend, entity, retry=retry, ledger=ledger) as sender:
                    report = sender.send_many(spec.to_message(order) for order in ORDERS)
            finally:
                if ledger is not None:
                    ledger.close()
    except SendOnceError as exc:  # its text never carries the url's password
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"sent {report.sent}, from the ledger {len(report.from_ledger)}, "
        f"failed {len(report.failures)}"
    )
    for failure in report.failures:
        print(f"  {failure.message_id}: {failure.error}", file=sys.stderr)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
