"""Spark -> AMQ Broker / Artemis: executors open their own ArtemisBackend from the
``amqp://`` url (a connection is never shipped) against the real broker, with the
connection cut mid-publish after the broker took a transfer.

Each job ends with each row on the broker exactly once, read with a hand-written proton
receiver, not through sendonce.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from spark_helpers import expected, orders

from artemis.faultproxy import FaultProxy
from artemis.raw import drain
from sendonce import EntityProfile, MessageSpec, RetryPolicy
from sendonce.spark import partition_publisher, publish

pytestmark = [pytest.mark.spark, pytest.mark.artemis, pytest.mark.timeout(240)]

SPEC = MessageSpec("order-{order_id}", partition_key="{customer}", body=None)
RETRY = RetryPolicy(max_attempts=8, initial_backoff=0.05, max_backoff=0.5, attempt_timeout=10)


def test_publish_to_artemis_from_executors_through_a_cut_connection_exactly_once(
    spark: Any, artemis_broker: Any, artemis_address: str
) -> None:
    profile = EntityProfile(artemis_address, id_cache_size=20_000)
    with FaultProxy("127.0.0.1", artemis_broker.port) as proxy:
        # The transfer carrying order 150 reaches the broker; its answer never comes back.
        proxy.cut_after(b"order-150", settle=1.0)
        report = publish(
            orders(spark, 300, 3),
            artemis_broker.url(port=proxy.port),
            profile,
            SPEC,
            retry=RETRY,
            check_conflicts=False,
            keep_connections=1.0,
        )
        assert proxy.fired.is_set()
    ids = [m.id for m in drain(artemis_broker.url(), artemis_address)]
    assert sorted(ids) == expected(300) and len(ids) == 300
    # Artemis acknowledges a duplicate like a send: every row counts as sent.
    assert (report.rows, report.sent, report.failed) == (300, 300, 0)


@pytest.mark.slow  # two more jobs (17-47 s under load); the default run has the one above
def test_partition_publisher_to_artemis_ships_the_url_not_the_password_in_its_repr(
    spark: Any, artemis_broker: Any, artemis_address: str
) -> None:
    df = orders(spark, 120, 3)
    publisher = partition_publisher(
        artemis_broker.url(),
        EntityProfile(artemis_address, id_cache_size=20_000),
        SPEC,
        retry=RETRY,
        schema=df.schema,
    )
    assert artemis_broker.password not in repr(publisher)
    pickle.dumps(publisher)  # what Spark ships to the executors
    df.foreachPartition(publisher)
    df.foreachPartition(publisher)  # a second run: every copy dropped by the broker
    ids = [m.id for m in drain(artemis_broker.url(), artemis_address)]
    assert sorted(ids) == expected(120) and len(ids) == 120
