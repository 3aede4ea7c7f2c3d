"""The suite can fail: a producer that breaks the SDK's rules is caught, a correct one is not.

One hand-written schedule: a producer SIGKILLs itself right after the broker
committed its second chunk, and restarts a window and a half later (20 s
window, clock ten times faster than real time). Resending that chunk then is
unsafe: the broker has forgotten it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from .checker import check
from .runner import run_schedule
from .schedule import BASE_TIME

pytestmark = pytest.mark.timeout(120)

LATE_RESTART: dict[str, Any] = {
    "seed": -1,
    "transport": "local",
    "emulator_shared": False,
    "entity": {
        "name": "orders",
        "kind": "queue",
        "partitioned": False,
        "sessions": False,
        "explicit_pk": False,
        "window_s": 20,
    },
    "clock": {"base": BASE_TIME, "speed": 10.0},
    "retry": {
        "max_attempts": 3,
        "initial_backoff": 0.2,
        "max_backoff": 2.0,
        "attempt_timeout": 2.0,
        "safety_margin_s": 5,
    },
    "slow_ack_delay": 0.1,
    "chunk": 10,
    "producers": [
        {
            "ids": list(range(30)),
            "incarnations": [
                {
                    "faults": {},
                    "emulator_faults": [],
                    "kill": {"at_call": 1, "phase": "after_commit"},
                    "restart_delay_s": 0.0,
                },
                {"faults": {}, "emulator_faults": [], "kill": None, "restart_delay_s": 30.0},
            ],
        }
    ],
    "external_kill": None,
    "permanent_policy": "abandon",
    "redrive_in_doubt": True,
    "api": "send_many",
    "groups_aligned": True,
    "scheduled_every": 0,
}


def run(schedule: dict[str, Any], tmp_path: Path) -> Any:
    result = run_schedule(schedule, tmp_path)
    assert not result.errors, result.errors
    stored = [(c.message_id, c.body, c.enqueued) for c in result.stored]
    return check(schedule, result.journals, stored)


def test_a_late_restart_leaves_the_in_flight_chunk_in_doubt(tmp_path: Path) -> None:
    verdict = run(LATE_RESTART, tmp_path)
    assert verdict.ok, verdict.violations
    # chunk 1 was committed, then the process died; the restart came too late to resend it
    assert verdict.stats["in_doubt_unconfirmed"] == 10
    assert verdict.stats["in_doubt_present"] == 10
    assert verdict.stats["stored"] == 30


def test_a_naive_resend_after_the_window_is_caught_as_duplicates(tmp_path: Path) -> None:
    naive = copy.deepcopy(LATE_RESTART)
    naive["naive_resume"] = True  # resend the in-flight chunk with a fresh deadline
    verdict = run(naive, tmp_path)
    duplicates = [v for v in verdict.violations if v.startswith("duplicate:")]
    assert len(duplicates) == 10, verdict.violations
    assert verdict.stats["stored"] == 40


def test_a_consumer_beside_the_producers_is_caught_taking_acknowledged_messages(
    tmp_path: Path,
) -> None:
    # the observer runs `sendonce broker receive` instead of read-only commands: every
    # message it takes was acknowledged to the producer, and must be reported missing
    taker = copy.deepcopy(LATE_RESTART)
    taker["producers"][0]["incarnations"] = taker["producers"][0]["incarnations"][:1]
    taker["producers"][0]["incarnations"][0]["kill"] = None
    taker["observer"] = {"commands": ["receive"], "pause_s": 0.05}
    # the CLI reads with the wall clock: so must the broker's stamps be
    taker["wall_clock"] = True
    taker["clock"]["speed"] = 1.0
    taker["entity"]["window_s"] = 600
    result = run_schedule(taker, tmp_path)
    assert not result.errors, result.errors
    assert any(line.startswith("ok receive") for line in result.observer_output)
    stored = [(c.message_id, c.body, c.enqueued) for c in result.stored]
    verdict = check(taker, result.journals, stored)
    missing = [v for v in verdict.violations if v.startswith("missing:")]
    assert missing and len(missing) == 30 - len(stored), verdict.violations
    assert verdict.stats["confirmed"] == 30
