"""Spark with a send ledger: the driver decides everything decidable there.

A relative ledger url names the driver's file on every executor; a retention shorter than
the entity's window fails on the driver, not in four attempts of every task; a Ledger's
options reach the executors whole; and every failure message says how long a re-run is safe.
Real local Spark (local[2,4]), real broker and ledger files.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, ids_on, orders

from sendonce import ConfigurationError, EntityProfile, MessageSpec, PublishFailedError, RetryPolicy
from sendonce.ledger import Key, Ledger, body_digest
from sendonce.spark import PartitionResult, PublishReport, partition_publisher, publish
from sendonce.spark._ledger_placement import LedgerPlacement, check_ledger_fits
from sendonce.spark._publish import rerun_advice
from sendonce.spark._task import PartitionResult as Result

SPEC = MessageSpec("order-{order_id}", body="customer")
NO_DEDUP = EntityProfile("orders", duplicate_detection=False)


@pytest.mark.spark
def test_a_relative_ledger_url_is_the_drivers_file_on_every_executor(
    spark: Any, broker: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Executors resolve a relative path against their own working directory: the driver
    makes it absolute, so the re-run finds every row confirmed in the driver's file."""
    url, path = broker
    monkeypatch.chdir(tmp_path)
    first = publish(orders(spark, 20, 2), url, NO_DEDUP, SPEC, ledger="sqlite:ledger.db")
    assert (first.sent, first.failed) == (20, 0)
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}") as ledger:
        rows = ledger.lookup("orders", [f"order-{i}" for i in range(20)])
    assert len(rows) == 20 and all(r.confirmed_at is not None for r in rows.values())
    again = publish(orders(spark, 20, 2), url, NO_DEDUP, SPEC, ledger="sqlite:ledger.db")
    assert (again.sent, again.duplicates, again.failed) == (0, 20, 0)
    ids = ids_on(path)
    assert sorted(ids) == expected(20) and max(Counter(ids).values()) == 1


@pytest.mark.spark
def test_a_retention_shorter_than_the_window_fails_on_the_driver(
    spark: Any, broker: tuple[str, Path], tmp_path: Path
) -> None:
    """Not as four failed attempts of every task ending in 'publishing again is safe'."""
    url, path = broker
    profile = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=10))
    df = orders(spark, 10, 2)
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}", retention=timedelta(minutes=5)) as ledger:
        with pytest.raises(ConfigurationError) as info:
            publish(df, url, profile, SPEC, ledger=ledger)
        assert info.value.field == "retention" and "0:10:00" in str(info.value)
        with pytest.raises(ConfigurationError) as info:
            partition_publisher(url, profile, SPEC, schema=df.schema, ledger=ledger)
        assert info.value.field == "retention"
    assert ids_on(path) == []


@pytest.mark.spark
def test_a_ledgers_pruning_options_reach_the_executors(
    spark: Any, broker: tuple[str, Path], tmp_path: Path
) -> None:
    """prune_limit=5: each of the two tasks prunes five of the fifty expired keys, no more."""
    url, _path = broker
    ledger_url = f"sqlite://{tmp_path / 'ledger.db'}"
    expired = [SPEC.to_message({"order_id": 1000 + i, "customer": "old"}) for i in range(50)]
    with Ledger(ledger_url, retention=timedelta(days=1), prune_limit=5) as ledger:
        ledger.store.record_intents(
            "orders",
            [Key(m.message_id, "") for m in expired],
            [body_digest(m) for m in expired],
            first_attempt=datetime.now(UTC) - timedelta(days=2),
            owner="two-days-ago",
        )
        report = publish(orders(spark, 10, 2), url, EntityProfile("orders"), SPEC, ledger=ledger)
        assert (report.sent, len(report.partitions)) == (10, 2)
        left = ledger.lookup("orders", [m.message_id for m in expired])
    assert len(left) == 50 - 2 * 5


@pytest.mark.spark
def test_a_failed_job_says_how_long_a_rerun_is_safe(
    spark: Any, broker: tuple[str, Path], tmp_path: Path
) -> None:
    url, _path = broker

    def always_fail(result: PartitionResult) -> None:  # a closure: workers cannot import us
        raise RuntimeError("injected: every attempt dies after publishing")

    profile = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=10))
    with pytest.raises(PublishFailedError) as without:
        publish(orders(spark, 4, 1), url, profile, SPEC, after_partition=always_fail)
    text = str(without.value)
    assert "safe until 20" in text and " UTC " in text and "ledger=" in text
    assert "could send them twice" in text
    with pytest.raises(PublishFailedError) as with_ledger:
        publish(
            orders(spark, 4, 1),
            url,
            profile,
            SPEC,
            after_partition=always_fail,
            ledger=f"sqlite://{tmp_path / 'ledger.db'}",
        )
    assert "with the same ledger is safe whenever you do it" in str(with_ledger.value)


def test_rows_that_failed_say_how_long_a_rerun_is_safe() -> None:
    started = datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp()
    profile = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=10))
    advice = rerun_advice(profile, started, RetryPolicy(), ledger=False)
    assert "safe until 2026-01-01 12:09:55 UTC" in advice
    failed = Result(0, 0, 1, 0, 0, 1, 0.0, (("order-1", "MessageIdError", "bad"),))
    with pytest.raises(PublishFailedError) as info:
        PublishReport("orders", (failed,), rerun=advice).raise_for_failures()
    assert advice in str(info.value)
    with pytest.raises(PublishFailedError) as info:
        PublishReport("orders", (failed,)).raise_for_failures()  # built by hand: no time known
    assert "only within the entity's duplicate-detection window" in str(info.value)
    counted = rerun_advice(EntityProfile("a", id_cache_size=500), started, RetryPolicy(), False)
    assert "id_cache_size 500" in counted


def test_a_sqlite_ledger_is_refused_on_a_cluster_master(tmp_path: Path) -> None:
    """Executors on other machines would each keep their own ledger file."""
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}") as ledger:
        with pytest.raises(ConfigurationError) as info:
            check_ledger_fits(ledger, "spark://cluster:7077")
        assert info.value.field == "ledger" and "postgresql://" in str(info.value)
        check_ledger_fits(ledger, "local[2,4]")
        check_ledger_fits(ledger, "local-cluster[2,1,1024]")
        placement = LedgerPlacement.of(ledger)
        assert placement is not None
        placement.check()  # this machine, this file
        elsewhere = LedgerPlacement(placement.path, "another-host/boot", placement.file_id)
        with pytest.raises(ConfigurationError) as info:
            elsewhere.check()
        assert info.value.field == "ledger" and "another-host" in str(info.value)


@pytest.mark.spark
def test_a_task_refuses_a_ledger_file_that_is_not_the_drivers(
    spark: Any, broker: tuple[str, Path], tmp_path: Path
) -> None:
    """The ledger file is replaced between the driver's check and the tasks: nothing is sent."""
    url, path = broker
    ledger_url = f"sqlite://{tmp_path / 'ledger.db'}"
    df = orders(spark, 10, 2)
    run = partition_publisher(url, NO_DEDUP, SPEC, schema=df.schema, ledger=ledger_url)
    with Ledger(f"sqlite://{tmp_path / 'other.db'}"):
        pass
    os.replace(tmp_path / "other.db", tmp_path / "ledger.db")
    with pytest.raises(Exception, match="not the file the driver opened"):
        df.foreachPartition(run)
    assert ids_on(path) == []
