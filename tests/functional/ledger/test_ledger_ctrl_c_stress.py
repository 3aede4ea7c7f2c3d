"""Issue 34, finding 15: a Ctrl-C is never lost, however the intent write and the signal race.

``ctrl_c_stress.py`` (beside this file) runs the reported scenario many times in one process:
a sync ``send_many`` with a PostgreSQL ledger waits for its second transfer's intent write
behind another transaction's row lock, SIGINT comes, the lock is released 0.5 s later. Every
run must end with ``KeyboardInterrupt``. A few runs by default, hundreds under ``-m slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _interrupts import sigint_default

SCRIPT = Path(__file__).with_name("ctrl_c_stress.py")

pytestmark = pytest.mark.postgres


def stress(postgres_database: Any, tmp_path: Path, runs: int) -> list[dict[str, Any]]:
    url = postgres_database("ctrl_c")
    with sigint_default():  # the child starts with SIGINT's default action, as at a terminal
        done = subprocess.run(
            [sys.executable, str(SCRIPT), url, str(tmp_path / "broker.db"), str(runs)],
            capture_output=True,
            text=True,
            timeout=60 + 5 * runs,
            check=False,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return [line for line in lines if "run" in line]


def check(results: list[dict[str, Any]], runs: int) -> None:
    assert len(results) == runs
    assert not [r for r in results if r.get("never_waited")], "the write never waited: no test"
    lost = [r for r in results if r["outcome"] != "interrupted"]
    assert not lost, f"{len(lost)} of {runs} runs did not raise KeyboardInterrupt: {lost[:5]}"


def test_ctrl_c_behind_a_row_lock_interrupts_the_call(
    postgres_database: Any, tmp_path: Path
) -> None:
    check(stress(postgres_database, tmp_path, 5), 5)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ctrl_c_behind_a_row_lock_interrupts_the_call_every_time(
    postgres_database: Any, tmp_path: Path
) -> None:
    check(stress(postgres_database, tmp_path, 300), 300)
