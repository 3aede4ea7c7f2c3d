"""One local Spark session for the whole Spark suite (a session starts in 5-7 s).

Spark Connect cannot start in a process that runs a classic session, so the
Connect tests run their checks in a subprocess (see test_connect.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import QUICK_JVM, spark_env

HERE = Path(__file__).resolve().parent
LOG4J = HERE / "log4j2.properties"


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
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dlog4j2.configurationFile=file:{LOG4J} {QUICK_JVM}",
        )
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture()
def broker(tmp_path: Path) -> tuple[str, Path]:
    """A fresh local broker file: (url, path)."""
    path = tmp_path / "broker.db"
    return f"local://{path}", path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh ledger of each store: a SQLite file, or a new database on the cluster."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'ledger.db'}"
    import psycopg

    server: str = request.getfixturevalue("postgres_server")
    name = f"spark_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.rsplit("/", 1)[0] + f"/{name}"
