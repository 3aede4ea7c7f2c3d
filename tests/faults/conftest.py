"""Options of the fault-schedule suite: ``--seed N`` (repeatable) replays given seeds."""

from __future__ import annotations

import pytest

from .schedule import generate
from .suite import DEFAULT_SEEDS, SLOW_SEEDS


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed", action="append", type=int, default=[],
        help="run these fault-schedule seeds instead of the default set (repeatable)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "schedule_seed" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--seed")
        slow = metafunc.definition.get_closest_marker("slow") is not None
        seeds = tuple(chosen) or (SLOW_SEEDS if slow else DEFAULT_SEEDS)
        params = [
            pytest.param(
                s, id=f"seed{s}",
                marks=[pytest.mark.emulator] if generate(s)["transport"] == "emulator" else [],
            )
            for s in seeds
        ]
        metafunc.parametrize("schedule_seed", params)
