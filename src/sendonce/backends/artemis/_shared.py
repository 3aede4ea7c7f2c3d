"""One connection per broker per process: ``ArtemisBackend`` objects share event loops.

Every backend made for the same broker, user, password and TLS settings in one process
uses one :class:`~sendonce.backends.artemis._loop.ArtemisLoop` (one AMQP connection, one
thread), counted by reference: the last ``close`` closes it. A Spark task, a web worker's
request handlers, a relay and a sender each opening ``connect(url)`` thus hold one
connection between them, and transfers from all of them are deliveries on its links. What
each backend counts for itself (the resend reach, its profiles) stays its own.

A lost connection fails the transfers of every backend on it (each its own outcome: in
doubt where a delivery was written, not sent otherwise); the next transfer of any of them
opens a new one.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from ._loop import ArtemisLoop

__all__ = ["acquire", "release", "shared_loops"]

_lock = threading.Lock()
_loops: dict[tuple[Any, ...], list[Any]] = {}  # key -> [loop, users]


def _key(options: dict[str, Any], tls_key: object) -> tuple[Any, ...]:
    password = options.get("password")
    secret = None if password is None else hashlib.sha256(password.encode()).hexdigest()
    return (
        os.getpid(),
        options["host"],
        options["port"],
        options.get("user"),
        secret,
        tls_key,
        options["heartbeat"],
        options["require_artemis"],
        options["check_acceptor"],
    )


def acquire(tls_key: object, **options: Any) -> tuple[tuple[Any, ...], ArtemisLoop]:
    """The loop for these connection options (opened if none is), and the key that
    :func:`release` takes. ``tls_key`` says which TLS settings (an ``SSLDomain`` object
    cannot be compared)."""
    key = _key(options, tls_key)
    with _lock:
        entry = _loops.get(key)
        if entry is not None and entry[0].alive:
            entry[1] += 1
            return key, entry[0]
        loop = ArtemisLoop(**options)
        _loops[key] = [loop, 1]
        return key, loop


def release(key: tuple[Any, ...], loop: ArtemisLoop, wait: float) -> None:
    """One user fewer; the last closes the connection and stops the loop."""
    with _lock:
        entry = _loops.get(key)
        last = True
        if entry is not None and entry[0] is loop:
            entry[1] -= 1
            last = entry[1] <= 0
            if last:
                del _loops[key]
    if last:
        loop.close(wait)


def shared_loops() -> int:
    """How many loops (connections) this process holds open: for tests and benchmarks."""
    with _lock:
        return sum(1 for loop, _ in _loops.values() if loop.alive)
