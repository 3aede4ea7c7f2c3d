"""The same exactly-once checks on a Spark Connect session (in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_helpers import spark_env

# Slow (~45 s: a Spark Connect server starts in a subprocess): CI's default run has the
# classic session's same checks; `pytest -m slow` runs these.
pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def connect_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    pytest.importorskip("pyspark.sql.connect.session")
    workdir = tmp_path_factory.mktemp("connect")
    done = subprocess.run(
        [sys.executable, str(HERE / "connect_checks.py"), str(workdir)],
        env={**os.environ, **spark_env()},
        capture_output=True,
        text=True,
        timeout=420,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    results: dict[str, object] = json.loads(lines[-1][len("RESULT ") :])
    return results


def test_the_checks_ran_on_a_connect_session(connect_results: dict[str, object]) -> None:
    assert connect_results["is_connect"] is True
    assert connect_results["master"] == "local[2,4]"


def test_publish_is_exactly_once_under_connect(connect_results: dict[str, object]) -> None:
    assert connect_results["publish_exactly_once"] is True
    rows, delivered, failed, attempts = connect_results["publish_report"]  # type: ignore[misc]
    assert (rows, delivered, failed) == (200, 200, 0)
    assert attempts == {"0": 2, "1": 2}


def test_a_second_publish_only_finds_duplicates_under_connect(
    connect_results: dict[str, object],
) -> None:
    assert connect_results["second_run"] == [200, 0, 200, 0]
    assert connect_results["second_run_unchanged"] is True


def test_partition_and_batch_publishers_are_exactly_once_under_connect(
    connect_results: dict[str, object],
) -> None:
    assert connect_results["partition_publisher_exactly_once"] is True
    assert connect_results["batch_publisher_exactly_once"] is True


def test_a_failed_job_raises_publish_failed_with_counts_under_connect(
    connect_results: dict[str, object],
) -> None:
    failed = connect_results["failed_job"]
    assert isinstance(failed, dict), failed
    assert failed["chained"] is True and failed["names_cause"] is True
    assert failed["complete"] is False
    assert failed["partition_1"] == [100]  # its attempts published all 100 before dying
    assert failed["delivered"] == failed["on_broker"]


def test_publish_with_the_driver_keeping_its_backend_open_under_connect(
    connect_results: dict[str, object],
) -> None:
    assert connect_results["driver_backend_open_exactly_once"] is True
