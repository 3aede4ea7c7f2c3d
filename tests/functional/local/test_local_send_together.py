"""``LocalBackend.send_together``: several sends in one commit, each with the acks it would
get alone; one that fails leaves nothing of any stored."""

from __future__ import annotations

import pytest

from sendonce import EntityProfile, Message
from sendonce.backends import Ack
from sendonce.backends.local import LocalBackend
from sendonce.errors import PermanentSendError


def _m(message_id: str, **fields: object) -> Message:
    return Message(b"body " + message_id.encode(), message_id=message_id, **fields)  # type: ignore[arg-type]


def test_each_send_gets_the_acks_it_would_get_alone(broker: LocalBackend) -> None:
    broker.create_entity(EntityProfile("orders"))
    broker.create_entity(EntityProfile("audit"))
    broker.send("orders", [_m("before")], timeout=5)
    acks = broker.send_together(
        [
            ("orders", [_m("a"), _m("b")], None),
            ("audit", [_m("a")], None),  # another entity: its own id space
            ("orders", [_m("b"), _m("c")], None),  # b: sent just before, in this group
            ("orders", [_m("before")], None),
        ],
        timeout=5,
    )
    assert acks == [
        [Ack("accepted", 2), Ack("accepted", 3)],
        [Ack("accepted", 1)],
        [Ack("duplicate"), Ack("accepted", 5)],
        [Ack("duplicate")],
    ]
    assert broker.message_ids("orders") == ["before", "a", "b", "c"]
    assert broker.message_ids("audit") == ["a"]


def test_one_refused_send_leaves_nothing_of_any_stored(broker: LocalBackend) -> None:
    broker.create_entity(EntityProfile("orders"))
    broker.create_entity(EntityProfile("sessions-only", sessions=True))
    with pytest.raises(PermanentSendError, match="session_id"):
        broker.send_together(
            [("orders", [_m("x")], None), ("sessions-only", [_m("y")], None)], timeout=5
        )
    assert broker.message_ids("orders") == []
    assert broker.message_ids("sessions-only") == []
    # the same sends alone: only the refused one fails
    assert broker.send("orders", [_m("x")], timeout=5) == [Ack("accepted", 1)]
