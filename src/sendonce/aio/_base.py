"""``AsyncBackend``: the asyncio mirror of :class:`sendonce.backends.Backend`.

The same four operations, awaited. A backend moves one transfer and says what
the broker did with each message; retries, deadlines and batching stay the
sender's job, shared with the sync sender.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from .._entity import EntityProfile
from .._message import Message
from ..backends._base import Ack

__all__ = ["AsyncBackend"]


@runtime_checkable
class AsyncBackend(Protocol):
    """A transport to one broker, for event loops.

    ``send`` and ``schedule`` return one :class:`~sendonce.backends.Ack` per
    message, in order, or raise ``TransientSendError`` (in doubt) or
    ``PermanentSendError`` (nothing stored), exactly as a sync backend does.

    As for a sync backend, an optional int ``max_in_flight`` says how many
    ``send``/``schedule`` calls from concurrent tasks it carries at once (the
    sender reads ``getattr(backend, "max_in_flight", 1)``).
    """

    async def describe(self, entity: str) -> EntityProfile:
        """The profile of an existing entity, as the broker enforces it."""
        ...

    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Transfer ``messages`` to ``entity`` in one operation."""
        ...

    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Store ``messages`` for delivery at ``at``; acks carry sequence numbers."""
        ...

    async def close(self) -> None:
        """Release connections. Idempotent."""
        ...

    async def __aenter__(self) -> Self:
        """``async with connect(url) as backend: ...``."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        """Close the backend."""
        ...
