"""Traces from Spark executors: each task's publish is a span in the driver's trace.

Executors are processes of their own: they set up their provider through
``SENDONCE_OTEL_SETUP=sendonce.telemetry:configure`` and export over OTLP to a small
collector the test runs on 127.0.0.1 (``tests/otlp_collector.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, ids_on, orders

from otlp_collector import otlp_collector
from sendonce import EntityProfile, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark import publish

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SPEC = MessageSpec("order-{order_id}")


def test_each_task_is_a_span_of_the_drivers_trace_with_its_counts(
    spark: Any, broker: tuple[str, Path], otel: Any
) -> None:
    url, path = broker
    with LocalBackend(path) as backend:
        backend.create_entity(EntityProfile("orders"))
    environment = spark.sparkContext.environment
    with otlp_collector() as (endpoint, collected):
        variables = {
            "SENDONCE_OTEL_SETUP": "sendonce.telemetry:configure",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "orders-publisher",
        }
        environment.update(variables)  # the Python workers of the next job get these
        try:
            tracer = otel.tracer_provider.get_tracer("test")
            with tracer.start_as_current_span("nightly job") as job:
                report = publish(orders(spark, n=90, partitions=3), url, "orders", SPEC)
        finally:
            for name in variables:
                environment.pop(name, None)
        deadline = time.monotonic() + 30
        while len(collected.named("publish orders")) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # each task flushes as it ends; the posts may trail the job
        tasks = collected.named("publish orders")
        calls = collected.named("send_many orders")
    assert (report.sent, report.failed) == (90, 0)
    assert sorted(ids_on(path)) == expected(90)
    assert len(tasks) == 3
    job_context = job.get_span_context()
    for task in tasks:
        assert task.trace_id == f"{job_context.trace_id:032x}"
        assert task.parent_span_id == f"{job_context.span_id:016x}"
        assert task.resource["service.name"] == "orders-publisher"
        assert task.attributes["sendonce.rows"] == task.attributes["sendonce.sent"] == 30
        assert task.attributes["sendonce.failed"] == 0
    assert sorted(t.attributes["sendonce.spark.partition"] for t in tasks) == [0, 1, 2]
    # Each task's sends are children of its span.
    task_ids = {t.span_id for t in tasks}
    assert len(calls) >= 3 and all(c.parent_span_id in task_ids for c in calls)
    assert sum(c.attributes["sendonce.sent"] for c in calls) == 90
