"""How long each scheduling unit of the suite takes (seconds, one worker of ``pytest -n 3`` on
the 2-core machine, measured): the xdist scheduler (``conftest.py``) starts the longest first,
so that no long unit is left to end the run alone. A unit missing here (a new module) is
guessed from its test count; the table is a hint, never a verdict.
"""

from __future__ import annotations

__all__ = ["expected_seconds"]

# Measured on 2026-11-28 at load 20 (other work beside it): the ratios matter, not the values.
MEASURED: dict[str, float] = {
    "tests/integration/spark/": 1179,
    "tests/functional/test_doc_snippets.py": 919,  # per test (conftest._PER_TEST): 57 each
    "tests/unit/test_ids_properties.py": 301,  # per test: 21 each
    "tests/functional/local/test_local_sharing.py": 246,
    "tests/integration/aio/test_aio_servicebus.py": 227,
    "tests/integration/artemis/test_artemis_backend.py": 113,
    "tests/functional/test_bench_smoke.py": 98,
    "tests/integration/emulator/test_cross_client.py": 94,
    "tests/integration/emulator/test_emulator_client.py": 83,
    "tests/functional/cli/test_missing_components.py": 83,
    "tests/unit/test_message_factory.py": 74,
    "tests/integration/emulator/test_emulator_sender.py": 64,
    "tests/functional/ledger/test_ledger_doubt_bounds.py": 55,
    "tests/faults/test_schedules.py": 51,
    "tests/functional/cli/test_cli_permissions.py": 51,
    "tests/functional/cli/test_cli_ledger.py": 49,
    "tests/unit/test_ids.py": 47,
    "tests/unit/servicebus/test_over_emulator.py": 46,
    "tests/integration/emulator/test_emulator_robust_server.py": 45,
    "tests/integration/emulator/test_emulator_robust_entities.py": 44,
    "tests/functional/test_sigint_ignored_by_the_runner.py": 39,
}
_PER_TEST_SECONDS = {
    "tests/functional/test_doc_snippets.py": 57,
    "tests/unit/test_ids_properties.py": 21,
}


def expected_seconds(unit: str, tests: int) -> float:
    """The unit's measured duration, or a guess from its number of tests."""
    module = unit.split("::", 1)[0]
    if module != unit and module in _PER_TEST_SECONDS:
        return _PER_TEST_SECONDS[module]
    return MEASURED.get(unit, 0.3 * tests)
