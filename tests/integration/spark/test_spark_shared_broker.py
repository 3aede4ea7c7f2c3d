"""The Spark driver keeps its own backend open on the broker file while tasks publish to it.

Users do this naturally (the backend that created the entity stays open, a helper
reads stats mid-job); it once cost acknowledged messages and a "malformed" file.
The Spark Connect variant runs in connect_checks.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, ids_on, orders

from sendonce import EntityProfile, Message, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark import PartitionResult, partition_publisher, publish

pytestmark = pytest.mark.spark

ENTITY = EntityProfile("orders")
SPEC = MessageSpec("order-{order_id}", body=None)


def first_attempt_killer() -> Any:
    # A closure: top-level functions of a test module are pickled by reference and the
    # executors cannot import this module.
    def kill(result: PartitionResult) -> None:
        if result.attempt == 0:
            raise RuntimeError("injected: the first attempt dies after publishing")

    return kill


def test_publish_while_the_driver_keeps_a_backend_open(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    with LocalBackend(path) as driver_backend:
        driver_backend.create_entity(ENTITY)
        report = publish(orders(spark), url, ENTITY, SPEC, after_partition=first_attempt_killer())
        LocalBackend(path).close()  # and a helper opens and closes another handle mid-job
        assert sorted(driver_backend.message_ids("orders")) == expected(300)
        (ack,) = driver_backend.send("orders", [Message("x", message_id="driver")], timeout=30)
        assert ack.outcome == "accepted"
    assert report.delivered == 300 and report.failed == 0
    ids = ids_on(path)
    assert sorted(ids) == sorted([*expected(300), "driver"])
    assert len(ids) == len(set(ids))


def test_foreach_partition_while_the_driver_keeps_a_backend_open(
    spark: Any, broker: tuple[str, Path]
) -> None:
    url, path = broker
    with LocalBackend(path) as driver_backend:
        driver_backend.create_entity(ENTITY)
        orders(spark).foreachPartition(
            partition_publisher(url, ENTITY, SPEC, after_partition=first_attempt_killer())
        )
        assert driver_backend.stats("orders")["messages"] == 300
    ids = ids_on(path)
    assert sorted(ids) == expected(300) and len(ids) == 300
