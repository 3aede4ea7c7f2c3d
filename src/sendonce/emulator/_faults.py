"""Scripted faults: what the emulator does wrong, one entry per incoming transfer.

Tests of in-doubt handling need a broker that stores a message and then fails
to say so. A script is consumed one entry per transfer (a send, a batch, or a
schedule request) to an entity, so a test says exactly which attempt fails.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Fault", "FaultAction", "FaultScript"]


class FaultAction(enum.Enum):
    """One way for a transfer to go wrong."""

    NONE = "none"
    """Behave normally (a placeholder that consumes one transfer)."""
    DROP_AFTER_COMMIT = "drop_after_commit"
    """Store the messages, then drop the TCP connection before the disposition."""
    DROP_BEFORE_COMMIT = "drop_before_commit"
    """Drop the TCP connection without storing anything."""
    DETACH_AFTER_COMMIT = "detach_after_commit"
    """Store the messages, then detach the link with an error instead of settling."""
    WITHHOLD = "withhold"
    """Store the messages and never send the disposition (the client times out)."""
    SERVER_BUSY = "server_busy"
    """Refuse with ``com.microsoft:server-busy``; nothing stored (retryable)."""
    UNAUTHORIZED = "unauthorized"
    """Refuse with ``amqp:unauthorized-access``; nothing stored (permanent)."""

    @property
    def stores(self) -> bool:
        """Whether the messages are committed before the fault strikes."""
        return self in (
            FaultAction.NONE,
            FaultAction.DROP_AFTER_COMMIT,
            FaultAction.DETACH_AFTER_COMMIT,
            FaultAction.WITHHOLD,
        )


@dataclass(frozen=True, slots=True)
class Fault:
    """A scripted fault, applied to the next matching transfer.

    ``entity`` restricts it to transfers addressed to that queue or topic
    (``None``: any entity). ``operation`` restricts it to ``"send"`` transfers or
    ``"schedule"`` management requests (``None``: either).
    """

    action: FaultAction
    entity: str | None = field(default=None, kw_only=True)
    operation: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.action, FaultAction):
            raise TypeError(f"action must be a FaultAction, got {type(self.action).__name__}")
        if self.operation not in (None, "send", "schedule"):
            raise ValueError(
                f"operation must be 'send', 'schedule' or None, not {self.operation!r}"
            )

    def matches(self, entity: str, operation: str) -> bool:
        """Whether this fault applies to ``operation`` (send, schedule, ...) on ``entity``."""
        return (self.entity is None or self.entity == entity) and (
            self.operation is None or self.operation == operation
        )


class FaultScript:
    """A thread-safe queue of faults; the emulator thread takes one per matching transfer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[Fault] = deque()
        self._applied: list[tuple[Fault, str, str]] = []

    def add(self, *faults: Fault | FaultAction) -> None:
        """Append faults (a bare ``FaultAction`` is a fault for any entity)."""
        items = [f if isinstance(f, Fault) else Fault(f) for f in faults]
        with self._lock:
            self._pending.extend(items)

    def extend(self, faults: Iterable[Fault | FaultAction]) -> None:
        """Queue ``faults``, applied in order to the next transfers."""
        self.add(*faults)

    def clear(self) -> None:
        """Drop every fault not yet applied."""
        with self._lock:
            self._pending.clear()

    @property
    def pending(self) -> int:
        """How many scripted faults are still waiting for a transfer."""
        with self._lock:
            return len(self._pending)

    @property
    def applied(self) -> list[tuple[Fault, str, str]]:
        """Every fault taken so far, with the entity and operation it struck."""
        with self._lock:
            return list(self._applied)

    def take(self, entity: str, operation: str) -> FaultAction:
        """The action for the next transfer: the first pending fault that matches it."""
        with self._lock:
            for i, fault in enumerate(self._pending):
                if fault.matches(entity, operation):
                    del self._pending[i]
                    self._applied.append((fault, entity, operation))
                    return fault.action
        return FaultAction.NONE
