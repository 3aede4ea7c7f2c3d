"""The relay's wake-up: a connection that ``LISTEN``s on the outbox channel.

``enqueue`` sends a ``NOTIFY`` (payload: the entity) with its rows; an idle relay waits here
for one about an entity it serves, and claims again at the latest after its poll interval.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ._enqueue import CHANNEL

__all__ = ["Listener"]

logger = logging.getLogger("sendonce.outbox")


class Listener:
    """A connection that LISTENs on the outbox channel; reconnected when lost."""

    def __init__(self, url: str, entities: set[str]) -> None:
        self.url = url
        self.entities = entities
        self._conn: Any = None

    def _connect(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
            self._conn.execute(f"LISTEN {CHANNEL}")
        return self._conn

    def start(self) -> None:
        self._connect()

    def wait(self, timeout: float, stopping: threading.Event) -> bool:
        """Wait up to ``timeout`` s for a notification about one of our entities, or a stop.

        Waits on the socket in slices of at most 0.25 s (no query is sent meanwhile).
        True when woken by a notification (or a reconnection, which may have missed one).
        """
        import psycopg

        deadline = time.monotonic() + timeout
        while not stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                conn = self._connect()
                for notify in conn.notifies(timeout=min(left, 0.25)):
                    if notify.payload in self.entities:
                        return True
            except psycopg.OperationalError as exc:
                logger.warning("outbox listener lost its connection (%s); reconnecting", exc)
                self.close()
                stopping.wait(min(1.0, max(left, 0.0)))
                return True
        return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
