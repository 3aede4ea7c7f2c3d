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
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Beyond", "ResendReach"]


@dataclass(frozen=True, slots=True)
class Beyond:
    """An id whose resend would reach past the safe part of the cache."""

    message_id: str
    distance: int
    limit: int


@dataclass(slots=True)
class _Address:
    sent: int = 0
    first: OrderedDict[str, int] = field(default_factory=OrderedDict)


class ResendReach:
    """Per address: messages this backend sent there, and where each id's first attempt was."""

    def __init__(self, reach: float) -> None:
        self.reach = reach
        self._lock = threading.Lock()
        self._addresses: dict[str, _Address] = {}

    def limit(self, cache_size: int) -> int:
        """The largest distance at which a resend is still allowed."""
        return max(int(cache_size * self.reach) - 1, 0)

    def admit(self, address: str, ids: Sequence[str], cache_size: int) -> list[Beyond]:
        """Count ``ids`` as attempted now, unless one of them is a resend past the limit:
        then nothing is counted and those ids are returned."""
        limit = self.limit(cache_size)
        with self._lock:
            state = self._addresses.get(address)
            if state is None:
                state = self._addresses[address] = _Address()
            first, sent = state.first, state.sent
            beyond = [
                Beyond(message_id, sent - at, limit)
                for message_id in ids
                if (at := first.get(message_id)) is not None and sent - at > limit
            ]
            if beyond:
                return beyond
            for message_id in ids:
                if message_id not in first:
                    first[message_id] = sent
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
