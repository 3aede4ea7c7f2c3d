"""RetryPolicy: only transient errors are retried, never past the window deadline."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendonce import (
    ConfigurationError,
    InDoubtError,
    PermanentSendError,
    RetryPolicy,
    TransientSendError,
)


class FakeTime:
    """A clock that only moves when the policy sleeps or an attempt takes time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def policy(t: FakeTime, **kw: object) -> RetryPolicy:
    defaults: dict[str, object] = {"sleep": t.sleep, "clock": t.clock, "jitter": False}
    defaults.update(kw)
    return RetryPolicy(**defaults)  # type: ignore[arg-type]


def test_success_first_time_makes_one_attempt() -> None:
    t = FakeTime()
    result = policy(t).call(lambda timeout: "ok", window=timedelta(minutes=10), message_id="m")
    assert (result.value, result.attempts, result.in_doubt_before) == ("ok", 1, False)
    assert t.sleeps == []


def test_transient_errors_are_retried_with_backoff_and_flag_in_doubt() -> None:
    t = FakeTime()
    calls: list[float] = []

    def attempt(timeout: float) -> str:
        calls.append(timeout)
        if len(calls) < 3:
            raise TransientSendError("drop", message_id="m")
        return "ok"

    result = policy(t, initial_backoff=0.5, max_backoff=10).call(
        attempt, window=timedelta(minutes=10), message_id="m"
    )
    assert result.value == "ok"
    assert result.attempts == 3
    assert result.in_doubt_before is True
    assert t.sleeps == [0.5, 1.0]


def test_permanent_error_is_not_retried() -> None:
    t = FakeTime()
    calls = []

    def attempt(timeout: float) -> str:
        calls.append(timeout)
        raise PermanentSendError("unauthorized", message_id="m")

    with pytest.raises(PermanentSendError):
        policy(t).call(attempt, window=timedelta(minutes=10), message_id="m")
    assert len(calls) == 1
    assert t.sleeps == []


def test_other_exceptions_are_not_retried() -> None:
    t = FakeTime()
    calls = []

    def attempt(timeout: float) -> str:
        calls.append(timeout)
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        policy(t).call(attempt, window=timedelta(minutes=10), message_id="m")
    assert len(calls) == 1


def test_exhausted_attempts_raise_in_doubt_with_details() -> None:
    t = FakeTime()

    def attempt(timeout: float) -> str:
        t.now += 2.0
        raise TransientSendError("timeout", message_id="order-1")

    with pytest.raises(InDoubtError) as info:
        policy(t, max_attempts=3).call(
            attempt, window=timedelta(minutes=10), message_id="order-1", partition_key="p1"
        )
    err = info.value
    assert err.message_id == "order-1"
    assert err.partition_key == "p1"
    assert err.attempts == 3
    assert err.elapsed == timedelta(seconds=2.0 * 3 + 0.5 + 1.0)
    assert isinstance(err.last_error, TransientSendError)
    assert "order-1" in str(err)


def test_no_attempt_starts_after_the_deadline_and_none_outlives_it() -> None:
    """Window 20 s, margin 5 s: every attempt must end by first start + 15 s."""
    t = FakeTime()
    start = t.now
    spans: list[tuple[float, float]] = []

    def attempt(timeout: float) -> str:
        begin = t.now
        t.now += timeout  # the attempt hangs until its timeout
        spans.append((begin, t.now))
        raise TransientSendError("no ack", message_id="m")

    p = policy(
        t,
        max_attempts=100,
        initial_backoff=1.0,
        max_backoff=4.0,
        attempt_timeout=3.0,
        safety_margin=timedelta(seconds=5),
    )
    with pytest.raises(InDoubtError) as info:
        p.call(attempt, window=timedelta(seconds=20), message_id="m")
    deadline = start + 15.0
    assert spans, "at least one attempt ran"
    assert all(end <= deadline + 1e-9 for _, end in spans)
    assert all(begin < deadline for begin, _ in spans)
    # timeouts are cut to the time left: the last attempt ended exactly at or before the deadline
    assert info.value.attempts == len(spans) < 100
    assert "deadline" in str(info.value)


def test_resumed_message_keeps_its_original_deadline() -> None:
    t = FakeTime()
    original_start = t.now - 14.99  # first attempt almost a whole window ago
    calls = []
    with pytest.raises(InDoubtError):
        policy(t).call(
            lambda timeout: calls.append(timeout) or "ok",
            window=timedelta(seconds=20),
            message_id="m",
            started=original_start,
        )
    assert calls == []  # no time left: the resend is refused, not attempted


def test_count_bounded_entity_is_bounded_by_attempts_only() -> None:
    t = FakeTime()
    calls = []

    def attempt(timeout: float) -> str:
        calls.append(timeout)
        t.now += 10_000  # far beyond any time window
        raise TransientSendError("drop", message_id="m")

    with pytest.raises(InDoubtError):
        policy(t, max_attempts=4).call(attempt, window=None, message_id="m")
    assert len(calls) == 4


def test_jittered_backoff_stays_within_bounds() -> None:
    t = FakeTime()

    def attempt(timeout: float) -> str:
        raise TransientSendError("drop", message_id="m")

    with pytest.raises(InDoubtError):
        policy(t, jitter=True, max_attempts=6, initial_backoff=1.0, max_backoff=4.0, seed=7).call(
            attempt, window=None, message_id="m"
        )
    caps = [1.0, 2.0, 4.0, 4.0, 4.0]
    assert len(t.sleeps) == 5
    assert all(cap / 2 <= s <= cap for s, cap in zip(t.sleeps, caps, strict=True))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"initial_backoff": -1}, "initial_backoff"),
        ({"max_backoff": 0.1, "initial_backoff": 1.0}, "max_backoff"),
        ({"attempt_timeout": 0}, "attempt_timeout"),
        ({"safety_margin": timedelta(seconds=-1)}, "safety_margin"),
        ({"safety_margin": 5}, "safety_margin"),
    ],
)
def test_bad_policy_settings_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert field in str(info.value)


def test_window_not_larger_than_margin_is_refused() -> None:
    p = RetryPolicy(safety_margin=timedelta(seconds=30))
    with pytest.raises(ConfigurationError, match="safety margin"):
        p.check_window(timedelta(seconds=20), entity="orders")
    p.check_window(None, entity="orders")  # count-bounded: nothing to check


def test_permanent_refusal_after_an_in_doubt_attempt_is_in_doubt() -> None:
    """Attempt 1 may have been stored; attempt 2's refusal cannot prove it was not."""
    t = FakeTime()
    errors = iter([TransientSendError("ack lost"), PermanentSendError("token expired")])

    def attempt(timeout: float) -> str:
        raise next(errors)

    with pytest.raises(InDoubtError) as info:
        policy(t).call(attempt, window=timedelta(minutes=10), message_id="m")
    assert info.value.attempts == 2
    assert isinstance(info.value.last_error, PermanentSendError)
    assert "earlier attempt may have been stored" in str(info.value)
