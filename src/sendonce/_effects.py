"""What a sender call asks its shell to do, and the two ways to run a call (sans-I/O).

A sender call (``schedule``, ``send``, ``send_many``, one transfer with its splits) is
written once, in :mod:`sendonce._calls`, as a generator that knows nothing of threads or
event loops: it yields an *effect* when it needs something that may wait (a ledger write,
a transfer's retried attempts, a turn of the event loop) and is sent the result back, or
has the exception thrown in, so its ``try``/``finally`` blocks hold whatever ran them.

The sync sender runs a call with :func:`run` (each effect in the calling thread); the aio
sender with :func:`arun` (each effect awaited: a store's call in a worker thread, a transfer
as awaits). Each shell's ``_perform`` says how; the logic is in one place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from ._message import Message

__all__ = [
    "Ahead",
    "Attempt",
    "Drain",
    "Effect",
    "Flights",
    "LedgerFlights",
    "Mark",
    "Pause",
    "Read",
    "Schedule",
    "Steps",
    "Store",
    "Transfer",
    "arun",
    "run",
]

T = TypeVar("T")


class Effect:
    """Something a call needs done that may wait; its shell performs it."""

    __slots__ = ()


Steps = Generator[Effect, Any, T]
"""A call written once: yields effects, is sent their results, returns the call's value."""


@dataclass(frozen=True, slots=True)
class Store(Effect):
    """``fn(*args)`` on the ledger's store: inline in the sync sender, in a worker thread
    in the aio sender (the event loop never waits on a store)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    light: bool = False
    """Cheap enough for the event loop itself (no worker thread)."""


@dataclass(frozen=True, slots=True)
class Pause(Effect):
    """A turn for other tasks between slices of a big input (aio); nothing in sync."""


@dataclass(frozen=True, slots=True)
class Mark(Effect):
    """The cancellations pending on the call's task as it begins (aio; sync: 0). Given back
    with ``check=True`` as the call ends: a cancellation a transport absorbed meanwhile
    raises (``sendonce.aio._inflight.cancelled_meanwhile``)."""

    before: int = 0
    check: bool = False


@dataclass(frozen=True, slots=True)
class Read(Effect):
    """Fill a streamed call's next chunk (``sendonce._buffer.Chunks``): at once in sync, a
    slice between turns of the event loop in aio."""

    chunks: Any


@dataclass(frozen=True, slots=True)
class Attempt(Effect):
    """One transfer's retried attempts (``Attempted``; its key held by the caller):
    ``MessageSizeError``, ``InDoubtError`` or ``PermanentSendError`` are thrown back."""

    batch: Sequence[Message]
    started: float | None
    tried: list[int] | None = None
    stop: Any = None
    atomic: bool = False


@dataclass(frozen=True, slots=True)
class Transfer(Effect):
    """One planned transfer, its key held for it, split if too big: its ``Part`` list."""

    batch: Sequence[Message]
    started: float | None


@dataclass(frozen=True, slots=True)
class Schedule(Effect):
    """One message's retried schedule for ``at``, its key held: ``Attempted``."""

    message: Message
    at: datetime
    started: float | None


@dataclass(frozen=True, slots=True)
class Flights(Effect):
    """A planned call's transfers (no ledger), up to the sender's limit in flight, one per
    key at a time: what became of each (its ``Part`` list, in planned order)."""

    batches: Sequence[Sequence[Message]]
    started: float | None


@dataclass(frozen=True, slots=True)
class Ahead(Effect):
    """The call's ``WriteAhead`` over ``run``: its writes in the shell's worker thread."""

    run: Any


@dataclass(frozen=True, slots=True)
class LedgerFlights(Effect):
    """The run's transfers in flight, each once its window is durable (``ahead.ready``),
    its outcome noted in the run and put in ``outcomes``."""

    run: Any
    ahead: Any
    outcomes: list[Any]


@dataclass(frozen=True, slots=True)
class Drain(Effect):
    """On a call's way out: wait for the ledger write still in flight and take its answer."""

    ahead: Any


def run(steps: Steps[T], perform: Callable[[Effect], Any]) -> T:
    """Run a call in this thread: each effect by ``perform``, its result sent back (its
    exception thrown in)."""
    try:
        effect = next(steps)
        while True:
            try:
                value = perform(effect)
            except BaseException as exc:
                effect = steps.throw(exc)
            else:
                effect = steps.send(value)
    except StopIteration as done:
        return cast("T", done.value)


async def arun(steps: Steps[T], perform: Callable[[Effect], Awaitable[Any]]) -> T:
    """:func:`run` on an event loop: each effect awaited."""
    try:
        effect = next(steps)
        while True:
            try:
                value = await perform(effect)
            except BaseException as exc:
                effect = steps.throw(exc)
            else:
                effect = steps.send(value)
    except StopIteration as done:
        return cast("T", done.value)
