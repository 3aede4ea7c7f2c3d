"""Retrying in-doubt sends safely, on tenacity.

A resend is only safe while the broker still remembers the message id. The
deadline of a send is therefore its first attempt plus the entity's
duplicate-detection window minus a safety margin: no attempt starts after it,
and each attempt's timeout is cut to the time left, so no attempt is still in
flight when the broker may have forgotten the id.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

import tenacity
from tenacity import RetryCallState

from . import _sender_telemetry
from .errors import (
    ConfigurationError,
    InDoubtError,
    NotSentError,
    NotStoredError,
    SendError,
    TransientSendError,
    ValidationError,
)

__all__ = ["Attempted", "FirstAttempt", "RetryPolicy"]

logger = logging.getLogger("sendonce.retry")

T = TypeVar("T")
Clock = Callable[[], float]
Sleep = Callable[[float], None]
AsyncSleep = Callable[[float], Awaitable[None]]

# Below this, an attempt has no realistic chance to complete: do not start it.
MIN_ATTEMPT_TIME = 0.05


@dataclass(frozen=True, slots=True)
class Attempted(Generic[T]):
    """What a retried call returned, and how it got there."""

    value: T
    attempts: int
    in_doubt_before: bool
    """True when an earlier attempt failed in doubt (it may have committed)."""


class _StopAtDeadline(tenacity.stop.stop_base):
    """Stop when the next attempt would start too late to finish before the deadline."""

    def __init__(self, clock: Clock, deadline: float | None) -> None:
        self.clock = clock
        self.deadline = deadline
        self.fired = False

    def __call__(self, retry_state: RetryCallState) -> bool:
        if self.deadline is None:
            return False
        next_start = self.clock() + retry_state.upcoming_sleep
        self.fired = next_start + MIN_ATTEMPT_TIME >= self.deadline
        return self.fired


class _ExponentialBackoff(tenacity.wait.wait_base):
    """Exponential backoff with optional full jitter, from a seeded random source."""

    def __init__(self, initial: float, maximum: float, jitter: bool, rng: random.Random) -> None:
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self.rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        exponent = max(retry_state.attempt_number - 1, 0)
        backoff = min(self.maximum, self.initial * float(2**exponent))
        if self.jitter:
            return self.rng.uniform(backoff / 2, backoff)
        return backoff


class RetryPolicy:
    """How the sender retries a send whose outcome is in doubt.

    Only ``TransientSendError`` is retried, always with the same message ids.
    ``sleep`` and ``clock`` are injectable so tests never wait; ``async_sleep`` is the
    sleep of :meth:`acall` (the ``sendonce.aio`` sender), which must not block the loop.
    """

    __slots__ = (
        "async_sleep",
        "attempt_timeout",
        "clock",
        "initial_backoff",
        "jitter",
        "max_attempts",
        "max_backoff",
        "rng",
        "safety_margin",
        "sleep",
    )

    def __init__(
        self,
        *,
        max_attempts: int = 5,
        initial_backoff: float = 0.5,
        max_backoff: float = 10.0,
        jitter: bool = True,
        attempt_timeout: float = 30.0,
        safety_margin: timedelta = timedelta(seconds=5),
        sleep: Sleep = time.sleep,
        clock: Clock = time.monotonic,
        seed: int | None = None,
        async_sleep: AsyncSleep = asyncio.sleep,
    ) -> None:
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise ConfigurationError("max_attempts must be an int >= 1", field="max_attempts")
        for name, value in (("initial_backoff", initial_backoff), ("max_backoff", max_backoff)):
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigurationError(f"{name} must be a number >= 0", field=name)
        if max_backoff < initial_backoff:
            raise ConfigurationError("max_backoff must be >= initial_backoff", field="max_backoff")
        if (
            not isinstance(attempt_timeout, int | float)
            or isinstance(attempt_timeout, bool)
            or attempt_timeout <= 0
        ):
            raise ConfigurationError(
                "attempt_timeout must be a number > 0", field="attempt_timeout"
            )
        if not isinstance(safety_margin, timedelta) or safety_margin < timedelta(0):
            raise ConfigurationError(
                "safety_margin must be a non-negative timedelta", field="safety_margin"
            )
        if not callable(sleep) or not callable(clock):
            raise ConfigurationError("sleep and clock must be callables", field="sleep")
        if not callable(async_sleep):
            raise ConfigurationError("async_sleep must be a callable", field="async_sleep")
        self.max_attempts = max_attempts
        self.initial_backoff = float(initial_backoff)
        self.max_backoff = float(max_backoff)
        self.jitter = bool(jitter)
        self.attempt_timeout = float(attempt_timeout)
        self.safety_margin = safety_margin
        self.sleep = sleep
        self.async_sleep = async_sleep
        self.clock = clock
        self.rng = random.Random(seed)

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(max_attempts={self.max_attempts}, "
            f"initial_backoff={self.initial_backoff}, max_backoff={self.max_backoff}, "
            f"jitter={self.jitter}, "
            f"attempt_timeout={self.attempt_timeout}, safety_margin={self.safety_margin!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    def check_window(self, window: timedelta | None, *, entity: str) -> None:
        """Refuse a window too small to leave room for any retry after the margin."""
        if window is not None and window <= self.safety_margin:
            raise ConfigurationError(
                f"entity {entity!r}: duplicate-detection window {window} is not larger than the "
                f"retry safety margin {self.safety_margin}; no resend could be proven safe",
                field="safety_margin",
            )

    def deadline(self, started: float, window: timedelta | None) -> float | None:
        """The last moment (on ``clock``) at which an attempt may still be in flight."""
        if window is None:
            return None
        return started + (window - self.safety_margin).total_seconds()

    def call(
        self,
        attempt: Callable[[float], T],
        *,
        window: timedelta | None,
        message_id: str | None,
        partition_key: str | None = None,
        started: float | None = None,
    ) -> Attempted[T]:
        """Run ``attempt(timeout)`` until it succeeds, fails permanently, or time runs out.

        ``started`` is when the first attempt of this message began (default:
        now); a caller resuming an in-doubt message passes the original start so
        the deadline does not move. Raises ``InDoubtError`` when transient
        failures outlast the attempts or the deadline, or when the broker refuses
        a retry after an attempt that may have been stored; a refusal of the first
        attempt passes through unchanged.
        """
        call = _Call(self, window, message_id, partition_key, started)
        try:
            # Fast path: most sends succeed at once, so the first attempt runs without
            # building any retry state.
            return Attempted(call.run(attempt), 1, False)
        except TransientSendError as exc:
            failure: BaseException | None = exc
        except _DeadlinePassed as exc:
            raise call.exhausted(exc) from exc
        except _Refused as refused:
            raise refused.error from None
        return self._retrying(call, attempt, failure)

    def begin(
        self,
        *,
        window: timedelta | None,
        message_id: str | None,
        partition_key: str | None = None,
        started: float | None = None,
    ) -> FirstAttempt:
        """The first attempt of a call made by someone else (the engine submitting it
        without a thread): its timeout, then :meth:`resume` if it failed."""
        return FirstAttempt(_Call(self, window, message_id, partition_key, started))

    def resume(
        self, first: FirstAttempt, attempt: Callable[[float], T], failure: BaseException
    ) -> Attempted[T]:
        """:meth:`call`'s rules after ``first`` failed with ``failure``: a transient
        failure is retried (same ids, within the deadline); a refusal passes through."""
        call = first.call
        if isinstance(failure, ValidationError):
            raise failure  # the broker refused the first attempt: unchanged, as in call
        if not isinstance(failure, TransientSendError):
            raise failure
        if not isinstance(failure, NotSentError):
            call.in_doubt = True
        return self._retrying(call, attempt, failure)

    def _retrying(
        self, call: _Call, attempt: Callable[[float], T], failure: BaseException | None
    ) -> Attempted[T]:
        """Attempts 2 and on, with tenacity (``failure``: attempt 1's, replayed)."""
        in_doubt_before = False
        retrying = tenacity.Retrying(
            stop=call.stop(),
            wait=call.wait(),
            retry=_RETRYABLE,
            sleep=self.sleep,
            reraise=True,
            before_sleep=call.announce,
        )
        try:
            for attempt_state in retrying:
                with attempt_state:
                    if failure is not None:  # replay attempt 1 so tenacity counts and waits
                        replay, failure = failure, None
                        raise replay
                    in_doubt_before = call.in_doubt
                    value: T = call.run(attempt)
        except (TransientSendError, _DeadlinePassed) as exc:
            raise call.exhausted(exc) from exc
        except _Refused as refused:
            raise refused.error from None
        except SendError as exc:
            raise call.refused_after_doubt(exc) from exc
        return Attempted(value, call.attempts, in_doubt_before)

    async def acall(
        self,
        attempt: Callable[[float], Awaitable[T]],
        *,
        window: timedelta | None,
        message_id: str | None,
        partition_key: str | None = None,
        started: float | None = None,
    ) -> Attempted[T]:
        """The asyncio mirror of :meth:`call`: ``await attempt(timeout)`` under the same rules.

        Backoffs use ``async_sleep``, so other tasks run meanwhile. A cancellation of
        the awaiting task is not a send error: it propagates unchanged (the attempt in
        flight may or may not have been stored; see ``docs/aio.md``).
        """
        call = _Call(self, window, message_id, partition_key, started)
        try:
            return Attempted(await call.arun(attempt), 1, False)
        except TransientSendError as exc:
            failure: BaseException | None = exc
        except _DeadlinePassed as exc:
            raise call.exhausted(exc) from exc
        except _Refused as refused:
            raise refused.error from None
        in_doubt_before = False
        retrying = tenacity.AsyncRetrying(
            stop=call.stop(),
            wait=call.wait(),
            retry=_RETRYABLE,
            sleep=self.async_sleep,
            reraise=True,
            before_sleep=call.announce,
        )
        try:
            async for attempt_state in retrying:
                with attempt_state:
                    if failure is not None:
                        replay, failure = failure, None
                        raise replay
                    in_doubt_before = call.in_doubt
                    avalue: T = await call.arun(attempt)
        except (TransientSendError, _DeadlinePassed) as exc:
            raise call.exhausted(exc) from exc
        except _Refused as refused:
            raise refused.error from None
        except SendError as exc:
            raise call.refused_after_doubt(exc) from exc
        return Attempted(avalue, call.attempts, in_doubt_before)


_RETRYABLE = tenacity.retry_if_exception_type(TransientSendError)


class FirstAttempt:
    """A call's first attempt, made outside :meth:`RetryPolicy.call` (see ``begin``)."""

    __slots__ = ("call",)

    def __init__(self, call: _Call) -> None:
        self.call = call

    def timeout(self) -> float:
        """The first attempt's timeout (cut to the deadline); raises the call's
        ``InDoubtError`` / ``NeverSentError`` if the deadline has already passed."""
        try:
            return self.call.timeout()
        except _DeadlinePassed as exc:
            raise self.call.exhausted(exc) from exc


class _Call:
    """The state of one retried call: its deadline, attempts so far, and doubt."""

    __slots__ = (
        "at_deadline",
        "attempts",
        "deadline",
        "first",
        "in_doubt",
        "message_id",
        "partition_key",
        "policy",
        "resumed",
    )

    def __init__(
        self,
        policy: RetryPolicy,
        window: timedelta | None,
        message_id: str | None,
        partition_key: str | None,
        started: float | None,
    ) -> None:
        self.policy = policy
        self.first = policy.clock() if started is None else started
        self.deadline = policy.deadline(self.first, window)
        self.message_id = message_id
        self.partition_key = partition_key
        self.attempts = 0
        self.in_doubt = False
        self.resumed = started is not None  # an earlier process may have sent it
        self.at_deadline = _StopAtDeadline(policy.clock, self.deadline)

    def timeout(self) -> float:
        """This attempt's timeout, cut to the time left before the deadline."""
        timeout = self.policy.attempt_timeout
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - self.policy.clock())
            if timeout < MIN_ATTEMPT_TIME:
                raise _DeadlinePassed()
        self.attempts += 1
        return timeout

    def run(self, attempt: Callable[[float], T]) -> T:
        timeout = self.timeout()
        try:
            return attempt(timeout)
        except NotSentError:
            raise  # it never reached the broker: no doubt
        except TransientSendError:
            self.in_doubt = True
            raise
        except ValidationError as exc:
            raise _Refused(exc) from None

    async def arun(self, attempt: Callable[[float], Awaitable[T]]) -> T:
        timeout = self.timeout()
        try:
            return await attempt(timeout)
        except NotSentError:
            raise  # it never reached the broker: no doubt
        except TransientSendError:
            self.in_doubt = True
            raise
        except ValidationError as exc:
            raise _Refused(exc) from None

    def announce(self, retry_state: RetryCallState) -> None:
        """Log each retry (and trace it), so a slow or unreachable broker is never silent."""
        error = retry_state.outcome.exception() if retry_state.outcome else None
        sleep = retry_state.next_action.sleep if retry_state.next_action else 0.0
        logger.info(
            "retrying %s: attempt %d of %d failed (%s); next attempt in %.1fs",
            self.message_id,
            retry_state.attempt_number,
            self.policy.max_attempts,
            error,
            sleep,
        )
        _sender_telemetry.retried(retry_state.attempt_number, error, sleep)

    def stop(self) -> tenacity.stop.stop_base:
        return tenacity.stop_after_attempt(self.policy.max_attempts) | self.at_deadline

    def wait(self) -> _ExponentialBackoff:
        p = self.policy
        return _ExponentialBackoff(p.initial_backoff, p.max_backoff, p.jitter, p.rng)

    def _elapsed(self) -> timedelta:
        return timedelta(seconds=max(self.policy.clock() - self.first, 0.0))

    def exhausted(self, exc: BaseException) -> SendError:
        """Transient failures outlasted the attempts or the deadline."""
        last = exc if isinstance(exc, TransientSendError) else None
        elapsed = self._elapsed()
        if not self.in_doubt and not self.resumed and self.attempts:
            return NotStoredError(
                f"message {self.message_id!r} (partition key {self.partition_key!r}) was not "
                f"stored: none of {self.attempts} attempts over {elapsed.total_seconds():.1f}s "
                "reached the broker, so nothing was sent. Sending it again is safe. "
                f"Last error: {last}",
                message_id=self.message_id,
                partition_key=self.partition_key,
                attempts=self.attempts,
                elapsed=elapsed,
                last_error=last,
            )
        reason = (
            "the duplicate-detection deadline (first attempt + window - safety margin) "
            "would pass before another attempt could finish"
            if self.at_deadline.fired or isinstance(exc, _DeadlinePassed)
            else f"all {self.policy.max_attempts} attempts were used"
        )
        return InDoubtError(
            f"message {self.message_id!r} (partition key {self.partition_key!r}) is in doubt "
            f"after {self.attempts} attempts over {elapsed.total_seconds():.1f}s: {reason}. It "
            "may or may not have been stored; resending it is safe only while the broker "
            f"still remembers its id (never without duplicate detection). Last error: {last}",
            message_id=self.message_id,
            partition_key=self.partition_key,
            attempts=self.attempts,
            elapsed=elapsed,
            last_error=last,
        )

    def refused_after_doubt(self, exc: SendError) -> SendError:
        """A refusal after an in-doubt attempt cannot prove that attempt was not stored."""
        if not self.in_doubt and not self.resumed:
            return exc  # the earlier attempts never reached the broker
        return InDoubtError(
            f"message {self.message_id!r} (partition key {self.partition_key!r}) is in doubt: "
            f"an earlier attempt may have been stored, then attempt {self.attempts} was refused "
            f"({type(exc).__name__}: {exc}). Resending it is safe only while the broker still "
            "remembers its id (never without duplicate detection).",
            message_id=self.message_id,
            partition_key=self.partition_key,
            attempts=self.attempts,
            elapsed=self._elapsed(),
            last_error=exc,
        )


class _DeadlinePassed(Exception):
    """Internal: no time is left for another attempt."""


class _Refused(Exception):
    """Internal: carries a ``ValidationError`` out of tenacity, to re-raise it without
    tenacity's frames (a bad setup is not a send failure worth 40 lines of traceback)."""

    def __init__(self, error: ValidationError) -> None:
        super().__init__(str(error))
        self.error = error
