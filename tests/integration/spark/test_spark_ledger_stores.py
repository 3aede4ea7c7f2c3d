"""Spark with a send ledger, beyond test_spark_ledger.py: SQLite and PostgreSQL stores, an
entity without duplicate detection (only the ledger stands between a re-run and copies),
foreachPartition and foreachBatch, and bad ledger arguments refused on the driver."""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, ids_on, orders

from sendonce import ConfigurationError, EntityProfile, MessageSpec
from sendonce.errors import LedgerError
from sendonce.ledger import Key, Ledger, body_digest
from sendonce.spark import PartitionResult, batch_publisher, partition_publisher, publish

SPEC = MessageSpec("order-{order_id}", body="customer")
WINDOW = 600.0  # the default duplicate-detection window (10 minutes)


def killer() -> Any:
    """Every first attempt dies after publishing: Spark re-executes each partition.

    A closure, not a module function: Spark's workers cannot import this module.
    """

    def kill_first_attempts(result: PartitionResult) -> None:
        if result.attempt == 0:
            raise RuntimeError("injected: the first attempt dies after publishing")

    return kill_first_attempts


@pytest.mark.spark
def test_a_rerun_two_windows_later_with_a_ledger_sends_nothing_twice(
    spark: Any, broker: tuple[str, Path], ledger_url: str
) -> None:
    """An entity without duplicate detection: only the ledger stands between a re-run and copies.

    Run 1 publishes 60 orders, every first attempt dying after publishing; the
    re-executions find every row confirmed. Run 2 comes two windows later (the
    executors' clock is ahead, so without a ledger the guard would refuse each
    re-execution) with 30 more orders, again killing every first attempt.
    """
    url, path = broker
    kill_first_attempts = killer()
    entity = EntityProfile("orders", duplicate_detection=False)
    first = publish(
        orders(spark, 60, 2),
        url,
        entity,
        SPEC,
        after_partition=kill_first_attempts,
        ledger=ledger_url,
    )
    assert first.complete and first.failed == 0
    assert first.sent == 0 and first.duplicates == 60  # the reported attempts were the re-runs
    assert sorted(ids_on(path)) == expected(60)

    driver = os.getpid()

    def two_windows_later() -> float:
        return time.time() + 2 * WINDOW + (0.0 if os.getpid() == driver else 1.0)

    second = publish(
        orders(spark, 90, 3),
        url,
        entity,
        SPEC,
        after_partition=kill_first_attempts,
        clock=two_windows_later,
        ledger=ledger_url,
    )
    assert second.complete and second.failed == 0
    assert second.delivered == 90
    ids = ids_on(path)
    assert sorted(ids) == expected(90)
    assert max(Counter(ids).values()) == 1


@pytest.mark.spark
def test_a_late_reexecution_is_let_through_by_the_ledger(
    spark: Any, broker: tuple[str, Path], tmp_path: Path
) -> None:
    """The guard's refusal case (executors an hour ahead) succeeds with a ledger: each row once."""
    url, path = broker
    driver = os.getpid()

    def skewed() -> float:
        return time.time() + (3600.0 if os.getpid() != driver else 0.0)

    kill_first_attempts = killer()
    ledger = Ledger(f"sqlite://{tmp_path / 'ledger.db'}")
    df = orders(spark, 40, 2)
    df.foreachPartition(
        partition_publisher(
            url,
            EntityProfile("orders"),
            SPEC,
            schema=df.schema,
            after_partition=kill_first_attempts,
            clock=skewed,
            ledger=ledger,
        )
    )
    ledger.close()
    ids = ids_on(path)
    assert sorted(ids) == expected(40) and max(Counter(ids).values()) == 1


@pytest.mark.spark
def test_a_replayed_micro_batch_past_the_window_sends_only_what_was_missing(
    spark: Any, broker: tuple[str, Path], tmp_path: Path
) -> None:
    url, path = broker
    ledger_url = f"sqlite://{tmp_path / 'ledger.db'}"
    entity = EntityProfile("orders", duplicate_detection=False)
    run = batch_publisher(url, entity, SPEC, ledger=ledger_url)
    run(orders(spark, 20, 2), 0)
    later = batch_publisher(
        url, entity, SPEC, ledger=ledger_url, clock=lambda: time.time() + 2 * WINDOW
    )
    later(orders(spark, 30, 2), 0)  # the replay of a batch that had grown (a restart)
    ids = ids_on(path)
    assert sorted(ids) == expected(30) and max(Counter(ids).values()) == 1


@pytest.mark.filterwarnings("ignore:could not read spark.master")
def test_bad_ledger_arguments_are_refused_before_any_job(tmp_path: Path) -> None:
    """No Spark job needed: the driver opens the ledger url once before any task."""
    url = f"local://{tmp_path / 'broker.db'}"
    with pytest.raises(ConfigurationError) as caught:
        partition_publisher(url, "orders", SPEC, ledger="mysql://user:pw@host/db")
    assert caught.value.field == "ledger" and "pw" not in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        partition_publisher(url, "orders", SPEC, ledger=42)  # type: ignore[arg-type]
    assert caught.value.field == "ledger"
    with pytest.raises(LedgerError) as unreachable:  # opened on the driver: fails before any task
        batch_publisher(url, "orders", SPEC, ledger="postgresql://u:topsecret@127.0.0.1:1/x")
    assert "topsecret" not in str(unreachable.value)


def _order_3_crashed_yesterday(ledger: Ledger) -> None:
    """What a producer killed between its send of order 3 and the confirmation left behind."""
    crashed = SPEC.to_message({"order_id": 3, "customer": "customer-3"})
    ledger.store.record_intents(
        "orders",
        [Key(crashed.message_id, "")],
        [body_digest(crashed)],
        first_attempt=datetime.now(UTC) - timedelta(seconds=2 * WINDOW),
        owner="dead",
    )


@pytest.mark.spark
@pytest.mark.parametrize("policy", ["error", "resend"])
def test_the_applications_in_doubt_choice_reaches_the_executors(
    spark: Any, broker: tuple[str, Path], tmp_path: Path, policy: str
) -> None:
    """A ``Ledger(in_doubt=...)`` passed to publish is applied by every task's own ledger."""
    url, path = broker
    ledger_url = f"sqlite://{tmp_path / 'ledger.db'}"
    with Ledger(ledger_url) as ledger:
        _order_3_crashed_yesterday(ledger)
    with Ledger(ledger_url, in_doubt=policy) as ledger:  # type: ignore[arg-type]
        report = publish(orders(spark, 10, 2), url, EntityProfile("orders"), SPEC, ledger=ledger)
    ids = ids_on(path)
    if policy == "resend":
        assert (report.sent, report.failed) == (10, 0)
        assert sorted(ids) == expected(10)
    else:
        assert (report.sent, report.failed) == (9, 1)
        assert [f[0] for p in report.partitions for f in p.failures] == ["order-3"]
        assert "order-3" not in ids and len(ids) == 9


@pytest.mark.spark
def test_a_batch_publisher_applies_the_ledgers_in_doubt_choice(
    spark: Any, broker: tuple[str, Path], tmp_path: Path
) -> None:
    """``batch_publisher(ledger=Ledger(..., in_doubt="resend"))`` keeps that choice per batch."""
    url, path = broker
    ledger_url = f"sqlite://{tmp_path / 'ledger.db'}"
    with Ledger(ledger_url, in_doubt="resend") as ledger:
        _order_3_crashed_yesterday(ledger)
        run = batch_publisher(url, EntityProfile("orders"), SPEC, ledger=ledger)
    assert (run.ledger_in_doubt, run.ledger_retention) == ("resend", ledger.retention)
    run(orders(spark, 10, 2), 0)  # order-3 is in doubt: resent, as the application chose
    assert sorted(ids_on(path)) == expected(10)
