"""Random fault schedules end with every business message stored as the SDK promised.

Each seed is one schedule (see ``schedule.py``): real producer processes over a
real broker file, ``FaultyBackend`` faults, SIGKILLs and restarts, overlapping
producers, partitioned/session/topic entities, windows near their minimum
under a fast clock, and the emulator with the real ``azure-servicebus`` client.
A failure prints its seed, the schedule and the replay command.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .suite import run_seed

pytestmark = pytest.mark.timeout(300)


def test_schedule_keeps_exactly_once(schedule_seed: int, tmp_path: Path) -> None:
    outcome = run_seed(schedule_seed, tmp_path)
    assert outcome.ok, outcome.explain()


@pytest.mark.slow
def test_many_schedules_keep_exactly_once(schedule_seed: int, tmp_path: Path) -> None:
    outcome = run_seed(schedule_seed, tmp_path)
    assert outcome.ok, outcome.explain()


@pytest.mark.slow
def test_schedules_cancelling_tasks_keep_exactly_once(cancelling_seed: int, tmp_path: Path) -> None:
    outcome = run_seed(cancelling_seed, tmp_path)
    assert outcome.ok, outcome.explain()
