"""What a caller hands the Artemis event loop and waits for (``_loop``).

A request is finished (a value or an error) or abandoned (its caller stopped waiting)
exactly once, whichever comes first: the loop thread finishes, caller threads wait.
A management operation is a request too (``_management.ManagementCall``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import TransientSendError
from ._cache import Incarnation
from ._errors import outcome_error

__all__ = ["Connect", "Request", "Transfer"]

logger = logging.getLogger("sendonce.artemis")


class Request:
    """Work a caller hands to the loop and waits for; finished or abandoned exactly once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._done = False
        # Made by the first ``wait`` only: a submitted transfer is waited on through its
        # future, so most requests never need one (a Condition and two locks each).
        self._event: threading.Event | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.started = time.monotonic()
        self.deadline: float | None = None  # the loop gives up on it then (``expire``)
        self.on_done: Callable[[], None] | None = None  # run once finished or expired

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        with self.lock:
            if self._done or self.abandoned:
                return
            self.value, self.error = value, error
            self._done = True
            event = self._event
        if event is not None:
            event.set()
        self._call_back()

    def expire(self) -> bool:
        """The deadline passed without an answer: abandon it and run ``on_done`` (False:
        it had finished already)."""
        if not self.abandon():
            return False
        self._call_back()
        return True

    def _call_back(self) -> None:
        callback, self.on_done = self.on_done, None
        if callback is not None:
            try:
                callback()
            except Exception:  # pragma: no cover - a bug: keep the loop alive for the others
                logger.exception("completing an Artemis request failed")

    @property
    def finished(self) -> bool:
        return self._done

    def wait(self, timeout: float) -> bool:
        with self.lock:
            if self._done:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(max(timeout, 0.0))

    def abandon(self) -> bool:
        """Stop waiting; False when it had finished already (its result stands)."""
        with self.lock:
            if self._done:
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
        self.future: concurrent.futures.Future[Any] | None = None  # a submit's, if any

    def claim_next(self) -> int | None:
        """The index of the next message to send, or None once abandoned, cancelled (its
        future, before the first delivery) or all sent."""
        with self.lock:
            if self.abandoned or self._done or self.sent >= len(self.payloads):
                return None
            # From the first delivery the transfer may be on the wire: its future can no
            # longer be cancelled. Cancelled before: nothing is sent, ever.
            if (
                self.sent == 0
                and self.future is not None
                and not self.future.set_running_or_notify_cancel()
            ):
                self.abandoned = True
                return None
            self.sent += 1
            return self.sent - 1

    def conclude(self) -> None:
        """Every delivery of a plain transfer is settled: finish with the acks, or with its
        first refusal (in doubt when some of it was accepted)."""
        outcomes = self.outcomes
        refused = [(i, o) for i, o in enumerate(outcomes) if o is not None and o[0] != "accepted"]
        if not refused:
            self.finish(["accepted"] * len(outcomes))
            return
        index, (outcome, condition, description) = refused[0]
        message_id, partition_key = self.ids[index]
        error = outcome_error(
            outcome,
            condition,
            description,
            entity=self.entity,
            message_id=message_id,
            partition_key=partition_key,
        )
        if len(refused) < len(outcomes):
            # Some of the transfer were stored, some refused: the transfer as a whole is
            # reported in doubt (retried: the stored ones are dropped as duplicates).
            error = TransientSendError(
                f"{len(outcomes) - len(refused)} of {len(outcomes)} messages to "
                f"{self.entity!r} were accepted, the others refused (first: {error}); the "
                "transfer is retried whole (the accepted ones are dropped as duplicates)",
                condition=getattr(error, "condition", None),
            )
        self.finish(error=error)

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
