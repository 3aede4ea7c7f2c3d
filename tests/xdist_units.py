"""How long each scheduling unit of the suite takes (seconds, one worker of ``pytest -n 3`` on
the 2-core machine, measured): the xdist scheduler (``conftest.py``) starts the longest first,
so that no long unit is left to end the run alone. A unit missing here (a new module) is
guessed from its test count; the table is a hint, never a verdict.
"""

from __future__ import annotations

__all__ = ["expected_seconds"]

MEASURED: dict[str, float] = {
    "tests/integration/spark/": 240.0,
}


def expected_seconds(unit: str, tests: int) -> float:
    """The unit's measured duration, or a guess from its number of tests."""
    return MEASURED.get(unit, 0.1 * tests)
