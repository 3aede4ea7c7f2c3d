"""Shared test data and broker readers for the Spark suite (imported, not a test module)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sendonce.backends.local import LocalBackend


def spark_env() -> dict[str, str]:
    """What a Spark driver process needs in its environment on this machine kind."""
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def orders(spark: Any, n: int = 300, partitions: int = 3) -> Any:
    """n orders over a few partitions, with a decimal and a timestamp (one minute apart)."""
    return spark.range(n, numPartitions=partitions).selectExpr(
        "id as order_id",
        "concat('customer-', cast(id % 7 as string)) as customer",
        "cast(id * 1.25 as decimal(10,2)) as amount",
        "timestamp'2024-03-10 12:00:00' + make_interval(0, 0, 0, 0, 0, id, 0) as placed_at",
    )


def ids_on(path: Path, entity: str = "orders") -> list[str]:
    """Every message id on the broker file's entity (one entry per stored message)."""
    backend = LocalBackend(str(path))
    try:
        return backend.message_ids(entity)
    finally:
        backend.close()


def drain(path: Path, entity: str = "orders") -> dict[str, bytes]:
    """Receive every message: id -> body (asserting no id appears twice)."""
    backend = LocalBackend(str(path))
    out: dict[str, bytes] = {}
    try:
        while batch := backend.receive(entity, max_messages=500):
            for message in batch:
                assert message.message_id not in out, message.message_id
                out[message.message_id] = message.body
    finally:
        backend.close()
    return out


def expected(n: int, prefix: str = "order-") -> list[str]:
    return sorted(f"{prefix}{i}" for i in range(n))
