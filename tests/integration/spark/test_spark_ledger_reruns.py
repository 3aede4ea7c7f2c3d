"""Re-runs as users do them, with a ledger, on real local Spark: the first run, the same
run again, a superset of it (yesterday's rows plus today's) and a row a crashed producer
never confirmed, on an entity without duplicate detection, on both ledger stores.

Each task has hundreds of rows, so it sends ``MessageColumns`` (the columnar path): a
re-run there used to kill every first task attempt in the report's ordering, and Spark's
retries then reported ``sent=0``. Here no task attempt may fail (Spark's status tracker
says so per stage), and the counts are exact.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, ids_on, orders, publish_on_first_attempts

from sendonce import EntityProfile, MessageSpec
from sendonce.ledger import Key, Ledger, body_digest
from sendonce.spark import PublishReport

SPEC = MessageSpec("order-{order_id}")  # a JSON body: the task builds MessageColumns
AUDIT = EntityProfile("orders", duplicate_detection=False)  # only the ledger prevents copies


def audited(spark: Any, rows: int, partitions: int) -> Any:
    return orders(spark, rows, partitions).select("order_id", "customer")


def published(spark: Any, rows: int, partitions: int, url: str, ledger: str) -> PublishReport:
    """``publish`` of ``rows`` orders, asserting that no task attempt of its jobs failed."""
    df = audited(spark, rows, partitions)
    report: PublishReport = publish_on_first_attempts(spark, df, url, AUDIT, SPEC, ledger=ledger)
    assert len(report.partitions) == partitions
    return report


def counts(report: PublishReport) -> tuple[int, int, int]:
    return report.sent, report.duplicates, report.failed


@pytest.mark.spark
def test_first_run_identical_rerun_superset_and_a_never_confirmed_row(
    spark: Any, broker: tuple[str, Path], ledger_url: str
) -> None:
    url, path = broker
    assert counts(published(spark, 1500, 4, url, ledger_url)) == (1500, 0, 0)
    assert counts(published(spark, 1500, 4, url, ledger_url)) == (0, 1500, 0)
    assert counts(published(spark, 2000, 5, url, ledger_url)) == (500, 1500, 0)
    assert sorted(ids_on(path)) == expected(2000)

    # Order 2100 was sent by a producer that crashed before its confirmation was written:
    # without duplicate detection it is in doubt (reported, not sent); the rest go once.
    crashed = SPEC.to_message({"order_id": 2100, "customer": f"customer-{2100 % 7}"})
    with Ledger(ledger_url) as ledger:
        ledger.store.record_intents(
            "orders",
            [Key(crashed.message_id, "")],
            [body_digest(crashed)],
            first_attempt=datetime.now(UTC) - timedelta(hours=1),
            owner="crashed",
        )
    report = published(spark, 2400, 4, url, ledger_url)
    assert counts(report) == (399, 2000, 1)
    [(what, kind, text)] = [f for p in report.partitions for f in p.failures]
    assert (what, kind) == ("order-2100", "InDoubtError") and "never confirmed" in text
    ids = ids_on(path)
    assert max(Counter(ids).values()) == 1
    assert sorted(ids) == sorted(set(expected(2400)) - {"order-2100"})
