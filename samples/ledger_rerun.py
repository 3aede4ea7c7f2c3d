"""Re-run yesterday's failed job: a ledger keeps exactly-once past the broker's window.

The broker forgets a message id after its duplicate-detection window (10 minutes by
default on Service Bus). A job that failed half-way and is re-run the next day would
send everything again; with a ledger it sends exactly what is missing.

Run: python samples/ledger_rerun.py [WORKDIR]
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sendonce import EntityProfile, IdempotentSender, Ledger, MessageSpec
from sendonce.backends import LocalBackend

ORDERS = [{"order_id": i, "customer": f"c-{i % 37}"} for i in range(1000)]
SPEC = MessageSpec("order-{order_id}/created")
ENTITY = EntityProfile("orders")  # duplicate detection, 10-minute window


class SimulatedDay:
    """The sample's wall clock, so that "the next day" takes no time. Production needs none."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def run(broker: LocalBackend, ledger: Ledger, orders: list[dict[str, object]]) -> None:
    with IdempotentSender(broker, ENTITY, ledger=ledger) as sender:
        report = sender.send_many(SPEC.to_message(o) for o in orders)
    print(
        f"  sent {report.sent}, skipped as already sent {len(report.from_ledger)} "
        f"(from the ledger), failed {report.failed}"
    )


def main(workdir: Path) -> None:
    clock = SimulatedDay()
    with LocalBackend(workdir / "broker.db", clock=clock) as broker:
        with Ledger(f"sqlite://{workdir / 'ledger.db'}", clock=clock) as ledger:
            print("day 1: the job publishes 1000 orders and dies after 600")
            run(broker, ledger, ORDERS[:600])
            clock.now += timedelta(days=1)  # the broker's 10-minute window is long gone
            print("day 2: the whole job is re-run")
            run(broker, ledger, ORDERS)
        copies = Counter(m.message_id for m in broker.receive("orders", max_messages=5000))
    total, twice = sum(copies.values()), sum(1 for n in copies.values() if n > 1)
    print(f"the queue holds {total} messages for {len(ORDERS)} orders, {twice} twice")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
