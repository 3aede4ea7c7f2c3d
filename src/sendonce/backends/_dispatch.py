"""Whether an awaited backend call may have reached the broker: what a cancelled call frees.

A transfer can wait inside a backend before anything goes on the wire: behind the one
worker thread of :class:`~sendonce.aio.ThreadedBackend`, or for a free sender link of
the Service Bus backend. A task cancelled there sent nothing, so with a ledger its
intents are released, not left in doubt. Only the backend knows when a call leaves its
queue, so the sender and the backend share one :class:`Dispatch` per call (through a
context variable: the backend protocol is unchanged) and settle who came first under
a lock: the backend's :func:`dispatching` (the call goes to the broker) or the
sender's :meth:`Dispatch.abandon` (the call was given up). A call abandoned first never
starts; a call that started first counts as possibly stored.

A backend tells the sender it reports this with a class attribute
``reports_dispatch = True``; any other backend's call counts as possibly stored as soon
as it is made (the safe side).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["Dispatch", "dispatch", "dispatching", "reports_dispatch"]

_PENDING, _STARTED, _ABANDONED = 0, 1, 2


class Dispatch:
    """One backend call: pending, then started (by the backend) or abandoned (by the
    sender), whichever comes first."""

    __slots__ = ("_lock", "_state")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the backend may start the call in its own thread
        self._state = _PENDING

    def start(self) -> bool:
        """The backend sends now; False: the sender abandoned the call first (send nothing)."""
        with self._lock:
            if self._state == _ABANDONED:
                return False
            self._state = _STARTED
            return True

    def abandon(self) -> bool:
        """The sender is done with the call: True if it never started (and never will)."""
        with self._lock:
            if self._state == _STARTED:
                return False
            self._state = _ABANDONED
            return True


_current: ContextVar[Dispatch | None] = ContextVar("sendonce_dispatch", default=None)


@contextmanager
def dispatch() -> Iterator[Dispatch]:
    """The :class:`Dispatch` of the backend call made inside the block."""
    call = Dispatch()
    token = _current.set(call)
    try:
        yield call
    finally:
        _current.reset(token)


def dispatching() -> bool:
    """Called by a backend as its call leaves its queue for the broker (in the call's
    context: a worker thread gets it with ``contextvars.copy_context``). False: the
    sender gave the call up first, and nothing may be sent."""
    call = _current.get()
    return True if call is None else call.start()


def reports_dispatch(backend: object) -> bool:
    """Whether ``backend`` calls :func:`dispatching` before it sends."""
    return getattr(backend, "reports_dispatch", False) is True
