"""How far a resend may reach back on an Artemis address: the count-bounded window.

Artemis remembers the last ``id-cache-size`` duplicate ids per address, a ring. What evicts
an id X from the ring is *new* ids stored at that address after X: a copy the broker drops as
a duplicate adds nothing to the ring, and neither does a delivery that never reached it. So a
resend of X is dropped as a duplicate only while fewer than ``id-cache-size`` distinct new ids
entered that address's cache since X did. The backend cannot see the cache. What it can
know is its own traffic: how many distinct ids it wrote to the address since X's first
attempt that wrote anything (the *distance*). Other producers' messages to the address evict
ids too, and no client can count them, so a resend is allowed only while the distance is
below a fraction (``reach``, default one half) of the cache: the rest is left to the other
producers. Past it the message is reported in doubt (:class:`~sendonce.errors.InDoubtError`)
instead of being resent: the sender's ledger (or the operator) decides it.

What counts, per backend instance and address (each rule errs towards counting more, which
only makes the bound safer):

- an id counts once, from the admission of its first attempt that wrote anything: a resend
  of an id already counted adds nothing (if the broker had it, it dropped the copy; if it
  had not, the resend stores the one copy that was counted);
- an attempt counts its new ids as soon as it is admitted (*reserved*: they may enter the
  cache while the resend of an older id is in flight) and, once it is over, keeps only the
  ones it wrote (:meth:`ResendReach.settle`): a transfer refused before a delivery went out
  (connection refused while the broker restarts, a link not attached) counts nothing, and its
  ids are first sends again at their next attempt. A transaction that wrote any delivery
  counts all its ids, committed or not;
- ids are remembered for a bounded count (four caches' worth); an id older than that is taken
  as a first send (counted again), which it almost certainly is.

Beside its position, each id keeps the :class:`Attempt` of its first transfer that put
anything on the wire: where that went (``_cache``), so a resend can be kept from
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
    its ids, and the ids it counted first (``(index in the transfer, id)``)."""

    __slots__ = ("new", "reached", "state")

    def __init__(self) -> None:
        self.reached: Any = None
        self.new: list[tuple[int, str]] = []
        self.state: _Address | None = None  # where its new ids are reserved, until settled


@dataclass(frozen=True, slots=True)
class Beyond:
    """An id whose resend would reach past the safe part of the cache."""

    message_id: str
    distance: int
    limit: int


@dataclass(slots=True)
class _Address:
    written: int = 0  # distinct ids written by attempts that are over
    reserved: int = 0  # new ids of attempts in flight (may be written)
    first: OrderedDict[str, tuple[int, Attempt]] = field(default_factory=OrderedDict)


class ResendReach:
    """Per address: distinct ids this backend wrote there, and where each id's first
    attempt was."""

    def __init__(self, reach: float) -> None:
        self.reach = reach
        self._lock = threading.Lock()
        self._addresses: dict[str, _Address] = {}

    def limit(self, cache_size: int) -> int:
        """The largest distance at which a resend is still allowed."""
        return max(int(cache_size * self.reach) - 1, 0)

    def earlier(self, address: str, ids: Sequence[str]) -> list[tuple[str, Any]]:
        """The ids attempted before whose first attempt reached the broker, with where it
        went (an ``_cache.Reached``)."""
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
        """Reserve ``ids`` new to the address for ``attempt``, unless one of them is a
        resend past the limit: then nothing is reserved and those ids are returned. An
        admitted attempt must be :meth:`settle`\\ d once it is over."""
        limit = self.limit(cache_size)
        attempt = Attempt() if attempt is None else attempt
        with self._lock:
            state = self._addresses.get(address)
            if state is None:
                state = self._addresses[address] = _Address()
            first = state.first
            now = state.written + state.reserved
            beyond = [
                Beyond(message_id, now - seen[0], limit)
                for message_id in ids
                if (seen := first.get(message_id)) is not None and now - seen[0] > limit
            ]
            if beyond:
                return beyond
            new = attempt.new
            for index, message_id in enumerate(ids):
                if message_id not in first:
                    first[message_id] = (state.written, attempt)
                    new.append((index, message_id))
            state.reserved += len(new)
            attempt.state = state
            keep = max(4 * cache_size, 1024)
            while len(first) > keep:
                first.popitem(last=False)
            return []

    def settle(self, attempt: Attempt, written: int) -> None:
        """``attempt`` is over and wrote its first ``written`` messages (the deliveries that
        went out): its new ids among them stay counted; the others were never on the wire,
        so they count nothing and their next attempt is a first send. Idempotent."""
        with self._lock:
            state, attempt.state = attempt.state, None
            if state is None:
                return
            state.reserved -= len(attempt.new)
            first = state.first
            for index, message_id in attempt.new:
                if index < written:
                    state.written += 1
                else:
                    seen = first.get(message_id)
                    if seen is not None and seen[1] is attempt:
                        del first[message_id]

    def forget(self, address: str) -> None:
        """The address's cache was cleared (its last queue deleted): start counting afresh."""
        with self._lock:
            self._addresses.pop(address, None)
