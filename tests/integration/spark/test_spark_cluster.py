"""On a real two-host standalone cluster: speculative copies and a killed executor JVM,
both through publish() to Service Bus (the emulator). Slow: a cluster takes ~20 s to start.

The driver runs in a subprocess (cluster_checks.py): one process has one SparkContext, and
the default suite's local session may already be running in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import expected, spark_env
from standalone import WORKER_HOSTS, StandaloneCluster

from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.spark, pytest.mark.emulator, pytest.mark.slow, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    pytest.importorskip("pyspark")
    with StandaloneCluster(tmp_path_factory.mktemp("standalone")) as running:
        assert running.workers() == sorted(WORKER_HOSTS)
        yield running


def run_driver(cluster: StandaloneCluster, emulator: Emulator, scenario: str, marks: Path) -> Any:
    marks.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "cluster_checks.py"),
            cluster.master_url,
            emulator.connection_string,
            scenario,
            str(marks),
        ],
        env={**os.environ, **spark_env()},
        capture_output=True,
        text=True,
        timeout=480,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_a_speculative_copy_on_the_other_host_wins_and_each_row_lands_once(
    cluster: StandaloneCluster, emulator: Emulator, store: LocalBackend, tmp_path: Path
) -> None:
    result = run_driver(cluster, emulator, "speculation", tmp_path / "marks")

    ids = store.message_ids("orders")
    assert sorted(ids) == expected(400) and len(ids) == 400  # the copies were dropped
    assert (result["rows"], result["delivered"], result["failed"]) == (400, 400, 0)
    assert result["attempts"]["0"] == 1  # partition 0's result is the speculative copy's
    finished = {name.rsplit("-", 1)[0]: name.rsplit("-", 1)[1] for name in result["finished"]}
    # Both attempts of partition 0 published everything, on different hosts.
    assert {"p0-a0", "p0-a1"} <= finished.keys()
    assert finished["p0-a0"] != finished["p0-a1"]
    assert emulator.transfers("orders") > 4  # the copy really resent


def test_an_executor_jvm_killed_mid_publish_loses_and_duplicates_nothing(
    cluster: StandaloneCluster, emulator: Emulator, store: LocalBackend, tmp_path: Path
) -> None:
    result = run_driver(cluster, emulator, "executor-killed", tmp_path / "marks")

    ids = store.message_ids("orders")
    assert sorted(ids) == expected(400) and len(ids) == 400
    assert (result["rows"], result["delivered"], result["failed"]) == (400, 400, 0)
    assert result["attempts"]["1"] >= 1  # partition 1 was rerun after its executor died
    assert result["complete"] is True
