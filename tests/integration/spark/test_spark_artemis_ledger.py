"""Spark -> Artemis with a ledger, as users re-run a job: the first run, the same run again, a
superset of it (yesterday's rows plus today's: the issue-28 crash shape, on the columnar
path), then a row a crashed producer never confirmed, on both ledger stores.

Executors open their own ``ArtemisBackend`` from the ``amqp://`` url and the ledger from its
url; no task attempt may fail (Spark's status tracker says so per stage). What the broker
holds is read with a hand-written proton receiver, not through sendonce.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from spark_helpers import expected, orders, publish_on_first_attempts

from artemis.raw import drain
from sendonce import EntityProfile, MessageSpec
from sendonce.ledger import Key, Ledger, body_digest
from sendonce.spark import PublishReport

# About 110 s per store on the 2-core machine (five Spark jobs of 1,500-2,400 rows to a real
# broker): under -m slow. test_spark_ledger_reruns.py runs the same shapes on the local broker
# by default, and test_spark_artemis.py a publish to Artemis.
pytestmark = [pytest.mark.spark, pytest.mark.artemis, pytest.mark.slow, pytest.mark.timeout(300)]

SPEC = MessageSpec("order-{order_id}")  # a JSON body: each task sends MessageColumns


def published(
    spark: Any, rows: int, partitions: int, url: str, profile: EntityProfile, ledger: str
) -> PublishReport:
    """``publish`` of ``rows`` orders, asserting that no task attempt of its jobs failed."""
    df = orders(spark, rows, partitions).select("order_id", "customer")
    report: PublishReport = publish_on_first_attempts(spark, df, url, profile, SPEC, ledger=ledger)
    assert len(report.partitions) == partitions
    return report


def counts(report: PublishReport) -> tuple[int, int, int]:
    return report.sent, report.duplicates, report.failed


def test_reruns_to_artemis_with_a_ledger_send_each_row_once(
    spark: Any, artemis_broker: Any, artemis_address: str, ledger_url: str
) -> None:
    url = artemis_broker.url()
    profile = EntityProfile(artemis_address, id_cache_size=20_000)
    assert counts(published(spark, 1500, 4, url, profile, ledger_url)) == (1500, 0, 0)
    assert counts(published(spark, 1500, 4, url, profile, ledger_url)) == (0, 1500, 0)
    superset = published(spark, 2000, 5, url, profile, ledger_url)
    assert counts(superset) == (500, 1500, 0)

    # Order 2100 was sent by a producer that died before its confirmation was written. On a
    # count-bounded id cache the ledger has no window to resend inside: in doubt, not sent.
    crashed = SPEC.to_message({"order_id": 2100, "customer": f"customer-{2100 % 7}"})
    with Ledger(ledger_url) as ledger:
        ledger.store.record_intents(
            artemis_address,
            [Key(crashed.message_id, "")],
            [body_digest(crashed)],
            first_attempt=datetime.now(UTC) - timedelta(hours=1),
            owner="crashed",
        )
    report = published(spark, 2400, 4, url, profile, ledger_url)
    assert counts(report) == (399, 2000, 1)
    [(what, kind, _text)] = [f for p in report.partitions for f in p.failures]
    assert (what, kind) == ("order-2100", "InDoubtError")
    ids = [str(m.id) for m in drain(url, artemis_address)]
    assert max(Counter(ids).values()) == 1
    assert sorted(ids) == sorted(set(expected(2400)) - {"order-2100"})
