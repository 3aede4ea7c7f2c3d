"""Before an Artemis resend: would it reach the id cache its first attempt reached?

A resend is dropped as a duplicate only by the very cache that took the first attempt.
Another node, a restart without a persisted cache, or the address's last queue deleted
give the address another cache without telling the producer (the rule: ``_cache``). Each
check costs one management round trip, on resends only (docs/artemis.md, "Where a resend
goes").
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ..._entity import EntityProfile
from ..._message import Message
from ...errors import InDoubtError, TransientSendError
from ._cache import QueueSet, Reached, different_cache, queue_filter, queue_ids
from ._management import ManagementRefused
from ._requests import Connect

if TYPE_CHECKING:
    from ._backend import ArtemisBackend

__all__ = ["ResendChecks"]

logger = logging.getLogger("sendonce.artemis")


class ResendChecks:
    """The resend checks of one backend, and what it last read of each address's queues."""

    def __init__(self, backend: ArtemisBackend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._queue_sets: dict[str, QueueSet] = {}

    def generation(self, entity: str) -> int:
        """How many times the address's id cache was seen dropped (its queues all gone)."""
        return self._queue_set(entity).generation

    def _queue_set(self, entity: str) -> QueueSet:
        with self._lock:
            found = self._queue_sets.get(entity)
            if found is None:
                found = self._queue_sets[entity] = QueueSet()
            return found

    def check(
        self,
        entity: str,
        profile: EntityProfile,
        earlier: list[tuple[str, Any]],
        first_message: Message,
    ) -> int | None:
        """Before a resend: where would it go now? ``InDoubtError`` when that is not the
        cache the first attempt reached (``_cache``); else the connection the resend
        must go on (None: not connected now, the transfer's own attempt fails and retries)."""
        connect = Connect()
        self._backend._submit(connect)
        if not connect.wait(self._backend._connect_timeout) or connect.error is not None:
            self._backend._loop.abandon(connect)
            return None
        incarnation = self._backend._loop.incarnation
        if incarnation is None:
            return None
        uptime = self._backend._loop.uptime_call
        if uptime is not None:
            uptime.wait(self._backend._management_timeout)  # the broker's start, read or not
        queues = self._queue_set(entity)
        if self._backend.require_duplicate_detection:
            self._reread_queues(entity, queues)
        now = Reached(incarnation, queues.generation, profile.persist_id_cache)
        for message_id, first in earlier:
            why = different_cache(first, now)
            if why is not None:
                raise InDoubtError(
                    f"message {message_id!r} is in doubt and is not resent to address "
                    f"{entity!r}: {why}, so a resend could store it twice. Check the address "
                    "(browse it for the id), or let a ledger decide.",
                    message_id=message_id,
                    partition_key=first_message.partition_key,
                )
        return incarnation.connection

    def _reread_queues(self, entity: str, queues: QueueSet) -> None:
        """Compare the address's queues now with the last reading: none of them left means
        its id cache may have been dropped in between (a new generation)."""
        if queues.ids is None:
            snapshot = self._backend._loop.queue_snapshots.get(entity)
            if (
                snapshot is not None
                and snapshot.wait(self._backend._management_timeout)
                and snapshot.error is None
            ):
                queues.ids = queue_ids(snapshot.value, entity)
        try:
            answer = self._backend._manage("broker", "listQueues", [queue_filter(entity), 1, 1000])
        except (ManagementRefused, TransientSendError) as exc:
            logger.info(
                "cannot read the queues of %s (%s): not checked before the resend", entity, exc
            )
            return
        current = queue_ids(answer, entity)
        if current is None:
            return
        with self._lock:
            if queues.ids and current.isdisjoint(queues.ids):
                queues.generation += 1
                logger.warning(
                    "address %r: none of its queues %s is left (now %s): its id cache was "
                    "dropped with them; messages first sent before are in doubt",
                    entity,
                    sorted(queues.ids),
                    sorted(current),
                )
            queues.ids = current
