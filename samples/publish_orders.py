"""Publish orders exactly once to the embedded local broker, then read them back.

Run: python samples/publish_orders.py [BROKER_FILE]
"""

from __future__ import annotations

import sys
import tempfile
from decimal import Decimal
from pathlib import Path

from sendonce import EntityProfile, IdempotentSender, MessageSpec
from sendonce.backends import connect

ORDERS = [
    {"order_id": 12345, "year": 2017, "customer": "c-42", "amount": Decimal("99.90")},
    {"order_id": 12346, "year": 2017, "customer": "c-7", "amount": Decimal("15.00")},
    {"order_id": 12347, "year": 2017, "customer": "c-42", "amount": Decimal("7.25")},
]


def main(broker_file: Path) -> None:
    # The id names the business event: order 12345 of 2017, its payment.
    spec = MessageSpec("{order_id}.{year}/payment", session_id="{customer}")
    entity = EntityProfile("payments", sessions=True)
    with connect(f"local://{broker_file.resolve()}") as backend:
        with IdempotentSender(backend, entity) as sender:
            first = sender.send_many(spec.to_message(o) for o in ORDERS)
            again = sender.send_many(spec.to_message(o) for o in ORDERS)  # a blind resend
        print(f"first run: sent {first.sent}, duplicates {first.duplicates}")
        print(f"resend:    sent {again.sent}, duplicates {again.duplicates}")
        received = backend.receive(entity.name, session_id="c-42", max_messages=10)  # type: ignore[attr-defined]
        for message in received:
            print(f"received {message.message_id} (session {message.session_id}): {message.body!r}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "broker.db")
