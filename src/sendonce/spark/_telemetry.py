"""The Spark task's span, declared at Spark's edge on the featureless telemetry core
(``sendonce.telemetry._core``), with what a task needs of the core: an executor's own
set-up (``worker_setup``), the driver's trace context to ship (``carrier``) and the flush at
the task's end (``flush``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..telemetry import _core
from ..telemetry._core import (
    DESTINATION,
    OFF,
    OPERATION_NAME,
    OPERATION_TYPE,
    Scope,
    Timed,
    carrier,
    flush,
    worker_setup,
)

__all__ = ["OFF", "carrier", "flush", "spark_task", "worker_setup"]


def spark_task(
    entity: str, partition: int, attempt: int, parent: Mapping[str, str] | None = None
) -> Scope:
    """One Spark task's publish, a child of ``parent`` (the driver's :func:`carrier`); its
    counts are set at the end (``scope.set(...)``)."""
    core = _core.active()
    if core is None:
        return OFF
    attributes: dict[str, Any] = {
        DESTINATION: entity,
        OPERATION_TYPE: "send",
        OPERATION_NAME: "publish",
        "sendonce.spark.partition": partition,
        "sendonce.spark.attempt": attempt,
    }
    context = core.propagator.extract(parent) if parent else None
    return Timed(core, f"publish {entity}", "INTERNAL", attributes, parent=context)
