"""``ThreadedBackend``: any sync backend, awaited, its calls run on one worker thread.

Sync backends are not thread-safe, so calls must run one at a time. They run on
a dedicated single-thread executor rather than ``asyncio.to_thread`` plus an
``asyncio.Lock``: a cancelled caller releases an asyncio lock at once while its
call is still running in the thread, which would let the next call in beside
it; one worker thread serialises calls whatever happens to the awaiting tasks,
and does not tie up the loop's default executor. A call that has not started
when its task is cancelled never starts.

A backend that is safe for many threads at once (``ArtemisBackend``: its calls only
hand work to its own event loop and wait) can be given ``workers=N``: up to N calls run
side by side, so the async sender's transfers are in flight together.

``submit`` (the transfer seam, docs/engine.md) takes no thread at all where the wrapped
backend's own ``submit`` is native (Artemis: a future its event loop completes, followed
on this event loop); otherwise it runs ``send`` on the worker threads like ``send``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from .._entity import EntityProfile
from .._message import Message
from ..backends._base import (
    Ack,
    AsyncBackend,
    Backend,
    Capabilities,
    bridge,
    capabilities_of,
    submit_of,
)
from ..backends._dispatch import dispatching
from ..errors import ConfigurationError, NotSentError

__all__ = ["ThreadedBackend"]

T = TypeVar("T")
_PROTOCOL = ("describe", "send", "schedule", "close")


class ThreadedBackend(AsyncBackend):
    """Adapts a sync :class:`~sendonce.backends.Backend` (``LocalBackend``,
    ``FaultyBackend``, ``ArtemisBackend``...) to :class:`~sendonce.aio.AsyncBackend`.
    ``workers`` (default 1) is how many calls may run at once: more only for a backend
    safe for many threads.

    Closing it closes the wrapped backend. Any other method of the wrapped
    backend (``create_entity``, ``receive``, ``count``, ``message_ids``...) is
    available as a coroutine function of the same name, run on the same thread.
    """

    def __init__(self, backend: Backend, *, workers: int = 1) -> None:
        missing = [name for name in _PROTOCOL if not callable(getattr(backend, name, None))]
        if missing:
            raise ConfigurationError(
                f"ThreadedBackend needs a sync Backend; {type(backend).__name__} has no "
                f"{', '.join(missing)}",
                field="backend",
            )
        if inspect.iscoroutinefunction(getattr(backend, "send", None)):
            raise ConfigurationError(
                f"{type(backend).__name__} is already asynchronous: use it directly",
                field="backend",
            )
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigurationError("workers must be an int >= 1", field="workers")
        self._inner = backend
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sendonce-aio")
        self._closed = False

    @property
    def inner(self) -> Backend:
        """The wrapped sync backend (use it only from the worker thread or after close)."""
        return self._inner

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """The wrapped backend's (``native_submit`` where its own ``submit`` is)."""
        return capabilities_of(self._inner)

    @property
    def supports_atomic(self) -> bool | None:
        """Whether the wrapped backend can send all-or-nothing groups."""
        return getattr(self._inner, "supports_atomic", None)

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the backend's worker thread and await it."""
        if self._closed:
            raise ConfigurationError("the backend is closed", field="backend")
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._executor, call)

    # -- AsyncBackend ---------------------------------------------------------------

    async def describe(self, entity: str) -> EntityProfile:
        """The wrapped backend's profile of ``entity``, read on the worker thread."""
        return await self.run(self._inner.describe, entity)

    reports_dispatch = True
    """A send cancelled while it waits for the worker thread never starts, and the sender
    knows it sent nothing (``sendonce.backends._dispatch``)."""

    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """The wrapped backend's ``send``, run on the worker thread."""
        inner = self._inner.send
        return await self.run(_dispatched, inner, entity, messages, timeout=timeout, atomic=atomic)

    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """The wrapped backend's ``schedule``, run on the worker thread."""
        inner = self._inner.schedule
        return await self.run(_dispatched, inner, entity, messages, at, timeout=timeout)

    def submit(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> asyncio.Future[list[Ack]]:
        """Hand one transfer over (docs/engine.md): the wrapped backend's native ``submit``
        followed on this loop, else its ``send`` on the worker threads. Cancelling succeeds
        while the transfer waits (nothing sent), never once it may have left."""
        if self._closed:
            raise ConfigurationError("the backend is closed", field="backend")
        loop = asyncio.get_running_loop()
        native = submit_of(self._inner) if capabilities_of(self._inner).native_submit else None
        if native is not None:
            inner = native(entity, messages, timeout=timeout, atomic=atomic)
            if not isinstance(inner, concurrent.futures.Future):
                raise ConfigurationError(
                    f"{type(self._inner).__name__}.submit must return a concurrent.futures.Future",
                    field="backend",
                )
            return bridge(inner, loop)
        call = functools.partial(
            contextvars.copy_context().run,
            self._inner.send,
            entity,
            messages,
            timeout=timeout,
            atomic=atomic,
        )
        try:
            return bridge(self._executor.submit(call), loop)
        except RuntimeError:  # the executor stopped with the backend
            raise ConfigurationError("the backend is closed", field="backend") from None

    async def close(self) -> None:
        """Close the wrapped backend (after any call in flight) and stop the thread."""
        if self._closed:
            return
        try:
            await self.run(self._inner.close)
        finally:
            self._closed = True
            self._executor.shutdown(wait=False)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        target = getattr(self._inner, name)  # AttributeError when the backend lacks it
        if not callable(target):
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.run(target, *args, **kwargs)

        call.__name__ = name
        call.__doc__ = getattr(target, "__doc__", None)
        return call

    def __repr__(self) -> str:
        return f"ThreadedBackend({self._inner!r})"


def _dispatched(call: Callable[..., list[Ack]], /, *args: Any, **kwargs: Any) -> list[Ack]:
    """``call`` on the worker thread, unless its sender gave it up while it waited there."""
    if not dispatching():
        raise NotSentError(
            "the call was given up (its task cancelled) while it waited for the backend's "
            "worker thread; nothing was sent"
        )
    return call(*args, **kwargs)
