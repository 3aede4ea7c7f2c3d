"""What a link is attached to (an entity, a subscription, $cbs, $management) and what it holds."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from proton import symbol

from . import _codec
from ._conditions import TIMEOUT

if TYPE_CHECKING:
    from ..backends.local import LocalSession

__all__ = ["Locked", "Node", "attach_wait", "parse_node", "strip_address", "terminus_map"]

SESSION_FILTER = symbol("com.microsoft:session-filter")
SESSION_LOCKED_UNTIL = symbol("com.microsoft:locked-until-utc")
_SUBSCRIPTIONS = "/subscriptions/"
_DEAD_LETTER_QUEUE = "/$deadletterqueue"
_TRANSFER_DEAD_LETTER_QUEUE = "/$transfer/$deadletterqueue"
# How long a NEXT_AVAILABLE_SESSION attach waits for a session before the broker
# answers com.microsoft:timeout (the service's default operation timeout is 60 s).
_SESSION_WAIT = timedelta(seconds=60)


@dataclass
class Node:
    """What a link is attached to."""

    kind: str  # "entity" | "management" | "cbs"
    entity: str = ""
    subscription: str | None = None
    session_id: str | None = None  # a session receiver's locked session
    # "dead_letter" for <entity>/$DeadLetterQueue,
    # "transfer_dead_letter" for <entity>/$Transfer/$DeadLetterQueue
    sub_queue: Any = None


@dataclass(eq=False)
class Locked:
    """A peek-locked message handed to a client: how to settle it, and until when it is held."""

    entity: str
    subscription: str | None
    lock_token: str
    key: uuid.UUID  # the lock token as the client reads it from the delivery tag
    connection: Any  # the connection it was handed to: its bookkeeping goes with it
    locked_until: datetime | None
    sub_queue: Any = None
    session: LocalSession | None = None  # received in a session: settled through it


def strip_address(address: str | None) -> str:
    """The node path of a link address (``amqps://host:port/orders`` -> ``orders``)."""
    text = address or ""
    if "://" in text:
        text = text.split("://", 1)[1]
        text = text.split("/", 1)[1] if "/" in text else ""
    return text.strip("/")


def parse_node(path: str) -> Node:
    """The node a link address names."""
    if path == "$cbs":
        return Node("cbs")
    if path.endswith("/$management") or path == "$management":
        entity = path[: -len("$management")].rstrip("/")
        base = parse_node(entity) if entity else Node("entity")
        return Node("management", base.entity, base.subscription, sub_queue=base.sub_queue)
    if path.lower().endswith(_TRANSFER_DEAD_LETTER_QUEUE):
        base = parse_node(path[: -len(_TRANSFER_DEAD_LETTER_QUEUE)])
        base.sub_queue = "transfer_dead_letter"
        return base
    if path.lower().endswith(_DEAD_LETTER_QUEUE):
        base = parse_node(path[: -len(_DEAD_LETTER_QUEUE)])
        base.sub_queue = "dead_letter"
        return base
    lowered = path.lower()
    if _SUBSCRIPTIONS in lowered:
        i = lowered.index(_SUBSCRIPTIONS)
        return Node("entity", path[:i], path[i + len(_SUBSCRIPTIONS) :])
    return Node("entity", path)


def attach_wait(link: Any) -> timedelta:
    """How long the client lets a session attach wait: its com.microsoft:timeout, in ms."""
    props = link.remote_properties or {}
    for key, value in dict(props).items():
        if str(key) == TIMEOUT and isinstance(value, int) and value >= 0:
            return timedelta(milliseconds=int(value))
    return _SESSION_WAIT


def terminus_map(data: Any) -> dict[str, Any]:
    """A terminus filter map with str keys (empty when absent)."""
    if data is None:
        return {}
    data.rewind()
    if not data.next():
        return {}
    value = _codec._copy(data.get_object())
    if not isinstance(value, dict):
        return {}
    return {str(k): (v.value if hasattr(v, "descriptor") else v) for k, v in value.items()}
