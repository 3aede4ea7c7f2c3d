"""IdempotentSender over the real local broker (a SQLite file), with injected faults."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sendonce import (
    ConfigurationError,
    EntityProfile,
    IdempotentSender,
    InDoubtError,
    KeyRuleError,
    Message,
    MessageSizeError,
    MessageSpec,
    PayloadConflictError,
    PermanentSendError,
    RetryPolicy,
    ValidationError,
)
from sendonce.backends import LocalBackend
from sendonce.testing import Fault, FaultyBackend


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def retry(fake_time: FakeTime) -> RetryPolicy:
    return RetryPolicy(sleep=fake_time.sleep, clock=fake_time.clock, jitter=False)


@pytest.fixture
def broker(tmp_path: Path) -> LocalBackend:
    backend = LocalBackend(tmp_path / "broker.db")
    yield backend
    backend.close()


def msg(i: int | str, body: str = "body", **kw: object) -> Message:
    return Message(body, message_id=f"order-{i}", **kw)  # type: ignore[arg-type]


def ids_in(broker: LocalBackend, entity: str) -> Counter[str]:
    return Counter(broker.message_ids(entity))


# -- in-doubt resends ------------------------------------------------------------------


def test_resend_after_commit_without_ack_leaves_one_message(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    faulty = FaultyBackend(broker, [Fault.AFTER_COMMIT, Fault.AFTER_COMMIT])
    with IdempotentSender(faulty, EntityProfile("orders"), retry=retry) as sender:
        result = sender.send(msg(1))
    assert result.outcome == "sent"  # the duplicate ack is our own earlier attempt
    assert result.attempts == 3
    assert [c.message_ids for c in faulty.calls] == [("order-1",)] * 3
    assert ids_in(broker, "orders") == {"order-1": 1}


def test_drop_before_commit_is_resent_once(broker: LocalBackend, retry: RetryPolicy) -> None:
    faulty = FaultyBackend(broker, [Fault.BEFORE_COMMIT])
    with IdempotentSender(faulty, EntityProfile("orders"), retry=retry) as sender:
        result = sender.send(msg(1))
    assert (result.outcome, result.attempts) == ("sent", 2)
    assert ids_in(broker, "orders") == {"order-1": 1}


def test_slow_ack_times_out_and_the_resend_is_dropped(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    faulty = FaultyBackend(broker, [Fault.SLOW_ACK], sleep=lambda s: None)
    with IdempotentSender(faulty, EntityProfile("orders"), retry=retry) as sender:
        result = sender.send(msg(1))
    assert (result.outcome, result.attempts) == ("sent", 2)
    assert ids_in(broker, "orders") == {"order-1": 1}


def test_duplicate_without_earlier_doubt_is_reported_duplicate(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    with IdempotentSender(broker, EntityProfile("orders"), retry=retry) as sender:
        assert sender.send(msg(1)).outcome == "sent"
    with IdempotentSender(broker, EntityProfile("orders"), retry=retry) as restarted:
        assert restarted.send(msg(1)).outcome == "duplicate"
    assert ids_in(broker, "orders") == {"order-1": 1}


def test_permanent_error_is_not_retried_and_stores_nothing(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    faulty = FaultyBackend(broker, [Fault.PERMANENT])
    with IdempotentSender(faulty, EntityProfile("orders"), retry=retry) as sender:
        with pytest.raises(PermanentSendError) as info:
            sender.send(msg(1))
    assert info.value.message_id == "order-1"
    assert len(faulty.calls) == 1
    assert broker.count("orders") == 0


def test_retries_stop_at_the_deadline_with_in_doubt_error(
    broker: LocalBackend, fake_time: FakeTime
) -> None:
    """Every attempt hangs until its timeout; the window is 20 s, the margin 5 s."""
    faulty = FaultyBackend(broker, lambda i, e, m: Fault.SLOW_ACK, sleep=fake_time.sleep)
    retry = RetryPolicy(
        max_attempts=50,
        attempt_timeout=4.0,
        initial_backoff=1.0,
        max_backoff=2.0,
        jitter=False,
        sleep=fake_time.sleep,
        clock=fake_time.clock,
    )
    profile = EntityProfile("orders", duplicate_detection_window=timedelta(seconds=20))
    with IdempotentSender(faulty, profile, retry=retry) as sender:
        with pytest.raises(InDoubtError) as info:
            sender.send(msg(7, partition_key="p7"))
    err = info.value
    assert err.message_id == "order-7"
    assert err.partition_key == "p7"
    assert 1 < err.attempts == len(faulty.calls) < 50
    assert fake_time.now <= 15.0 + 1e-9  # nothing in flight after first attempt + window - margin
    assert err.elapsed <= timedelta(seconds=15)
    assert ids_in(broker, "orders") == {"order-7": 1}  # committed by the first slow attempt


# -- batching and accounting -----------------------------------------------------------


def test_send_many_never_mixes_partition_keys_or_sessions(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    profile = EntityProfile("orders", sessions=True)
    faulty = FaultyBackend(broker)
    messages = [msg(i, session_id=f"s{i % 3}") for i in range(30)]
    with IdempotentSender(faulty, profile, retry=retry) as sender:
        report = sender.send_many(messages)
    assert (report.sent, report.duplicates, report.failed) == (30, 0, 0)
    by_id = {m.message_id: m.session_id for m in messages}
    for call in faulty.calls:
        assert len({by_id[i] for i in call.message_ids}) == 1
    assert len(faulty.calls) == 3


def test_partitioned_entity_with_dedup_sends_one_message_per_transfer(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    faulty = FaultyBackend(broker)
    with IdempotentSender(faulty, EntityProfile("orders", partitioned=True), retry=retry) as s:
        report = s.send_many([msg(i, partition_key="p") for i in range(5)])
    assert report.sent == 5
    assert [len(c.message_ids) for c in faulty.calls] == [1] * 5


def test_batches_respect_the_entity_size_limit(broker: LocalBackend, retry: RetryPolicy) -> None:
    faulty = FaultyBackend(broker)
    profile = EntityProfile("orders", max_message_size=4096)
    with IdempotentSender(faulty, profile, retry=retry) as sender:
        report = sender.send_many([msg(i, body="x" * 1000) for i in range(10)])
    assert report.sent == 10
    assert len(faulty.calls) >= 3
    assert all(len(c.message_ids) * 1000 <= 4096 for c in faulty.calls)


def test_every_message_is_accounted_for_when_some_transfers_fail(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    faulty = FaultyBackend(broker, [Fault.NONE, Fault.PERMANENT, Fault.AFTER_COMMIT, Fault.NONE])
    messages = [msg(i, partition_key=f"k{i % 3}") for i in range(9)]
    with IdempotentSender(faulty, EntityProfile("orders"), retry=retry) as sender:
        report = sender.send_many(messages)
    assert report.total == 9
    assert report.failed == 3
    assert report.sent == 6
    failed_ids = {f.message_id for f in report.failures}
    assert failed_ids == {m.message_id for m in messages if m.partition_key == "k1"}
    assert all(isinstance(f.error, PermanentSendError) for f in report.failures)
    assert set(broker.message_ids("orders")) == {m.message_id for m in messages} - failed_ids
    with pytest.raises(PermanentSendError) as info:
        report.raise_for_failures()
    assert "2 more message(s) failed" in " ".join(info.value.__notes__)


def test_in_doubt_batch_lists_each_message(broker: LocalBackend, fake_time: FakeTime) -> None:
    faulty = FaultyBackend(broker, [Fault.BEFORE_COMMIT] * 3)
    retry = RetryPolicy(max_attempts=3, jitter=False, sleep=fake_time.sleep, clock=fake_time.clock)
    with IdempotentSender(faulty, EntityProfile("orders"), retry=retry) as sender:
        report = sender.send_many([msg(1), msg(2)])
    assert report.in_doubt == ["order-1", "order-2"]
    assert all(isinstance(f.error, InDoubtError) for f in report.failures)
    assert {f.error.message_id for f in report.failures} == {"order-1", "order-2"}
    # resending the in-doubt ids inside the window is safe and completes them
    with IdempotentSender(broker, EntityProfile("orders"), retry=retry) as sender:
        assert sender.send_many([msg(1), msg(2)]).sent == 2
    assert ids_in(broker, "orders") == {"order-1": 1, "order-2": 1}


def test_repeat_inside_one_call_is_reported_duplicate_and_stored_once(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    with IdempotentSender(broker, EntityProfile("orders"), retry=retry) as sender:
        report = sender.send_many([msg(1), msg(2), msg(1)])
    assert [r.outcome for r in report.results] == ["sent", "sent", "duplicate"]
    assert ids_in(broker, "orders") == {"order-1": 1, "order-2": 1}


# -- payload conflicts and bad input ---------------------------------------------------


def test_same_id_different_body_is_a_payload_conflict(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    with IdempotentSender(broker, EntityProfile("orders"), retry=retry) as sender:
        sender.send(msg(1, body="paid 10"))
        with pytest.raises(PayloadConflictError) as info:
            sender.send_many([msg(2), msg(1, body="paid 20")])
        assert info.value.message_id == "order-1"
        sender.send(msg(1, body="paid 10"))  # the same payload again is fine
    assert ids_in(broker, "orders") == {"order-1": 1}  # order-2 was not sent either


def test_conflict_inside_one_call_sends_nothing(broker: LocalBackend, retry: RetryPolicy) -> None:
    with IdempotentSender(broker, EntityProfile("orders"), retry=retry) as sender:
        with pytest.raises(PayloadConflictError):
            sender.send_many([msg(1, body="a"), msg(1, body="b")])
    assert broker.count("orders") == 0


def test_payload_memory_is_bounded(broker: LocalBackend, retry: RetryPolicy) -> None:
    with IdempotentSender(broker, EntityProfile("orders"), retry=retry, memory_size=10) as sender:
        for chunk in range(5):
            sender.send_many([msg(chunk * 10 + i) for i in range(10)])
        assert len(sender._memory.entries) <= 10
        # an id forgotten by the sender is still protected by the broker
        assert sender.send(msg(0, body="different")).outcome == "duplicate"


@pytest.mark.parametrize(
    ("bad", "error", "field"),
    [
        (lambda: msg(99, body="x" * 5000, session_id="s"), MessageSizeError, "body"),
        (lambda: Message("b", message_id="no-session"), KeyRuleError, "session_id"),
        (lambda: "not a message", ValidationError, "message"),
    ],
)
def test_invalid_message_in_a_batch_sends_nothing(
    broker: LocalBackend, retry: RetryPolicy, bad: object, error: type, field: str
) -> None:
    profile = EntityProfile("orders", sessions=True, max_message_size=4096)
    good = [msg(i, session_id="s") for i in range(3)]
    with IdempotentSender(broker, profile, retry=retry) as sender, pytest.raises(error) as info:
        sender.send_many([*good, bad(), *good])  # type: ignore[operator]
    assert info.value.field == field
    assert "messages[3]" in str(info.value)
    assert "nothing" in str(info.value)
    assert broker.count("orders") == 0


def test_entity_without_duplicate_detection_is_refused(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    basic = EntityProfile("basic", duplicate_detection=False)
    with pytest.raises(ConfigurationError) as info:
        IdempotentSender(broker, basic, retry=retry)
    assert info.value.field == "duplicate_detection"
    assert "require_duplicate_detection=False" in str(info.value)
    with IdempotentSender(broker, basic, retry=retry, require_duplicate_detection=False) as s:
        s.send(msg(1))
        s.send(msg(1))
    assert broker.count("basic") == 2  # at-least-once, as the caller accepted


def test_entity_by_name_is_described_by_the_backend(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    broker.create_entity(EntityProfile("orders", partitioned=True))
    with IdempotentSender(broker, "orders", retry=retry) as sender:
        assert sender.profile.partitioned
    with pytest.raises(ConfigurationError):
        IdempotentSender(broker, "missing", retry=retry)


# -- partitioning and windows ----------------------------------------------------------


def test_same_id_different_partition_keys(broker: LocalBackend, retry: RetryPolicy) -> None:
    with IdempotentSender(broker, EntityProfile("part", partitioned=True), retry=retry) as s:
        s.send(msg(1, partition_key="a"))
        s.send(msg(1, partition_key="b"))
    with IdempotentSender(broker, EntityProfile("flat"), retry=retry) as s:
        s.send(msg(1, partition_key="a"))
        assert s.send(msg(1, partition_key="b")).outcome == "duplicate"
    assert broker.count("part") == 2
    assert broker.count("flat") == 1


def test_same_id_is_accepted_again_after_the_window(tmp_path: Path, retry: RetryPolicy) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    broker = LocalBackend(tmp_path / "b.db", clock=lambda: now[0])
    profile = EntityProfile("orders", duplicate_detection_window=timedelta(seconds=30))
    with broker, IdempotentSender(broker, profile, retry=retry) as sender:
        sender.send(msg(1))
        now[0] += timedelta(seconds=29)
        assert IdempotentSender(broker, profile, retry=retry).send(msg(1)).outcome == "duplicate"
        now[0] += timedelta(seconds=2)
        assert IdempotentSender(broker, profile, retry=retry).send(msg(1)).outcome == "sent"
        assert broker.count("orders") == 2


# -- scheduling and transactions -------------------------------------------------------


def test_schedule_reports_a_sequence_number(broker: LocalBackend, retry: RetryPolicy) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    faulty = FaultyBackend(broker, [Fault.NONE, Fault.AFTER_COMMIT])
    with IdempotentSender(faulty, EntityProfile("orders"), retry=retry) as sender:
        first = sender.schedule(msg(0), at)
        assert (first.outcome, first.attempts) == ("scheduled", 1)
        assert isinstance(first.sequence_number, int)
        result = sender.schedule(msg(1), at)  # first attempt committed, ack lost
        assert result.outcome == "scheduled"
        assert result.attempts == 2
        assert result.sequence_number is None  # unknown: the retry's number may be a dropped copy
        with pytest.raises(ValidationError) as info:
            sender.schedule(msg(2), datetime(2030, 1, 1))  # naive
        assert info.value.field == "at"
    assert sorted(broker.message_ids("orders")) == ["order-0", "order-1"]
    assert broker.count("orders") == 0  # not deliverable before its time


def test_transaction_commits_all_or_nothing(broker: LocalBackend, retry: RetryPolicy) -> None:
    profile = EntityProfile("artemis", id_cache_size=100)
    with IdempotentSender(broker, profile, retry=retry) as sender:
        with sender.transaction() as tx:
            tx.send(msg(1))
            tx.send(msg(2))
        assert tx.report is not None and tx.report.sent == 2
        with sender.transaction() as tx:
            tx.send_many([msg(3), msg(2)])  # order-2 is a duplicate: the whole group is ignored
        assert tx.report is not None
        assert (tx.report.duplicates, tx.report.failed) == (1, 1)
        lost = tx.report.failures[0]
        assert lost.message_id == "order-3"  # not stored: a failure, never a silent "duplicate"
        assert isinstance(lost.error, PermanentSendError)
        assert lost.error.condition == "sendonce:group-ignored"
        assert "order-2" in str(lost.error)
        with pytest.raises(ConfigurationError), sender.transaction():
            sender.send(msg(4))  # inside a transaction, sends go through tx.send
        with pytest.raises(RuntimeError), sender.transaction() as tx:
            tx.send(msg(5))
            raise RuntimeError("application failed mid-group")
    assert ids_in(broker, "artemis") == {"order-1": 1, "order-2": 1}


def test_spec_builds_messages_the_sender_accepts(broker: LocalBackend, retry: RetryPolicy) -> None:
    spec = MessageSpec("{order_id}.{year}/payment", session_id="{customer}")
    records = [{"order_id": i, "year": 2017, "customer": f"c{i % 2}"} for i in range(4)]
    with IdempotentSender(broker, EntityProfile("s", sessions=True), retry=retry) as sender:
        report = sender.send_many(spec.to_message(r) for r in records)
    assert report.sent == 4
    assert sorted(broker.message_ids("s")) == [f"{i}.2017/payment" for i in range(4)]


# -- resuming a crashed call -----------------------------------------------------------


def test_resume_with_original_first_attempt_keeps_the_deadline(
    broker: LocalBackend, fake_time: FakeTime
) -> None:
    """A restarted producer resends its in-flight message with the original first attempt."""
    retry = RetryPolicy(jitter=False, sleep=fake_time.sleep, clock=fake_time.clock)
    profile = EntityProfile("orders", duplicate_detection_window=timedelta(seconds=60))
    faulty = FaultyBackend(broker)
    fake_time.now = 1000.0
    with IdempotentSender(faulty, profile, retry=retry) as sender:
        # first attempted 50 s ago: 5 s left before first attempt + window - margin
        assert sender.send(msg(1), first_attempt=950.0).outcome == "sent"
        # first attempted 56 s ago: past the deadline, so nothing may be sent
        with pytest.raises(InDoubtError) as info:
            sender.send(msg(2), first_attempt=944.0)
        assert info.value.attempts == 0
        report = sender.send_many([msg(3), msg(4)], first_attempt=944.0)
        assert report.in_doubt == ["order-3", "order-4"]
        wall = datetime.now(UTC) - timedelta(seconds=120)
        with pytest.raises(InDoubtError):
            sender.send(msg(5), first_attempt=wall)
        with pytest.raises(ValidationError) as bad:
            sender.send(msg(6), first_attempt=datetime(2026, 1, 1))  # naive
        assert bad.value.field == "first_attempt"
    assert [c.message_ids for c in faulty.calls] == [("order-1",)]
    assert broker.message_ids("orders") == ["order-1"]


def test_transaction_resumed_past_its_deadline_sends_nothing(
    broker: LocalBackend, fake_time: FakeTime
) -> None:
    retry = RetryPolicy(jitter=False, sleep=fake_time.sleep, clock=fake_time.clock)
    profile = EntityProfile("orders", duplicate_detection_window=timedelta(seconds=60))
    fake_time.now = 1000.0
    with IdempotentSender(broker, profile, retry=retry) as sender:
        with pytest.raises(InDoubtError), sender.transaction(first_attempt=944.0) as tx:
            tx.send(msg(1))
            tx.send(msg(2))
        with sender.transaction(first_attempt=990.0) as tx:
            tx.send(msg(3))
        assert tx.report is not None and tx.report.sent == 1
    assert broker.message_ids("orders") == ["order-3"]


# -- issue 14: results in input order --------------------------------------------------


def test_results_and_failures_come_back_in_input_order(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    # Sessions group the transfers (s0, s1, s2) and repeats are settled last; the report
    # still lists results as the caller gave the messages.
    profile = EntityProfile("orders", sessions=True)
    messages = [msg(i, session_id=f"s{i % 3}") for i in range(9)]
    messages.insert(4, messages[1])  # a repeat inside the call
    with IdempotentSender(broker, profile, retry=retry) as sender:
        report = sender.send_many(messages)
    assert [r.message_id for r in report.results] == [m.message_id for m in messages]
    assert [r.outcome for r in report.results].count("duplicate") == 1
    assert report.results[4].outcome == "duplicate"


def test_failures_follow_input_order_too(broker: LocalBackend, retry: RetryPolicy) -> None:
    profile = EntityProfile("orders", sessions=True)
    messages = [msg(i, session_id=f"s{i % 2}") for i in range(4)]
    faulty = FaultyBackend(broker, [Fault.PERMANENT, Fault.PERMANENT])
    with IdempotentSender(faulty, profile, retry=retry) as sender:
        report = sender.send_many(messages)
    assert [f.message_id for f in report.failures] == [m.message_id for m in messages]


def test_a_configuration_error_on_a_retry_carries_no_tenacity_frames(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    import traceback

    from sendonce import ConfigurationError

    faulty = FaultyBackend(broker, [Fault.BEFORE_COMMIT])
    with IdempotentSender(faulty, EntityProfile("orders"), retry=retry) as sender:
        broker.close()  # the retry meets a setup error (a closed backend), not a send error
        with pytest.raises(ConfigurationError) as info:
            sender.send(msg(1))
    shown = "".join(traceback.format_exception(info.value))
    assert "/tenacity/" not in shown and "/concurrent/" not in shown
    assert "During handling" not in shown and "direct cause" not in shown
