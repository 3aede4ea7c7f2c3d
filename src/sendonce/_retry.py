"""Retrying in-doubt sends safely, on tenacity.

A resend is only safe while the broker still remembers the message id. The
deadline of a send is therefore its first attempt plus the entity's
duplicate-detection window minus a safety margin: no attempt starts after it,
and each attempt's timeout is cut to the time left, so no attempt is still in
flight when the broker may have forgotten the id.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

import tenacity
from tenacity import RetryCallState

from .errors import ConfigurationError, InDoubtError, SendError, TransientSendError

__all__ = ["Attempted", "RetryPolicy"]

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
        failures outlast the attempts or the deadline; any other error passes
        through unchanged after its first occurrence.
        """
        clock = self.clock
        first = clock() if started is None else started
        deadline = self.deadline(first, window)
        in_doubt = False
        attempts = 0

        def one_attempt() -> T:
            nonlocal attempts, in_doubt
            timeout = self.attempt_timeout
            if deadline is not None:
                timeout = min(timeout, deadline - clock())
                if timeout < MIN_ATTEMPT_TIME:
                    raise _DeadlinePassed()
            attempts += 1
            try:
                return attempt(timeout)
            except TransientSendError:
                in_doubt = True
                raise

        at_deadline = _StopAtDeadline(clock, deadline)
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_attempts) | at_deadline,
            wait=_ExponentialBackoff(self.initial_backoff, self.max_backoff, self.jitter, self.rng),
            retry=tenacity.retry_if_exception_type(TransientSendError),
            sleep=self.sleep,
            reraise=True,
        )
        was_in_doubt = False
        try:
            for attempt_state in retrying:
                with attempt_state:
                    was_in_doubt = in_doubt
                    value = one_attempt()
        except (TransientSendError, _DeadlinePassed) as exc:
            last = exc if isinstance(exc, TransientSendError) else None
            elapsed = timedelta(seconds=max(clock() - first, 0.0))
            reason = (
                "the duplicate-detection deadline (first attempt + window - safety margin) "
                "would pass before another attempt could finish"
                if at_deadline.fired or isinstance(exc, _DeadlinePassed)
                else f"all {self.max_attempts} attempts were used"
            )
            raise InDoubtError(
                f"message {message_id!r} (partition key {partition_key!r}) is in doubt after "
                f"{attempts} attempts over {elapsed.total_seconds():.1f}s: {reason}. It may or may "
                f"not have been stored; resending it is safe only inside the entity's "
                f"duplicate-detection window. Last error: {last}",
                message_id=message_id,
                partition_key=partition_key,
                attempts=attempts,
                elapsed=elapsed,
                last_error=last,
            ) from exc
        except SendError as exc:
            if not in_doubt:
                raise
            # An earlier attempt may have been stored before its ack was lost; a refusal of
            # the retry does not undo that, so the message is in doubt, not "not sent".
            elapsed = timedelta(seconds=max(clock() - first, 0.0))
            raise InDoubtError(
                f"message {message_id!r} (partition key {partition_key!r}) is in doubt: an "
                f"earlier attempt may have been stored, then attempt {attempts} was refused "
                f"({type(exc).__name__}: {exc}). Resending it is safe only inside the entity's "
                "duplicate-detection window.",
                message_id=message_id,
                partition_key=partition_key,
                attempts=attempts,
                elapsed=elapsed,
                last_error=exc,
            ) from exc
        return Attempted(value, attempts, was_in_doubt)

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
        clock = self.clock
        first = clock() if started is None else started
        deadline = self.deadline(first, window)
        in_doubt = False
        attempts = 0

        async def one_attempt() -> T:
            nonlocal attempts, in_doubt
            timeout = self.attempt_timeout
            if deadline is not None:
                timeout = min(timeout, deadline - clock())
                if timeout < MIN_ATTEMPT_TIME:
                    raise _DeadlinePassed()
            attempts += 1
            try:
                return await attempt(timeout)
            except TransientSendError:
                in_doubt = True
                raise

        at_deadline = _StopAtDeadline(clock, deadline)
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.max_attempts) | at_deadline,
            wait=_ExponentialBackoff(self.initial_backoff, self.max_backoff, self.jitter, self.rng),
            retry=tenacity.retry_if_exception_type(TransientSendError),
            sleep=self.async_sleep,
            reraise=True,
        )
        was_in_doubt = False
        try:
            async for attempt_state in retrying:
                with attempt_state:
                    was_in_doubt = in_doubt
                    value = await one_attempt()
        except (TransientSendError, _DeadlinePassed) as exc:
            last = exc if isinstance(exc, TransientSendError) else None
            elapsed = timedelta(seconds=max(clock() - first, 0.0))
            reason = (
                "the duplicate-detection deadline (first attempt + window - safety margin) "
                "would pass before another attempt could finish"
                if at_deadline.fired or isinstance(exc, _DeadlinePassed)
                else f"all {self.max_attempts} attempts were used"
            )
            raise InDoubtError(
                f"message {message_id!r} (partition key {partition_key!r}) is in doubt after "
                f"{attempts} attempts over {elapsed.total_seconds():.1f}s: {reason}. It may or may "
                f"not have been stored; resending it is safe only inside the entity's "
                f"duplicate-detection window. Last error: {last}",
                message_id=message_id,
                partition_key=partition_key,
                attempts=attempts,
                elapsed=elapsed,
                last_error=last,
            ) from exc
        except SendError as exc:
            if not in_doubt:
                raise
            elapsed = timedelta(seconds=max(clock() - first, 0.0))
            raise InDoubtError(
                f"message {message_id!r} (partition key {partition_key!r}) is in doubt: an "
                f"earlier attempt may have been stored, then attempt {attempts} was refused "
                f"({type(exc).__name__}: {exc}). Resending it is safe only inside the entity's "
                "duplicate-detection window.",
                message_id=message_id,
                partition_key=partition_key,
                attempts=attempts,
                elapsed=elapsed,
                last_error=exc,
            ) from exc
        return Attempted(value, attempts, was_in_doubt)


class _DeadlinePassed(Exception):
    """Internal: no time is left for another attempt."""
