"""A hand-written proton client for tests: it checks the broker's facts without sendonce's code.

Blocking (``proton.utils.BlockingConnection``), one connection per call: slow, simple, and
independent of the backend under test.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from proton import Delivery, Link, Message, symbol
from proton.reactor import LinkOption
from proton.utils import BlockingConnection

__all__ = ["Routing", "drain", "raw_send"]


class Routing(LinkOption):
    """Target (sender) or source (receiver) capability ``queue`` (anycast) or ``topic``."""

    def __init__(self, capability: str) -> None:
        self.capability = capability

    def apply(self, link: Link) -> None:
        terminus = link.target if link.is_sender else link.source
        terminus.capabilities.put_object(symbol(self.capability))


def raw_send(
    url: str,
    address: str,
    messages: Iterable[tuple[str, Any]],
    *,
    capability: str = "queue",
    properties: Mapping[str, Any] | None = None,
) -> list[int]:
    """Send ``(duplicate id, body)`` pairs one at a time; the remote outcome of each."""
    connection = BlockingConnection(url, timeout=30)
    try:
        sender = connection.create_sender(address, options=Routing(capability))
        outcomes = []
        for dup_id, body in messages:
            props = {**(properties or {}), "_AMQ_DUPL_ID": dup_id}
            delivery = sender.send(Message(body=body, id=str(dup_id), properties=props))
            outcomes.append(delivery.remote_state)
        return outcomes
    finally:
        connection.close()


def drain(url: str, address: str, *, capability: str = "queue", idle: float = 0.5) -> list[Message]:
    """Receive and accept what the queue holds until it stays empty for ``idle`` seconds."""
    connection = BlockingConnection(url, timeout=30)
    try:
        receiver = connection.create_receiver(address, credit=100, options=Routing(capability))
        got = []
        while True:
            try:
                got.append(receiver.receive(timeout=idle))
            except Exception:  # proton.Timeout: nothing more arrived
                return got
            receiver.accept()
    finally:
        connection.close()


ACCEPTED = Delivery.ACCEPTED
