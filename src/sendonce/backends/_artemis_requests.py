"""What a caller hands the Artemis event loop and waits for (``_artemis_loop``).

A request is finished (a value or an error) or abandoned (its caller stopped waiting)
exactly once, whichever comes first: the loop thread finishes, caller threads wait.
A management operation is a request too (``_artemis_management.ManagementCall``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ._artemis_cache import Incarnation

__all__ = ["Connect", "Request", "Transfer"]


class Request:
    """Work a caller hands to the loop and waits for; finished or abandoned exactly once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.started = time.monotonic()

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        with self.lock:
            if self._done.is_set() or self.abandoned:
                return
            self.value, self.error = value, error
            self._done.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(max(timeout, 0.0))

    def abandon(self) -> bool:
        """Stop waiting; False when it had finished already (its result stands)."""
        with self.lock:
            if self._done.is_set():
                return False
            self.abandoned = True
            return True


class Transfer(Request):
    """One ``send`` call: its encoded messages and what the broker said of each."""

    def __init__(
        self,
        entity: str,
        capability: str | None,
        payloads: list[bytes],
        ids: list[tuple[str, str | None]],
        *,
        atomic: bool,
    ) -> None:
        super().__init__()
        self.entity = entity
        self.capability = capability
        self.payloads = payloads
        self.ids = ids
        self.atomic = atomic
        self.sent = 0  # deliveries handed to proton (under ``lock``)
        self.settled = 0
        self.outcomes: list[tuple[str, str | None, str | None] | None] = [None] * len(payloads)
        self.commit_sent = False
        self.txn: Any = None
        self.sent_on: Incarnation | None = None  # the broker its first delivery went to
        self.expect: int | None = None  # send only on this connection (a checked resend)

    def claim_next(self) -> int | None:
        """The index of the next message to send, or None once abandoned or all sent."""
        with self.lock:
            if self.abandoned or self._done.is_set() or self.sent >= len(self.payloads):
                return None
            self.sent += 1
            return self.sent - 1

    @property
    def in_doubt(self) -> bool:
        """Something may have been stored: a delivery sent and not settled, one the broker
        accepted (the rest of the transfer waiting for credit when the connection goes), or
        a commit sent without its outcome."""
        if self.atomic:
            return self.commit_sent
        return self.sent > self.settled or any(
            o is not None and o[0] == "accepted" for o in self.outcomes
        )


class Connect(Request):
    """Open (and verify) the connection now; finishes with None once it is ready."""
