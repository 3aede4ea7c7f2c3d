"""How far a resend may reach back on an Artemis address: the count-bounded window.

Artemis remembers the last ``id-cache-size`` duplicate ids per address, a ring. A resend
of id X is dropped as a duplicate only while fewer than ``id-cache-size`` other ids have
entered that address's cache since X did. The backend cannot see the cache. What it can
know is its own traffic: how many messages it sent to the address since X's first
attempt (the *distance*). Other producers' messages to the address evict ids too, and no
client can count them, so a resend is allowed only while the distance is below a fraction
(``reach``, default one half) of the cache: the rest is left to the other producers and to
the transfers in flight. Past it the message is reported in doubt
(:class:`~sendonce.errors.InDoubtError`) instead of being resent: the sender's ledger (or
the operator) decides it.

The distance is counted per backend instance and address, from every message attempted
(first sends and resends alike: over-counting only makes the bound safer). Ids are
remembered for a bounded count (four caches' worth); an id older than that is taken as a
first send, which it almost certainly is.

Beside its position, each id keeps the :class:`Attempt` of its first transfer that put
anything on the wire: where that went (``_artemis_cache``), so a resend can be kept from
reaching another cache than the first attempt did.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Attempt", "Beyond", "ResendReach"]


class Attempt:
    """One transfer's attempt: where it reached (set once it sent something), shared by
    its ids."""

    __slots__ = ("reached",)

    def __init__(self) -> None:
        self.reached: Any = None


@dataclass(frozen=True, slots=True)
class Beyond:
    """An id whose resend would reach past the safe part of the cache."""

    message_id: str
    distance: int
    limit: int


@dataclass(slots=True)
class _Address:
    sent: int = 0
    first: OrderedDict[str, tuple[int, Attempt]] = field(default_factory=OrderedDict)


class ResendReach:
    """Per address: messages this backend sent there, and where each id's first attempt was."""

    def __init__(self, reach: float) -> None:
        self.reach = reach
        self._lock = threading.Lock()
        self._addresses: dict[str, _Address] = {}

    def limit(self, cache_size: int) -> int:
        """The largest distance at which a resend is still allowed."""
        return max(int(cache_size * self.reach) - 1, 0)

    def earlier(self, address: str, ids: Sequence[str]) -> list[tuple[str, Any]]:
        """The ids attempted before whose first attempt reached the broker, with where it
        went (an ``_artemis_cache.Reached``)."""
        with self._lock:
            state = self._addresses.get(address)
            if state is None:
                return []
            first = state.first
            found = []
            for message_id in ids:
                seen = first.get(message_id)
                if seen is not None and seen[1].reached is not None:
                    found.append((message_id, seen[1].reached))
            return found

    def admit(
        self,
        address: str,
        ids: Sequence[str],
        cache_size: int,
        attempt: Attempt | None = None,
    ) -> list[Beyond]:
        """Count ``ids`` as attempted now (by ``attempt``), unless one of them is a resend
        past the limit: then nothing is counted and those ids are returned."""
        limit = self.limit(cache_size)
        attempt = Attempt() if attempt is None else attempt
        with self._lock:
            state = self._addresses.get(address)
            if state is None:
                state = self._addresses[address] = _Address()
            first, sent = state.first, state.sent
            beyond = [
                Beyond(message_id, sent - seen[0], limit)
                for message_id in ids
                if (seen := first.get(message_id)) is not None and sent - seen[0] > limit
            ]
            if beyond:
                return beyond
            for message_id in ids:
                seen = first.get(message_id)
                if seen is None:
                    first[message_id] = (sent, attempt)
                elif seen[1].reached is None:  # its earlier attempts sent nothing
                    first[message_id] = (seen[0], attempt)
                sent += 1
            state.sent = sent
            keep = max(4 * cache_size, 1024)
            while len(first) > keep:
                first.popitem(last=False)
            return []

    def forget(self, address: str) -> None:
        """The address's cache was cleared (its last queue deleted): start counting afresh."""
        with self._lock:
            self._addresses.pop(address, None)
