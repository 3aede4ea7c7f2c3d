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
``postgres_server`` is one throwaway PostgreSQL cluster for the run (on first use, about 2 s);
``postgres_database`` makes a fresh database on it. Under pytest-xdist (the README's
``pytest`` runs ``-n 3``) "the run" is each worker: every worker starts its own peers on free
ports in its own temporary folders. The scheduler sends a whole test module to one worker
(module-scoped servers are started once) and the Spark suite's modules to one worker (one
Spark session, one JVM: ``xdist_units.SPARK_WORKERS``), the longest units first.

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
import time
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from artemis.broker import ArtemisBroker, cached_artemis_home

_TESTS = Path(__file__).resolve().parent

# No verdict may depend on how busy the machine is: Hypothesis's per-example deadline and its
# "input generation is slow" health check both do (a loaded 2-core machine trips them), so the
# suite's profile turns them off. HYPOTHESIS_PROFILE=default brings them back. The default run
# draws fewer examples (50 where a test names none, a quarter where it does: examples.py);
# HYPOTHESIS_PROFILE=full, .ci/run's property step, draws them all.
settings.register_profile(
    "sendonce", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=50
)
settings.register_profile(
    "full", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=100
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "sendonce"))

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


def pytest_configure(config: pytest.Config) -> None:
    # The fault suite's rotating seeds (tests/faults/suite.py): chosen once, here, before
    # pytest-xdist starts its workers (they inherit the environment and collect the same).
    os.environ.setdefault("SENDONCE_FAULT_ROTATION", str(int(time.time() // 86400)))


def pytest_report_header(config: pytest.Config) -> str:
    return f"fault seeds: SENDONCE_FAULT_ROTATION={os.environ['SENDONCE_FAULT_ROTATION']}"


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
    unrunnable: list[pytest.Item] = []
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
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
                unrunnable.append(item)
            else:
                item.add_marker(pytest.mark.skip(reason=f"{reason} {_MISSING_TAG}"))
            break
    if required and missing:
        reasons = "\n  ".join(sorted(set(missing)))
        message = (
            f"SENDONCE_REQUIRE_COMPONENTS=1: {len(missing)} test(s) would be skipped for a "
            f"missing component (CI must not pass by skipping):\n  {reasons}"
        )
        if not hasattr(config, "workerinput"):
            raise pytest.UsageError(message)
        # In a pytest-xdist worker a usage error only crashes the worker: fail the tests.
        for item in unrunnable:
            item.stash[_REQUIRED_BUT_MISSING] = message


_REQUIRED_BUT_MISSING = pytest.StashKey[str]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    message = item.stash.get(_REQUIRED_BUT_MISSING, None)
    if message is not None:
        pytest.fail(message, pytrace=False)


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


def _pgserver() -> Any:
    """``tests/functional/ledger/pgserver.py``, imported as ``pgserver`` (as its users do)."""
    import sys

    if "pgserver" not in sys.modules:
        path = _TESTS / "functional" / "ledger" / "pgserver.py"
        spec = importlib.util.spec_from_file_location("pgserver", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["pgserver"] = module
        spec.loader.exec_module(module)
    return sys.modules["pgserver"]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """One throwaway PostgreSQL cluster for the run (each xdist worker's own): its url.

    Tests keep apart by database (``postgres_database``), never by a cluster of their own
    unless they stop, kill or reconfigure it."""
    with _pgserver().throwaway_cluster() as url:
        yield url


_databases = iter(range(1, 1 << 30))


@pytest.fixture
def postgres_database(postgres_server: str) -> Any:
    """A factory: ``postgres_database("prefix")`` creates a new, empty database on the run's
    cluster and returns its url."""

    def create(prefix: str = "test") -> str:
        import psycopg

        name = f"{prefix}_{next(_databases)}"
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return postgres_server.rsplit("/", 1)[0] + f"/{name}"

    return create


# -- pytest-xdist: which tests share a worker ---------------------------------------------------

# Long modules with no module-scoped server: each test is a unit of its own (one module would
# keep one worker busy for minutes while the others have nothing left).
# The fault schedules too (each seed starts its own producers and peers; ``pytest -m slow
# tests/faults`` runs 560 of them), and the Spark samples and demo (each its own Spark JVM in a
# subprocess, 2-4 min each at load 12: in one unit they would end the run alone).
_PER_TEST = (
    "tests/functional/test_doc_snippets.py",
    "tests/unit/test_ids_properties.py",
    "tests/faults/test_schedules.py",
    "tests/integration/spark/test_spark_samples_and_demo.py",
)


def _unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: its module, one of the Spark suite's units (its modules
    split between ``SPARK_WORKERS`` workers, one Spark session each), or the test itself in a
    ``_PER_TEST`` module."""
    from xdist_units import SPARK_FOLDER, spark_unit

    path = nodeid.split("::", 1)[0]
    if path in _PER_TEST:
        return nodeid
    return spark_unit(path) if path.startswith(SPARK_FOLDER) else path


if importlib.util.find_spec("xdist") is not None:

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """``--dist loadfile`` with the units above, the longest (measured) first."""
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadScopeScheduling

        from xdist_units import expected_seconds

        class UnitScheduling(LoadScopeScheduling):
            _ordered = False

            def _split_scope(self, nodeid: str) -> str:
                return _unit_of(nodeid)

            def _assign_work_unit(self, node: Any) -> None:
                # LoadScopeScheduling queues units by test count; a long unit started last
                # would end the run alone: queue them by expected duration instead.
                if not self._ordered:
                    self._ordered = True
                    slow = config.getoption("markexpr", "").strip() == "slow"
                    units = sorted(
                        self.workqueue.items(),
                        key=lambda unit: -expected_seconds(unit[0], len(unit[1]), slow=slow),
                    )
                    self.workqueue.clear()
                    self.workqueue.update(units)
                super()._assign_work_unit(node)

        return UnitScheduling(config, log)
