"""Which id cache a transfer reached, so a resend goes only where the first attempt went.

A resend is dropped as a duplicate only by the very cache that took the first attempt. Three
things give an Artemis address another cache, and none of them tells the producer:

- **another node**: each node of a cluster has its own caches; a reconnection that lands
  on another node (a load balancer, DNS, a failover list) reaches a cache that never saw
  the id. The node is the ``container-id`` of the broker's open frame (its node id);
- **a restart without a persisted cache** (``persist-id-cache=false``): the node is the
  same but its caches start empty. Each connection reads the broker's uptime, so the
  backend knows when the broker it reaches now was started; a connection whose start
  cannot be read counts as a restart for such an address;
- **the address's last queue deleted**: the broker drops the address's cache with it
  (and the queue's messages); a queue created afterwards starts a new cache. The backend
  reads the address's queue ids (``listQueues``) after its first link attaches and again
  before a resend: when none of the queues seen before is left, the cache may have been
  dropped in between.

Each id remembers where its first attempt that sent anything went (a :class:`Reached`);
before a resend the backend reads where it would go now, and reports the id in doubt
rather than resend it elsewhere. Where management may not be read, only the node is
checked (and a restart of a non-persisting broker is assumed at each reconnection).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Incarnation",
    "QueueSet",
    "Reached",
    "different_cache",
    "queue_filter",
    "queue_ids",
]

_START_SLACK = 0.25
"""Seconds two readings of one broker's start time may differ by (clock steps, rounding)."""


@dataclass(eq=False)
class Incarnation:
    """The broker one connection reached: its node, and when it was started (as a range of
    this process's monotonic clock, from the uptime it reported; None until read, or where
    management may not be read)."""

    node: str
    connection: int
    started: tuple[float, float] | None = None

    def same_start(self, other: Incarnation) -> bool | None:
        """Whether both connections reached one run of the broker (None: cannot tell)."""
        if self.connection == other.connection and self.node == other.node:
            return True
        if self.started is None or other.started is None:
            return None
        (a, b), (c, d) = self.started, other.started
        return a - _START_SLACK <= d and c - _START_SLACK <= b


@dataclass(eq=False)
class QueueSet:
    """An address's queues as last read, and how many times its cache was found replaced."""

    ids: frozenset[str] | None = None
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Reached:
    """Where a message's first attempt that sent anything went."""

    incarnation: Incarnation
    generation: int
    persisted: bool = field(default=True)


def different_cache(first: Reached, now: Reached) -> str | None:
    """Why a resend now would reach another cache than ``first`` did, or None."""
    a, b = first.incarnation, now.incarnation
    if a.node != b.node:
        return (
            f"the first attempt reached broker node {a.node} and a resend would reach node "
            f"{b.node}: each node of a cluster has its own id cache"
        )
    if not first.persisted or not now.persisted:
        same = a.same_start(b)
        if same is False:
            return (
                "the broker was restarted since the first attempt and does not persist its "
                "id cache (persist-id-cache=false): it no longer remembers the id"
            )
        if same is None:
            return (
                "the connection was replaced since the first attempt and the broker does not "
                "persist its id cache (persist-id-cache=false); its uptime could not be read, "
                "so a restart that emptied the cache cannot be ruled out"
            )
    if first.generation != now.generation:
        return (
            "every queue the address had at the first attempt was deleted since: the broker "
            "dropped the address's id cache with its last queue"
        )
    return None


def queue_filter(address: str) -> str:
    """The ``listQueues`` filter for the queues bound to ``address``."""
    return json.dumps({"field": "address", "operation": "EQUALS", "value": address})


def queue_ids(answer: Any, address: str) -> frozenset[str] | None:
    """The ids of ``address``'s queues in a ``listQueues`` answer (None: unreadable)."""
    if isinstance(answer, str):
        try:
            answer = json.loads(answer)
        except ValueError:
            return None
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
        return None
    return frozenset(
        str(q.get("id"))
        for q in answer["data"]
        if isinstance(q, dict) and q.get("address") == address and q.get("id") is not None
    )
