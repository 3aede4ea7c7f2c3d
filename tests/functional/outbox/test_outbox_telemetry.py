"""A relay's batches are spans (with the sender's call inside), its backlog two gauges."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sendonce import EntityProfile, Message
from sendonce.backends import LocalBackend
from sendonce.outbox import Relay, enqueue, install

pytestmark = pytest.mark.postgres

sys.path.insert(0, str(Path(__file__).parents[2]))

pytest.importorskip("opentelemetry.sdk")


def test_a_relay_batch_is_a_span_and_the_backlog_is_measured(
    outbox_url: str, broker: LocalBackend, otel: Any
) -> None:
    install(outbox_url)
    with psycopg.connect(outbox_url) as conn:
        batch = [Message(f"o {n}", message_id=f"o-{n}", partition_key=f"k{n}") for n in range(3)]
        enqueue(conn, batch, entity="orders")
        conn.commit()
    relay = Relay(outbox_url, broker, [EntityProfile("orders")], poll_interval=0.2)
    runner = threading.Thread(target=relay.run)
    runner.start()
    try:
        while broker.count("orders") < 3:
            assert runner.is_alive()
            time.sleep(0.02)
    finally:
        relay.stop()
        runner.join(timeout=30)
        relay.close()
    span = otel.one("relay orders")
    assert span.attributes["sendonce.rows"] == 3
    assert span.attributes["sendonce.published"] == 3
    assert [c.name for c in otel.children(span)] == ["send_many orders"]
    pending = [point.value for _, point in otel.points("sendonce.outbox.rows_pending")]
    assert pending and pending[0] == 3  # measured at the first prune, before publishing
