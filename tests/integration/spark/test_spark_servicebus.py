"""Spark -> Service Bus, the production path: the real azure-servicebus client on the
executors against the emulator, with faults scripted on the wire mid-publish.

Every job ends with each row on the broker exactly once, exact counts, and no
connection left open on the emulator.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, orders

from sendonce import EntityProfile, MessageSpec, RetryPolicy
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator, Fault, FaultAction
from sendonce.spark import batch_publisher, partition_publisher, publish

pytestmark = [pytest.mark.spark, pytest.mark.emulator, pytest.mark.timeout(180)]

ORDERS = EntityProfile("orders")
SPEC = MessageSpec("order-{order_id}", body=None)
# Short attempts so a withheld disposition costs seconds, not the default 30 s.
RETRY = RetryPolicy(
    max_attempts=8, initial_backoff=0.05, max_backoff=0.5, attempt_timeout=3.0, jitter=False
)
KEEP = 1.0  # executors close their pooled connection after 1 s idle (30 s by default)
WIRE_FAULTS = [
    FaultAction.DROP_AFTER_COMMIT,
    FaultAction.DETACH_AFTER_COMMIT,
    FaultAction.WITHHOLD,
    FaultAction.SERVER_BUSY,
]


def on_broker(store: LocalBackend) -> list[str]:
    return store.message_ids("orders")


def no_connection_left(emulator: Emulator, timeout: float = 15.0) -> int:
    """The emulator's open connections once the clients' closes arrived (0 = no leak)."""
    deadline = time.monotonic() + timeout
    while emulator.open_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    return emulator.open_connections


@pytest.mark.parametrize("action", WIRE_FAULTS, ids=lambda a: a.value)
def test_publish_through_the_client_survives_a_wire_fault_exactly_once(
    spark: Any, emulator: Emulator, store: LocalBackend, action: FaultAction
) -> None:
    # Two faults on the wire: each strikes one batch transfer of some partition.
    emulator.faults.add(Fault(action, entity="orders"), Fault(action, entity="orders"))

    url = emulator.connection_string
    report = publish(
        orders(spark, 300, 3),
        url,
        ORDERS,
        SPEC,
        retry=RETRY,
        check_conflicts=False,
        keep_connections=KEEP,
    )

    assert emulator.faults.pending == 0  # both struck
    ids = on_broker(store)
    assert sorted(ids) == expected(300) and len(ids) == 300  # each row once
    # Service Bus acknowledges a duplicate like a send, so all count as sent.
    assert (report.rows, report.sent, report.duplicates, report.failed) == (300, 300, 0, 0)
    assert no_connection_left(emulator) == 0
    # At most one per partition, plus a reconnect after each fault that kills the link.
    assert emulator.connections_accepted <= 3 + 2


def test_partition_publisher_through_the_client_with_every_fault_exactly_once(
    spark: Any, emulator: Emulator, store: LocalBackend
) -> None:
    emulator.faults.add(*(Fault(a, entity="orders") for a in WIRE_FAULTS))
    df = orders(spark, 300, 3)

    df.foreachPartition(
        partition_publisher(
            emulator.connection_string,
            ORDERS,
            SPEC,
            retry=RETRY,
            schema=df.schema,
            keep_connections=KEEP,
        )
    )

    assert emulator.faults.pending == 0
    assert sorted(on_broker(store)) == expected(300)
    assert no_connection_left(emulator) == 0


def test_batch_publisher_through_the_client_with_every_fault_exactly_once(
    spark: Any, emulator: Emulator, store: LocalBackend, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for part in range(2):
        rows = [json.dumps({"order_id": part * 100 + i}) for i in range(100)]
        (source / f"part-{part}.json").write_text("\n".join(rows) + "\n")
    emulator.faults.add(*(Fault(a, entity="orders") for a in WIRE_FAULTS))
    reports: list[Any] = []

    query = (
        spark.readStream.schema("order_id long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(
            batch_publisher(
                emulator.connection_string,
                ORDERS,
                SPEC,
                retry=RETRY,
                keep_connections=KEEP,
                on_batch=lambda batch_id, report: reports.append(report),
            )
        )
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)

    assert query.exception() is None
    assert emulator.faults.pending == 0
    assert sorted(on_broker(store)) == expected(200)
    assert [r.delivered for r in reports] == [100, 100]
    assert no_connection_left(emulator) == 0


@pytest.mark.parametrize("keep", [0.0, KEEP], ids=["per-partition", "per-executor"])
def test_executors_reuse_one_connection_across_tasks_and_close_it_when_idle(
    spark: Any, emulator: Emulator, store: LocalBackend, keep: float
) -> None:
    url = emulator.connection_string
    report = publish(
        orders(spark, 240, 8), url, ORDERS, SPEC, check_conflicts=False, keep_connections=keep
    )

    assert sorted(on_broker(store)) == expected(240) and report.delivered == 240
    opened_by_tasks = emulator.connections_accepted  # the driver needs none: a profile is given
    if keep:
        assert opened_by_tasks < 8  # tasks of one Python worker shared its connection
    else:
        assert opened_by_tasks == 8  # one per partition
    assert no_connection_left(emulator) == 0  # closed after the job, idle or not
