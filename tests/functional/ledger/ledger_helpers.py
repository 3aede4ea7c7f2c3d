"""What the ledger tests share: one wall clock for broker and ledger, and the orders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sendonce import Message

WINDOW = timedelta(minutes=10)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    """One wall clock for the broker and the ledger: tests move it past windows."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def msg(i: int, body: str = "body") -> Message:
    return Message(f"{body} {i}", message_id=f"order-{i}")
