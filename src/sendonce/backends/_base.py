"""The transfer seam (docs/engine.md): ``Backend`` and ``AsyncBackend`` side by side.

A backend moves one transfer of messages to an entity and says what the broker did
with each. It owns no retry loop and no sender configuration: retries, deadlines and
batching are the engine's job, so every backend gets them right. The base classes
write once what every backend shares (context management, ``capabilities``, the
thread-pool ``submit`` a backend without an event loop of its own gets); a backend
implements ``describe``, ``send``, ``schedule`` and ``close``.

A class that does not inherit but has those four methods still passes
``isinstance(x, Backend)`` (third-party backends written against the old protocol);
:func:`capabilities_of` and :func:`submit_of` read any of them the same way.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self, cast

from .._entity import EntityProfile
from .._message import Message
from ..errors import ConfigurationError

__all__ = [
    "Ack",
    "AckOutcome",
    "AsyncBackend",
    "Backend",
    "Capabilities",
    "capabilities_of",
    "reports_duplicates",
    "submit_of",
]

AckOutcome = Literal["accepted", "duplicate", "ignored"]
"""``duplicate``: the broker already holds this id and dropped the copy. ``ignored``: an
all-or-nothing group was dropped because *another* member is a duplicate (Artemis); this
member is not stored anywhere."""


@dataclass(frozen=True, slots=True)
class Ack:
    """What the broker did with one message of a transfer."""

    outcome: AckOutcome
    sequence_number: int | None = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do, read by the engine instead of probing attributes."""

    max_in_flight: int = 1
    """Transfers the backend carries at once (``send``/``submit`` safe that many at a time)."""
    messaging_system: str = "unknown"
    """OpenTelemetry's ``messaging.system`` for the broker."""
    atomic_groups: bool = False
    """``send(..., atomic=True)`` is honoured (where the entity allows it)."""
    reports_duplicates: bool = False
    """The broker says when it dropped a copy (``Ack("duplicate")``)."""
    native_submit: bool = False
    """``submit`` is non-blocking without a thread per transfer."""

    def __post_init__(self) -> None:
        value = self.max_in_flight
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigurationError(
                f"max_in_flight must be an int >= 1, not {value!r}", field="max_in_flight"
            )
        if not isinstance(self.messaging_system, str) or not self.messaging_system:
            raise ConfigurationError(
                "messaging_system must be a non-empty str", field="messaging_system"
            )


_REQUIRED = ("describe", "send", "schedule", "close")


def _has_required(cls: type) -> bool:
    return all(callable(getattr(cls, name, None)) for name in _REQUIRED)


_pool_lock = threading.Lock()


class _Capable:
    """What :class:`Backend` and :class:`AsyncBackend` share: the ``capabilities`` value, and
    the two attributes older code reads, derived from it (written once for both worlds)."""

    capabilities: Capabilities = Capabilities()
    """What this backend can do (a class default; a backend may set its own per instance)."""

    @property
    def max_in_flight(self) -> int:
        """``capabilities.max_in_flight``, for code that reads the attribute."""
        return self.capabilities.max_in_flight

    @property
    def messaging_system(self) -> str:
        """``capabilities.messaging_system``, for code that reads the attribute."""
        return self.capabilities.messaging_system


class Backend(_Capable, abc.ABC):
    """A transport to one broker (the sync world).

    ``send`` and ``schedule`` return one :class:`Ack` per message, in order, or raise
    ``TransientSendError`` (in doubt), ``NotSentError`` (nothing can have been stored) or
    ``PermanentSendError`` (nothing was stored). With ``atomic=True`` the messages are
    one all-or-nothing group; a backend that cannot honour that raises
    ``ConfigurationError``. ``messages`` is any ``Sequence[Message]``, not always a
    list: bulk paths (Spark) pass one that builds each ``Message`` when it is read.

    ``submit`` hands one transfer over and returns a future of its acks at once; here it
    runs ``send`` on a small pool of ``capabilities.max_in_flight`` threads owned by the
    backend (a backend with an event loop overrides it). ``send`` and ``schedule`` must be
    safe to call ``capabilities.max_in_flight`` at a time.

    ``server_address`` (str) and ``server_port`` (int), where a backend has them, are the host
    and port it connects to, put on spans and metrics as ``server.address`` and
    ``server.port`` (a wrapper's are read through its ``inner`` backend).
    """

    @classmethod
    def __subclasshook__(cls, other: type) -> bool | Any:
        if cls is Backend and _has_required(other):
            return True
        return NotImplemented

    @abc.abstractmethod
    def describe(self, entity: str) -> EntityProfile:
        """The profile of an existing entity, as the broker enforces it."""

    @abc.abstractmethod
    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Transfer ``messages`` to ``entity`` in one operation."""

    @abc.abstractmethod
    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Store ``messages`` for delivery at ``at``; acks carry sequence numbers."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. Idempotent."""

    def submit(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> concurrent.futures.Future[list[Ack]]:
        """Hand one transfer over; a future of its acks (docs/engine.md).

        This default runs ``send`` on the backend's pool: cancelling the future succeeds
        while the transfer waits for a thread (nothing sent), never once ``send`` runs.
        Raises ``ConfigurationError`` (nothing handed over) once the backend is closed.
        """
        pool = self._submit_pool()
        try:
            return pool.submit(self.send, entity, messages, timeout=timeout, atomic=atomic)
        except RuntimeError:  # the pool was shut down with the backend
            raise ConfigurationError("the backend is closed", field="backend") from None

    def _submit_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        pool: concurrent.futures.ThreadPoolExecutor | None = self.__dict__.get("_sendonce_pool")
        if pool is None:
            with _pool_lock:
                pool = self.__dict__.get("_sendonce_pool")
                if pool is None:
                    pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=self.capabilities.max_in_flight,
                        thread_name_prefix="sendonce-submit",
                    )
                    self.__dict__["_sendonce_pool"] = pool
        return pool

    def _stop_submissions(self) -> None:
        """Stop the default ``submit``'s pool (a backend's ``close`` calls this): queued
        transfers are cancelled, nothing sent; ones running finish."""
        pool = self.__dict__.get("_sendonce_pool")
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Self:
        """Backends are context managers: ``with connect(url) as backend: ...``."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        """Close the backend."""
        self.close()
        self._stop_submissions()
        return False


class _Submission(asyncio.Future[list[Ack]]):
    """An awaitable transfer that refuses cancellation once it may have left the process
    (docs/engine.md: ``cancel()`` is False once bytes may have left)."""

    handed = False
    task: asyncio.Task[None] | None = None

    def cancel(self, msg: Any = None) -> bool:
        if self.handed or self.done():
            return False
        if self.task is not None:
            self.task.cancel()
        return super().cancel(msg)


class AsyncBackend(_Capable, abc.ABC):
    """A transport to one broker, for event loops: :class:`Backend`'s operations, awaited.

    ``submit`` (called on the loop's thread) returns an ``asyncio.Future`` at once; here it
    runs ``send`` as a task. Its ``cancel()`` succeeds only before ``send`` starts.
    """

    @classmethod
    def __subclasshook__(cls, other: type) -> bool | Any:
        if cls is AsyncBackend and _has_required(other) and hasattr(other, "__aenter__"):
            return True
        return NotImplemented

    @abc.abstractmethod
    async def describe(self, entity: str) -> EntityProfile:
        """The profile of an existing entity, as the broker enforces it."""

    @abc.abstractmethod
    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Transfer ``messages`` to ``entity`` in one operation."""

    @abc.abstractmethod
    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Store ``messages`` for delivery at ``at``; acks carry sequence numbers."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. Idempotent."""

    def submit(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> asyncio.Future[list[Ack]]:
        """Hand one transfer over; a future of its acks (docs/engine.md), on the running
        loop. Cancelling it succeeds until ``send`` starts (nothing sent), never after."""
        return _run_as_submission(
            lambda: self.send(entity, messages, timeout=timeout, atomic=atomic)
        )

    async def __aenter__(self) -> Self:
        """``async with connect(url) as backend: ...``."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        """Close the backend."""
        await self.close()
        return False


def _run_as_submission(
    start: Callable[[], Coroutine[Any, Any, list[Ack]]],
) -> asyncio.Future[list[Ack]]:
    """A :class:`_Submission` completed by the coroutine ``start()`` run as a task."""
    loop = asyncio.get_running_loop()
    future = _Submission(loop=loop)

    async def run() -> None:
        future.handed = True
        try:
            acks = await start()
        except BaseException as exc:
            if not future.done():
                if isinstance(exc, asyncio.CancelledError):
                    super(_Submission, future).cancel()
                else:
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if not future.done():
            future.set_result(acks)

    future.task = loop.create_task(run())
    return future


def bridge(
    inner: concurrent.futures.Future[list[Ack]], loop: asyncio.AbstractEventLoop
) -> asyncio.Future[list[Ack]]:
    """An asyncio future following ``inner`` (completed on ``loop`` whatever thread
    completes ``inner``); cancelling it cancels ``inner`` only while ``inner`` allows."""
    future = _BridgedSubmission(inner, loop=loop)

    def copy(done: concurrent.futures.Future[list[Ack]]) -> None:
        loop.call_soon_threadsafe(_copy_outcome, done, future)

    inner.add_done_callback(copy)
    return future


class _BridgedSubmission(asyncio.Future[list[Ack]]):
    def __init__(
        self, inner: concurrent.futures.Future[list[Ack]], *, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(loop=loop)
        self._inner = inner

    def cancel(self, msg: Any = None) -> bool:
        if self.done() or not self._inner.cancel():
            return False
        return super().cancel(msg)


def _copy_outcome(
    done: concurrent.futures.Future[list[Ack]], future: asyncio.Future[list[Ack]]
) -> None:
    if future.done():
        return
    if done.cancelled():
        asyncio.Future.cancel(future)  # the base's: the bridge's own asks ``done`` first
        return
    error = done.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())


def capabilities_of(backend: object) -> Capabilities:
    """The capabilities of any backend: its own ``capabilities``, or for a duck-typed one
    what its ``max_in_flight`` / ``messaging_system`` / ``supports_atomic`` attributes say
    (``native_submit`` only where its class itself defines ``submit``)."""
    own = getattr(type(backend), "capabilities", None)
    if own is not None:
        found = getattr(backend, "capabilities", None)
        if isinstance(found, Capabilities):
            if found.native_submit and submit_of(backend) is None:
                return _replace(found, native_submit=False)
            return found
    max_in_flight = getattr(backend, "max_in_flight", 1)
    system = getattr(backend, "messaging_system", None)
    return Capabilities(
        max_in_flight=max_in_flight,
        messaging_system=str(system) if system else "unknown",
        atomic_groups=getattr(backend, "supports_atomic", None) is True,
    )


def _replace(value: Capabilities, **changes: Any) -> Capabilities:
    import dataclasses

    return dataclasses.replace(value, **changes)


def submit_of(
    backend: object,
) -> Callable[..., concurrent.futures.Future[list[Ack]] | asyncio.Future[list[Ack]]] | None:
    """``backend.submit`` where the backend's class defines it; None otherwise.

    A wrapper that forwards unknown attributes to an inner backend (``__getattr__``) must
    not lend it the inner one's ``submit``: that would carry transfers past the wrapper's
    own ``send``. The engine then adapts the wrapper's ``send`` itself.
    """
    method = getattr(type(backend), "submit", None)
    if method is None or not callable(method):
        return None
    bound: Any = getattr(backend, "submit", None)  # the class's, bound
    return cast(
        "Callable[..., concurrent.futures.Future[list[Ack]] | asyncio.Future[list[Ack]]]", bound
    )


def is_async_backend(backend: object) -> bool:
    """Whether ``backend.send`` is a coroutine function (an :class:`AsyncBackend`)."""
    return inspect.iscoroutinefunction(getattr(backend, "send", None))


def reports_duplicates(backend: object) -> bool:
    """Whether ``backend``'s acks say which copies the broker dropped as duplicates
    (``capabilities.reports_duplicates``; or a duck-typed backend's own
    ``reports_duplicates = True``). Over AMQP Service Bus and Artemis ack a dropped copy as if
    it were stored, so a re-run that stores nothing again reports its records sent."""
    return (
        capabilities_of(backend).reports_duplicates
        or getattr(backend, "reports_duplicates", False) is True
    )
