"""One local Spark session for the whole Spark suite (a session starts in 5-7 s).

Spark Connect cannot start in a process that runs a classic session, so the
Connect tests run their checks in a subprocess (see test_connect.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
LOG4J = HERE / "log4j2.properties"


def spark_env() -> dict[str, str]:
    """What a Spark driver process needs in its environment on this machine kind."""
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.update(spark_env())
    pyspark_sql = pytest.importorskip("pyspark.sql")
    session = (
        pyspark_sql.SparkSession.builder.master("local[2,4]")
        .appName("sendonce-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J}")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture()
def broker(tmp_path: Path) -> tuple[str, Path]:
    """A fresh local broker file: (url, path)."""
    path = tmp_path / "broker.db"
    return f"local://{path}", path
