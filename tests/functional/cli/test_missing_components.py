"""Issue 23 item 8: without Java, Maven (Artemis) or PostgreSQL the suite skips, saying what
to install; with ``SENDONCE_REQUIRE_COMPONENTS=1`` (set by ``.ci/run``) such a skip fails
the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SUITES = {
    "postgresql": "tests/functional/ledger/test_ledger_postgres.py",
    "java": "tests/integration/spark/test_spark_guard.py",
    "maven": "tests/integration/artemis/test_broker_facts.py",
}
INSTALL = {
    "postgresql": "apt-get install postgresql",
    "java": "apt-get install openjdk-17",
    "maven": "apt-get install maven",
}


def pytest_run(suite: str, *options: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *options, suite],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("component", sorted(SUITES))
def test_a_missing_component_skips_with_the_install_line(component):
    # A developer's run: not CI's, whatever the environment this test runs in says.
    result = pytest_run(  # in one process (-n 0): the skips are the same on xdist's workers
        SUITES[component],
        "-n",
        "0",
        SENDONCE_PRETEND_MISSING=component,
        SENDONCE_REQUIRE_COMPONENTS="",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "skipped" in result.stdout and "failed" not in result.stdout
    assert INSTALL[component] in result.stdout
    assert "RuntimeError" not in result.stdout


@pytest.mark.parametrize(
    ("component", "workers"),
    # CI's run is on pytest-xdist's workers (the addopts' -n 3; one worker takes the same
    # path at a third of the start-up); one in a single process too.
    [*((name, ("-n", "1")) for name in sorted(SUITES)), ("postgresql", ("-n", "0"))],
)
def test_ci_turns_such_skips_into_a_failure(component, workers):
    result = pytest_run(
        SUITES[component],
        *workers,
        SENDONCE_PRETEND_MISSING=component,
        SENDONCE_REQUIRE_COMPONENTS="1",
    )
    assert result.returncode != 0
    assert "CI must not pass by skipping" in result.stdout + result.stderr
    assert INSTALL[component] in result.stdout + result.stderr


def test_ci_run_requires_every_component():
    script = (ROOT / ".ci" / "run").read_text()
    assert "SENDONCE_REQUIRE_COMPONENTS=1 .venv/bin/pytest" in script
