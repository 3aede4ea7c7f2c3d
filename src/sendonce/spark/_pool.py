"""One Service Bus connection per executor process, reused by its tasks while they keep coming.

Opening an azure-servicebus connection (AMQP open, claims-based auth, link
attach) and closing it cost about a second of waiting each; a job with many
partitions paid that once per partition. A Python worker runs one task at a
time and Spark reuses workers across tasks (``spark.python.worker.reuse``,
on by default), so a task hands its backend back here when it succeeds and
the next task of the same url takes it. Exclusive: a backend is either in the
pool or in one task's hands, never both (the client is not thread-safe).

Not leaked: a backend idle for ``keep`` seconds is closed by a daemon thread,
and all are closed at interpreter exit. A task that fails closes its backend
instead of returning it (it may be broken); its retry connects afresh.
Only Service Bus urls are pooled; the local broker opens per task.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from dataclasses import dataclass

from ..backends import Backend
from ..backends._url import LOCAL_SCHEME, connect

__all__ = ["Borrowed", "close_idle", "pooled"]


@dataclass(slots=True)
class _Idle:
    backend: Backend
    since: float
    keep: float


_lock = threading.Lock()
_idle: dict[str, _Idle] = {}
_reaper: threading.Thread | None = None


def pooled() -> int:
    """How many idle backends this process keeps (for tests)."""
    with _lock:
        return len(_idle)


def close_idle(*, everything: bool = False) -> None:
    """Close pooled backends idle longer than they may be kept (or all of them)."""
    now = time.monotonic()
    with _lock:
        stale = [u for u, e in _idle.items() if everything or now - e.since >= e.keep]
        closing = [_idle.pop(u).backend for u in stale]
    for backend in closing:
        _close_quietly(backend)


def _close_quietly(backend: Backend) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection must not fail anything
        backend.close()


def _reap() -> None:
    while True:
        time.sleep(0.5)
        close_idle()


def _start_reaper() -> None:
    global _reaper
    if _reaper is None or not _reaper.is_alive():
        _reaper = threading.Thread(target=_reap, name="sendonce-pool-reaper", daemon=True)
        _reaper.start()


atexit.register(close_idle, everything=True)


class Borrowed:
    """A backend held by one task: ``release(healthy)`` returns it to the pool or closes it."""

    def __init__(self, url: str, keep: float) -> None:
        self._url = url
        self._keep = keep if not url.startswith(LOCAL_SCHEME) else 0.0
        entry = None
        if self._keep > 0:
            with _lock:
                entry = _idle.pop(url, None)
        self.backend: Backend = connect(url) if entry is None else entry.backend
        self.reused = entry is not None

    def release(self, *, healthy: bool) -> None:
        backend = self.backend
        if healthy and self._keep > 0:
            with _lock:
                if self._url not in _idle:
                    _idle[self._url] = _Idle(backend, time.monotonic(), self._keep)
                    _start_reaper()
                    return
        _close_quietly(backend)
