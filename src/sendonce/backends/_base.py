"""The small protocol every backend implements, in the manner of an httpx transport.

A backend moves one transfer of messages to an entity and says what the broker
did with each. It owns no retry loop and no sender configuration: retries,
deadlines and batching are the sender's job, so every backend gets them right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Literal, Protocol, Self, runtime_checkable

from .._entity import EntityProfile
from .._message import Message

__all__ = ["Ack", "AckOutcome", "Backend"]

AckOutcome = Literal["accepted", "duplicate", "ignored"]
"""``duplicate``: the broker already holds this id and dropped the copy. ``ignored``: an
all-or-nothing group was dropped because *another* member is a duplicate (Artemis); this
member is not stored anywhere."""


@dataclass(frozen=True, slots=True)
class Ack:
    """What the broker did with one message of a transfer."""

    outcome: AckOutcome
    sequence_number: int | None = None


@runtime_checkable
class Backend(Protocol):
    """A transport to one broker.

    ``send`` and ``schedule`` return one :class:`Ack` per message, in order, or
    raise ``TransientSendError`` (the outcome is in doubt) or
    ``PermanentSendError`` (nothing was stored). With ``atomic=True`` the
    messages are one all-or-nothing group; a backend that cannot honour that
    raises ``ConfigurationError``.

    ``messages`` is any ``Sequence[Message]``, not always a list: bulk paths (Spark)
    pass one that holds columns and builds each ``Message`` when it is read.

    A backend may have an int attribute ``max_in_flight``: how many transfers it
    carries at once for concurrent callers (threads). ``send`` and ``schedule``
    must then be safe to call that many at a time; the sender reads it with
    ``getattr(backend, "max_in_flight", 1)`` and keeps the order per partition
    key itself. Without it, the sender calls one at a time.

    A backend may also have a str attribute ``messaging_system``: OpenTelemetry's name for
    the broker it sends to (``"servicebus"``, ``"activemq"``...), put on the sender's spans
    and metrics (``"unknown"`` without it); and ``server_address`` (str) and ``server_port``
    (int), the host and port it connects to, put there as ``server.address`` and
    ``server.port`` (a wrapper's are read through its ``inner`` backend).
    """

    def describe(self, entity: str) -> EntityProfile:
        """The profile of an existing entity, as the broker enforces it."""
        ...

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Transfer ``messages`` to ``entity`` in one operation."""
        ...

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Store ``messages`` for delivery at ``at``; acks carry sequence numbers."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...

    def __enter__(self) -> Self:
        """Backends are context managers: ``with connect(url) as backend: ...``."""
        ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        """Close the backend."""
        ...
