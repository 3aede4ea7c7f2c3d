"""Tests that need a real component this machine lacks are skipped, saying how to install it.

The README's ``pytest`` must be green on a laptop or a plain CI image without Java or
PostgreSQL: the Spark suite (marked ``spark``, and everything under
``tests/integration/spark``) needs Java 17+ and pyspark; the ``postgres`` tests need
PostgreSQL's server binaries and psycopg; the ``artemis`` tests (and everything under
``tests/integration/artemis``) need Java 17+, python-qpid-proton, and Maven to fetch the
broker's distribution once (``tests/artemis/install.sh``). Such a test is skipped with the
install line in its reason. ``.ci/run`` installs every component and sets
``SENDONCE_REQUIRE_COMPONENTS=1``, which turns these skips into a failed run: CI never passes
by skipping. ``SENDONCE_PRETEND_MISSING=java,postgresql,maven`` makes components look missing
(to test this).

``artemis_broker`` is one real Artemis broker for the whole run (started on first use, about
5 s; stopped at the end); ``artemis_address`` names an address no other test uses.

Tests anywhere may run the CLI in this process (click's ``CliRunner``); what it does to
logging is undone after each test.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from artemis.broker import ArtemisBroker, cached_artemis_home

_SPARK_DIR = Path(__file__).resolve().parent / "integration" / "spark"
_ARTEMIS_DIR = Path(__file__).resolve().parent / "integration" / "artemis"
_MISSING_TAG = "[missing component]"


@pytest.fixture(autouse=True)
def restore_sendonce_logging() -> Iterator[None]:
    """``sendonce --log-level`` sets the ``sendonce`` logger's level and adds a stderr handler:
    right for a process, but it would hide DEBUG records from later tests' ``caplog``."""
    logger = logging.getLogger("sendonce")
    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers
    logger.propagate = propagate


@pytest.fixture
def otel() -> Iterator[Any]:
    """sendonce's traces and metrics, captured in memory for this test (``otel_capture``)."""
    from otel_capture import capturing

    with capturing() as capture:
        yield capture


def _pretend_missing(name: str) -> bool:
    return name in os.environ.get("SENDONCE_PRETEND_MISSING", "").split(",")


@cache
def _java_problem() -> str | None:
    """Why Spark cannot start here, or None."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed: pip install 'sendonce[spark]'"
    return _java17_problem("Spark")


@cache
def _artemis_problem() -> str | None:
    """Why a throwaway Artemis broker cannot start here, or None."""
    if importlib.util.find_spec("proton") is None:
        return "python-qpid-proton is not installed: pip install 'sendonce[artemis]'"
    java = _java17_problem("the Artemis broker")
    if java is not None:
        return java
    if _pretend_missing("maven") or (cached_artemis_home() is None and not shutil.which("mvn")):
        return (
            "Maven is not installed (it fetches the Artemis broker's distribution once, "
            "tests/artemis/install.sh): apt-get install maven (or brew install maven)"
        )
    return None


def _java17_problem(needed_by: str) -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    install = "apt-get install openjdk-17-jre-headless (or brew install openjdk@17)"
    if _pretend_missing("java") or not java or not os.path.exists(java):
        return f"Java 17+ is not installed ({needed_by} needs it): {install}"
    try:
        shown = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return f"{java} does not run: {install}"
    match = re.search(r'version "(\d+)(?:\.(\d+))?', shown)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0": Java 8
        major = int(match.group(2))
    if major < 17:
        return f"{needed_by} needs Java 17+, {java} is Java {major or '?'}: {install}"
    return None


@cache
def _postgres_problem() -> str | None:
    """Why a throwaway PostgreSQL cluster cannot start here, or None."""
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed: pip install 'sendonce[postgres]'"
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("initdb")
    if _pretend_missing("postgresql") or not found:
        return (
            "PostgreSQL is not installed (the tests start throwaway clusters): apt-get install "
            "postgresql (or brew install postgresql)"
        )
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    required = os.environ.get("SENDONCE_REQUIRE_COMPONENTS") == "1"
    missing: list[str] = []
    for item in items:
        if _SPARK_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.spark)
        if _ARTEMIS_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.artemis)
        needs = [
            problem
            for marker, problem in (
                ("spark", _java_problem),
                ("postgres", _postgres_problem),
                ("artemis", _artemis_problem),
            )
            if item.get_closest_marker(marker) is not None
        ]
        for check in needs:
            reason = check()
            if reason is None:
                continue
            if required:
                missing.append(reason)
            item.add_marker(pytest.mark.skip(reason=f"{reason} {_MISSING_TAG}"))
            break
    if required and missing:
        reasons = "\n  ".join(sorted(set(missing)))
        raise pytest.UsageError(
            f"SENDONCE_REQUIRE_COMPONENTS=1: {len(missing)} test(s) would be skipped for a "
            f"missing component (CI must not pass by skipping):\n  {reasons}"
        )


SESSION_ADDRESS_SETTINGS = {
    # A tiny id cache: the count-bounded window within a few messages.
    "small-cache.#": {"id-cache-size": 3},
    # No auto-creation: a send to a missing address is refused.
    "noauto.#": {"auto-create-addresses": False, "auto-create-queues": False},
    # A full address refuses (FAIL policy): a message over 64 KB can never be stored.
    "tiny.#": {"max-size-bytes": 65536, "address-full-policy": "FAIL"},
}


@pytest.fixture(scope="session")
def artemis_broker() -> Iterator[ArtemisBroker]:
    """One real Artemis broker for the run: started on first use, removed at the end.

    Tests share it (a start costs about 5 s) and keep apart by address: take
    ``artemis_address``. A test that kills, restarts or reconfigures a broker starts its own
    ``ArtemisBroker``."""
    with ArtemisBroker(address_settings=SESSION_ADDRESS_SETTINGS) as broker:
        yield broker


@pytest.fixture
def artemis_address(request: pytest.FixtureRequest) -> str:
    """An address name no other test of the run uses (readable: it starts with the test's)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:40]
    return f"{name}-{uuid.uuid4().hex[:8]}"
