"""The Spark samples and the Spark demo run standalone and exit 0 (each in its own process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_helpers import quick_jvm_env, spark_env

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[3]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, **spark_env(), **quick_jvm_env()},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("sample", ["spark_batch.py", "spark_streaming.py"])
def test_sample_runs_standalone(sample: str, tmp_path: Path) -> None:
    done = run([str(ROOT / "samples" / sample)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PublishReport(" in done.stdout


def test_the_spark_demo_proves_exactly_once(tmp_path: Path) -> None:
    done = run(["-m", "sendonce.cli", "demo", "--spark"], tmp_path)  # as docs/spark.md says
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "task attempts killed:           4" in done.stdout
    assert "exactly once" in done.stdout
    assert "missing / twice / extra: 0 / 0 / 0" in done.stdout
