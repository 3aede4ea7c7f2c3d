"""The sender links of an Artemis connection: one per (address, routing capability).

Every transfer to an address is deliveries on its link, pipelined: as many unsettled at
once as the broker's credit allows (Artemis grants 1,000 by default). A link holds the
transfers waiting for its attach, those waiting for credit, and those with a delivery on
it, so that a detach (or the connection's loss) fails exactly those (loop thread only).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from proton import Link, symbol
from proton.reactor import LinkOption

from ._requests import Transfer

__all__ = ["Capability", "SenderLink"]


@dataclass(eq=False)
class SenderLink:
    """One sender link and the transfers on it."""

    link: Any
    address: str
    capability: str | None
    attached: bool = False
    queue: deque[Transfer] = field(default_factory=deque)  # waiting for credit
    waiting: list[Transfer] = field(default_factory=list)  # waiting for the attach
    transfers: set[Transfer] = field(default_factory=set)  # with a delivery on this link


class Capability(LinkOption):
    """The target capability that picks the routing type: ``queue`` anycast, ``topic``
    multicast (what Artemis reads on an AMQP sender link)."""

    def __init__(self, capability: str | None) -> None:
        self.capability = capability

    def apply(self, link: Link) -> None:
        if self.capability is not None:
            link.target.capabilities.put_object(symbol(self.capability))
