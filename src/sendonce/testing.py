"""Test doubles for producers built on sendonce.

:class:`FaultyBackend` wraps any backend and injects the failures a real broker
and network produce, by script: one fault consumed per ``send``/``schedule``
call, then calls pass through. Use it to prove your own producer ends with each
business message exactly once.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ._entity import EntityProfile
from ._message import Message
from .backends._base import Ack, Backend, Capabilities, capabilities_of
from .errors import PermanentSendError, TransientSendError

__all__ = ["FaultyBackend", "Fault", "FaultCall"]


class Fault(enum.Enum):
    """What happens to one ``send``/``schedule`` call."""

    NONE = "none"
    """Pass through."""
    BEFORE_COMMIT = "before_commit"
    """Nothing stored; ``TransientSendError`` (the sender cannot know that)."""
    AFTER_COMMIT = "after_commit"
    """Stored, then ``TransientSendError``: the in-doubt case."""
    PERMANENT = "permanent"
    """Nothing stored; ``PermanentSendError``."""
    SLOW_ACK = "slow_ack"
    """Stored; the ack arrives after ``slow_ack_delay``, a timeout if that exceeds the call's."""


@dataclass(frozen=True, slots=True)
class FaultCall:
    """A record of one call through the faulty backend."""

    method: str
    entity: str
    message_ids: tuple[str, ...]
    fault: Fault


FaultScript = Iterable[Fault] | Callable[[int, str, Sequence[Message]], Fault]


class FaultyBackend(Backend):
    """Wraps ``inner`` and injects ``faults``: a sequence consumed one per call, or a
    function ``(call_index, entity, messages) -> Fault`` for generated schedules.

    Its capabilities are the inner backend's, except ``native_submit``: ``submit`` runs
    this backend's faulty ``send`` on the base's thread pool, so submitted transfers meet
    the script too."""

    def __init__(
        self,
        inner: Backend,
        faults: FaultScript = (),
        *,
        slow_ack_delay: float = float("inf"),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.inner = inner
        if callable(faults):
            self._script: Callable[[int, str, Sequence[Message]], Fault] | None = faults
            self._queue: deque[Fault] = deque()
        else:
            self._script = None
            self._queue = deque(faults)
        self.slow_ack_delay = slow_ack_delay
        self.sleep = sleep
        self.calls: list[FaultCall] = []
        self._lock = threading.Lock()

    def add(self, *faults: Fault) -> None:
        """Append faults to the script."""
        self._queue.extend(faults)

    @property
    def pending(self) -> int:
        """Scripted faults not yet consumed."""
        return len(self._queue)

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """The wrapped backend's, without a native ``submit`` (see the class)."""
        return replace(capabilities_of(self.inner), native_submit=False)

    @property
    def supports_atomic(self) -> bool | None:
        """Whether the wrapped backend can send all-or-nothing groups."""
        return getattr(self.inner, "supports_atomic", None)

    def _next(self, method: str, entity: str, messages: Sequence[Message]) -> Fault:
        with self._lock:
            index = len(self.calls)
            if self._script is not None:
                fault = self._script(index, entity, messages)
            else:
                fault = self._queue.popleft() if self._queue else Fault.NONE
            self.calls.append(
                FaultCall(method, entity, tuple(m.message_id for m in messages), fault)
            )
        return fault

    def _run(
        self,
        method: str,
        entity: str,
        messages: Sequence[Message],
        timeout: float,
        call: Callable[[], list[Ack]],
    ) -> list[Ack]:
        fault = self._next(method, entity, messages)
        first = messages[0].message_id if messages else None
        if fault is Fault.BEFORE_COMMIT:
            raise TransientSendError(
                f"injected: connection lost before commit ({method} to {entity!r})",
                message_id=first,
                condition="amqp:connection:forced",
            )
        if fault is Fault.PERMANENT:
            raise PermanentSendError(
                f"injected: broker refused the {method} to {entity!r}",
                message_id=first,
                condition="amqp:unauthorized-access",
            )
        acks = call()
        if fault is Fault.AFTER_COMMIT:
            raise TransientSendError(
                f"injected: connection lost after commit, before the ack ({method} to {entity!r})",
                message_id=first,
                condition="amqp:connection:forced",
            )
        if fault is Fault.SLOW_ACK:
            if self.slow_ack_delay >= timeout:
                self.sleep(timeout)
                raise TransientSendError(
                    f"injected: no ack within {timeout:.2f}s ({method} to {entity!r})",
                    message_id=first,
                    condition="com.microsoft:timeout",
                )
            self.sleep(self.slow_ack_delay)
        return acks

    # -- Backend protocol ------------------------------------------------------------

    def describe(self, entity: str) -> EntityProfile:
        """The wrapped backend's profile of ``entity`` (never faulted)."""
        return self.inner.describe(entity)

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Send through the wrapped backend, applying the next scripted fault."""
        return self._run(
            "send",
            entity,
            messages,
            timeout,
            lambda: self.inner.send(entity, messages, timeout=timeout, atomic=atomic),
        )

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Schedule through the wrapped backend, applying the next scripted fault."""
        return self._run(
            "schedule",
            entity,
            messages,
            timeout,
            lambda: self.inner.schedule(entity, messages, at, timeout=timeout),
        )

    def close(self) -> None:
        """Close the wrapped backend."""
        self._stop_submissions()
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # Admin and receive methods (create_entity, receive, count...) pass straight through.
        if name == "inner":  # (before __init__ set it: copy, pickle)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"FaultyBackend({self.inner!r}, pending={self.pending})"
