"""Bugs the fault-schedule suite found, each replayed from its seed and as a minimal case.

A test marked ``xfail(strict=True, reason="BUG: ...")`` documents a bug not yet
fixed in the core; when the fix lands it XPASSes, strict mode fails the run,
and the marker comes off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sendonce import (
    EntityProfile,
    IdempotentSender,
    InDoubtError,
    Message,
    PermanentSendError,
    RetryPolicy,
)
from sendonce.backends import LocalBackend
from sendonce.testing import Fault, FaultyBackend

from .suite import run_seed

pytestmark = pytest.mark.timeout(120)


def no_sleep(seconds: float) -> None:
    pass


def test_bug1_permanent_after_in_doubt_is_in_doubt(tmp_path: Path) -> None:
    """BUG-1 (fixed in 4230879): a permanent refusal on a retry after an in-doubt attempt
    was reported as PermanentSendError ("nothing stored"), yet attempt 1 had committed."""
    with LocalBackend(tmp_path / "b.db") as broker:
        faulty = FaultyBackend(broker, [Fault.AFTER_COMMIT, Fault.PERMANENT])
        with IdempotentSender(
            faulty, EntityProfile("q"), retry=RetryPolicy(sleep=no_sleep)
        ) as sender:
            report = sender.send_many([Message("b", message_id="x1")])
        assert broker.message_ids("q") == ["x1"]  # attempt 1 committed
        assert report.failed == 1
        assert isinstance(report.failures[0].error, InDoubtError)
        assert report.in_doubt == ["x1"]


def test_bug1_single_send_raises_in_doubt(tmp_path: Path) -> None:
    with LocalBackend(tmp_path / "b.db") as broker:
        faulty = FaultyBackend(
            broker, [Fault.SLOW_ACK, Fault.PERMANENT], slow_ack_delay=1e9, sleep=no_sleep
        )
        with (
            IdempotentSender(
                faulty, EntityProfile("q"), retry=RetryPolicy(sleep=no_sleep)
            ) as sender,
            pytest.raises(InDoubtError),
        ):
            sender.send(Message("b", message_id="x1"))
        assert broker.message_ids("q") == ["x1"]


def test_bug3_ignored_group_does_not_report_lost_members_as_duplicates(tmp_path: Path) -> None:
    """BUG-3 (fixed in 06102d1 and 342fb02): a group ignored for one duplicate member
    reported every member as 'duplicate'; the others were silently lost."""
    profile = EntityProfile("q", id_cache_size=1000)
    msgs = {n: Message(f"body {n}", message_id=f"m{n}") for n in range(1, 6)}
    with LocalBackend(tmp_path / "b.db") as broker:
        with IdempotentSender(broker, profile) as first, first.transaction() as tx:
            tx.send_many([msgs[1], msgs[2], msgs[3]])
        with IdempotentSender(broker, profile) as second, second.transaction() as tx2:
            tx2.send_many([msgs[3], msgs[4], msgs[5]])
        assert broker.message_ids("q") == ["m1", "m2", "m3"]  # the group was ignored whole
        report = tx2.report
        assert report is not None
        assert report.total == 3  # nothing dropped from the report
        # "sent" or "duplicate" both say "the broker has it": only m3 may claim that
        assert [(r.message_id, r.outcome) for r in report.results] == [("m3", "duplicate")]
        assert {f.message_id for f in report.failures} == {"m4", "m5"}
        assert all(isinstance(f.error, PermanentSendError) for f in report.failures)


def test_bug3_seed_44_replays(tmp_path: Path) -> None:
    """Found by seed 44: two producers' transactional groups overlap on an Artemis entity."""
    outcome = run_seed(44, tmp_path)
    assert outcome.ok, outcome.explain()
