"""How long each scheduling unit of the suite takes (seconds, one worker of ``pytest -n 3`` on
the 2-core machine, measured): the xdist scheduler (``conftest.py``) starts the longest first,
so that no long unit is left to end the run alone. A unit missing here (a new module) is
guessed from its test count; the table is a hint, never a verdict.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SPARK_FOLDER", "SPARK_WORKERS", "expected_seconds", "spark_unit"]

# Measured on 2026-11-28 in one default run at load 6-13 (other work beside it), worker-seconds
# of each unit; the ratios matter, not the values. A per-test unit (conftest._PER_TEST) may be
# named by its node id; the rest of its module takes _PER_TEST_SECONDS.
MEASURED: dict[str, float] = {
    "tests/integration/spark/test_spark_samples_and_demo.py::"
    "test_the_spark_demo_proves_exactly_once": 150,
    "tests/functional/test_doc_snippets.py::test_each_snippet_runs_on_its_own[README.md:122]": 125,
    "tests/functional/cli/test_missing_components.py": 80,  # 114 with three xdist workers each
    "tests/integration/spark/test_spark_samples_and_demo.py::"
    "test_sample_runs_standalone[spark_streaming.py]": 92,
    "tests/functional/test_bench_smoke.py": 88,
    "tests/integration/spark/test_spark_samples_and_demo.py::"
    "test_sample_runs_standalone[spark_batch.py]": 66,
    "tests/integration/artemis/test_artemis_submit.py": 61,
    "tests/functional/local/test_local_sharing.py": 56,
    "tests/integration/artemis/test_artemis_backend.py": 56,
    "tests/integration/emulator/test_emulator_robust_entities.py": 55,
    "tests/integration/emulator/test_emulator_sender.py": 50,
    "tests/functional/test_reference_site.py": 49,
    "tests/integration/emulator/test_emulator_client.py": 47,
    "tests/integration/emulator/test_in_flight_servicebus.py": 46,
    "tests/integration/aio/test_aio_servicebus.py": 46,
    "tests/integration/emulator/test_emulator_robust_server.py": 46,
    "tests/functional/ledger/test_ledger_doubt_bounds.py": 45,
    "tests/functional/test_doc_snippets.py::test_the_cli_page_commands_run_as_written": 43,
    "tests/integration/artemis/test_artemis_faults.py": 37,
    "tests/functional/outbox/test_outbox_chaos.py": 37,
    "tests/integration/emulator/test_cross_client.py": 36,
    "tests/integration/artemis/test_broker_ports.py": 35,
    "tests/functional/local/test_local_lock_contention.py": 35,
    "tests/unit/test_docstrings_and_typing.py": 33,
    "tests/functional/ledger/test_ledger_run.py": 32,
    "tests/functional/cli/test_cli_permissions.py": 30,
    "tests/unit/servicebus/test_over_emulator.py": 28,
    "tests/functional/test_sigint_ignored_by_the_runner.py": 27,
    "tests/faults/test_ledger_schedules.py": 27,
    "tests/integration/emulator/test_emulator_settings.py": 26,
    "tests/integration/emulator/test_emulator_fidelity.py": 26,
    "tests/integration/emulator/test_emulator_dead_letter.py": 25,
    "tests/integration/combos/test_outbox_to_artemis.py": 25,
    "tests/functional/test_wheel.py": 24,
    "tests/functional/cli/test_cli_ledger.py": 24,
}
# The slow tests of a module (``pytest -m slow``, as .ci/run runs them), load 7-19, one process.
SLOW_MEASURED: dict[str, float] = {
    "tests/integration/spark/test_spark_cluster.py": 660,
    "tests/functional/test_streaming.py": 230,
    "tests/integration/emulator/test_cli_declared_rule_crash.py": 219,
    "tests/faults/test_ledger_schedules.py": 200,
    "tests/integration/spark/test_spark_connect.py": 137,
    "tests/integration/spark/#1": 215,  # Spark to Artemis, with and without a ledger
    "tests/integration/artemis/test_artemis_submit.py": 31,
}
# The Spark suite's modules (their tests' worker-seconds in the default run above) go in
# SPARK_WORKERS units: each unit stays on one worker, which runs one Spark session (a JVM) for
# all the Spark modules it gets, so at most that many Spark sessions run at once. One: the
# modules take about half of what one worker does in a run (540 of 1,180 s above), and a
# second session would cost a JVM start and its memory beside the other peers. The samples
# and demo start their own JVMs: one unit per test.
SPARK_FOLDER = "tests/integration/spark/"
SPARK_WORKERS = 1
SPARK_MEASURED: dict[str, float] = {
    "test_spark_guard.py": 106,
    "test_spark_servicebus.py": 67,
    "test_spark_artemis.py": 67,
    "test_spark_ledger_stores.py": 57,
    "test_spark_ledger_driver.py": 43,
    "test_spark_publishers.py": 38,
    "test_spark_failures.py": 30,
    "test_spark_publish.py": 29,
    "test_spark_telemetry.py": 26,
    "test_spark_shared_broker.py": 25,
    "test_spark_ledger_reruns.py": 20,
    "test_spark_ledger.py": 16,
    "test_spark_in_flight.py": 10,
    "test_spark_rows.py": 6,
    "test_spark_artemis_ledger.py": 0,  # slow only (136 s)
}
# Spark modules that start their own JVMs (a standalone cluster, Spark Connect servers,
# samples in subprocesses): units of their own, on any worker.
_OWN_JVMS = {"test_spark_cluster.py", "test_spark_connect.py", "test_spark_samples_and_demo.py"}
_SPARK_MODULE_GUESS = 30  # a Spark module missing above

_PER_TEST_SECONDS = {
    "tests/functional/test_doc_snippets.py": 8,
    "tests/unit/test_ids_properties.py": 3,
    "tests/faults/test_schedules.py": 12,
    "tests/integration/spark/test_spark_samples_and_demo.py": 90,
}


def _spark_units() -> dict[str, str]:
    """Each Spark module's unit: the longest modules first, each into the lightest unit."""
    modules = sorted(
        p.name
        for p in (Path(__file__).parent / "integration" / "spark").glob("test_*.py")
        if p.name not in _OWN_JVMS
    )
    loads = [0.0] * SPARK_WORKERS
    units: dict[str, str] = {}
    for name in sorted(modules, key=lambda m: -SPARK_MEASURED.get(m, _SPARK_MODULE_GUESS)):
        lightest = loads.index(min(loads))
        loads[lightest] += SPARK_MEASURED.get(name, _SPARK_MODULE_GUESS)
        units[SPARK_FOLDER + name] = f"{SPARK_FOLDER}#{lightest + 1}"
    for index, load in enumerate(loads):
        _SPARK_UNIT_SECONDS[f"{SPARK_FOLDER}#{index + 1}"] = load
    return units


_SPARK_UNIT_SECONDS: dict[str, float] = {}
_SPARK_UNITS: dict[str, str] = {}


def spark_unit(module: str) -> str:
    """The scheduling unit of a Spark module: ``tests/integration/spark/#N`` for the modules
    sharing the worker's Spark session, the module itself for one that starts its own JVMs."""
    if not _SPARK_UNITS:
        _SPARK_UNITS.update(_spark_units())
    return _SPARK_UNITS.get(module, module)


def expected_seconds(unit: str, tests: int, *, slow: bool = False) -> float:
    """The unit's measured duration (of its slow tests when ``slow``: ``pytest -m slow``), or
    a guess from its number of tests."""
    if slow:
        return SLOW_MEASURED.get(unit, _PER_TEST_SECONDS.get(unit.split("::", 1)[0], 0.3 * tests))
    if unit in _SPARK_UNIT_SECONDS:
        return _SPARK_UNIT_SECONDS[unit]
    if unit in MEASURED:
        return MEASURED[unit]
    module = unit.split("::", 1)[0]
    if module != unit and module in _PER_TEST_SECONDS:
        return _PER_TEST_SECONDS[module]
    return 0.3 * tests
