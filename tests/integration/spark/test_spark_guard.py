"""The window guard and the cluster check: refusals that protect exactly-once."""

from __future__ import annotations

import dataclasses
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import ids_on, orders

from sendonce import ConfigurationError, EntityProfile, MessageSpec, RetryPolicy
from sendonce.backends.local import LocalBackend
from sendonce.spark import (
    LateReexecutionError,
    PartitionResult,
    PublishFailedError,
    check_backend_fits,
    is_local_master,
    partition_publisher,
    publish,
)
from sendonce.spark._task import WindowGuard, retry_budget

SPEC = MessageSpec("order-{order_id}", body="customer")


def guard(now: float, *, window: float | None = 600.0, budget: float = 100.0) -> WindowGuard:
    return WindowGuard(
        started=1000.0, window=window, margin=5.0, budget=budget, clock=lambda: now, entity="q"
    )


def test_a_first_attempt_is_never_refused_however_late() -> None:
    guard(10**9).check(partition=0, attempt=0)


def test_a_retry_that_can_finish_inside_the_window_may_resend() -> None:
    guard(1000.0 + 600 - 5 - 100).check(partition=3, attempt=1)


def test_a_retry_that_could_outlive_the_window_is_refused_with_what_to_do() -> None:
    with pytest.raises(LateReexecutionError) as caught:
        guard(1000.0 + 600 - 5 - 100 + 1).check(partition=3, attempt=2)
    text = str(caught.value)
    assert "partition 3" in text and "attempt 2" in text
    assert "duplicate_detection_window" in text and "larger" in text


def test_a_count_bounded_entity_has_no_time_guard() -> None:
    guard(10**9, window=None).check(partition=0, attempt=5)


def test_retry_budget_counts_every_attempt_and_backoff_capped_by_the_window() -> None:
    retry = RetryPolicy(max_attempts=3, initial_backoff=1, max_backoff=10, attempt_timeout=20)
    assert retry_budget(retry, None) == 3 * 20 + 1 + 2
    assert retry_budget(retry, timedelta(seconds=30)) == 25  # window minus the 5 s margin


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[2,4]", True),
        ("local[*]", True),
        ("local-cluster[2,1,1024]", True),
        ("yarn", False),
        ("spark://10.0.0.1:7077", False),
        ("k8s://https://kube:443", False),
    ],
)
def test_a_local_broker_is_refused_on_a_cluster_master(master: str, local: bool) -> None:
    assert is_local_master(master) is local
    if local:
        check_backend_fits("local:///tmp/x.db", master)
    else:
        with pytest.raises(ConfigurationError, match="Service Bus") as caught:
            check_backend_fits("local:///tmp/x.db", master)
        assert caught.value.field == "url" and master in str(caught.value)
    check_backend_fits(
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=secret",
        master,
    )


def test_an_unknown_master_only_warns() -> None:
    with pytest.warns(RuntimeWarning, match="spark.master"):
        check_backend_fits("local:///tmp/x.db", None)


@pytest.mark.spark
def test_a_late_reexecution_is_refused_in_spark(spark: Any, broker: tuple[str, Path]) -> None:
    """Executors see a clock an hour ahead: the retries refuse; first attempts did send."""
    url, path = broker
    driver = os.getpid()

    def skewed() -> float:
        return time.time() + (3600.0 if os.getpid() != driver else 0.0)

    def kill(result: PartitionResult) -> None:  # a closure: workers cannot import this module
        if result.attempt == 0:
            raise RuntimeError("injected: the first attempt dies after publishing")

    with pytest.raises(PublishFailedError, match="too late to resend") as caught:
        publish(
            orders(spark, 60, 2),
            url,
            EntityProfile("orders"),
            SPEC,
            after_partition=kill,
            clock=skewed,
        )
    assert "duplicate_detection_window" in str(caught.value)
    assert sorted(ids_on(path)) == sorted(f"order-{i}" for i in range(60))


@pytest.mark.spark
def test_a_window_too_short_for_the_retry_budget_refuses_every_reexecution(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    entity = EntityProfile("orders", duplicate_detection_window=timedelta(seconds=20))

    def kill(result: PartitionResult) -> None:
        if result.attempt == 0:
            raise RuntimeError("injected")

    with pytest.raises(PublishFailedError, match="too late to resend") as caught:
        publish(orders(spark, 40, 2), url, entity, SPEC, after_partition=kill)
    assert len(ids_on(path)) == 40
    report = caught.value.report
    assert report is not None and not report.complete
    assert (report.delivered, report.sent) == (40, 40)  # the first attempts sent them all


@pytest.mark.spark
def test_a_task_refuses_a_local_broker_it_cannot_share_with_the_driver(
    spark: Any, broker: tuple[str, Path]
) -> None:
    """The driver could not tell (say, the publisher was made before the session existed):
    each task checks by itself that it runs on the driver's machine, before sending."""
    url, path = broker
    publisher = partition_publisher(url, EntityProfile("orders"), SPEC)
    placement = publisher.job.placement
    assert placement is not None
    publisher.job = dataclasses.replace(
        publisher.job, placement=dataclasses.replace(placement, machine="worker-2/elsewhere")
    )
    with pytest.raises(Exception, match="not on the driver's machine"):
        orders(spark, 40, 2).foreachPartition(publisher)
    assert ids_on(path) == []  # nothing sent


@pytest.mark.spark
def test_publish_refuses_when_the_task_sees_another_broker_file(
    spark: Any, broker: tuple[str, Path]
) -> None:
    """An executor that sees another file at the same path (another filesystem) sends nothing."""
    url, path = broker
    df = orders(spark, 40, 2)

    def replace_the_file(result: PartitionResult) -> None:  # never reached: the check is first
        raise AssertionError("a task published to a file the driver did not open")

    publisher = partition_publisher(
        url, EntityProfile("orders"), SPEC, after_partition=replace_the_file
    )
    other = path.with_name("elsewhere.db")
    elsewhere = LocalBackend(str(other))  # a broker a task could send to just as well
    elsewhere.create_entity(EntityProfile("orders"))
    elsewhere.close()
    other.replace(path)  # the path now names another file than the driver opened
    with pytest.raises(Exception, match="not the file the driver opened"):
        df.foreachPartition(publisher)
    assert ids_on(path) == []
