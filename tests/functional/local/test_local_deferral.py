"""Deferred messages in the local broker, on a real broker file."""

from __future__ import annotations

import pytest

from sendonce import Message, ValidationError
from sendonce.backends.local import LockLostError, MessageNotFoundError


def msg(message_id: str) -> Message:
    return Message("b", message_id=message_id)


def test_a_deferred_message_comes_back_only_by_sequence_number(broker, make_entity):
    make_entity()
    broker.send("orders", [msg("later"), msg("now")], timeout=5)
    (first,) = broker.receive("orders", mode="peek_lock")
    broker.defer("orders", first.lock_token)
    assert [m.message_id for m in broker.receive("orders", max_messages=5)] == ["now"]
    assert broker.receive("orders") == []
    assert [m.message_id for m in broker.peek("orders", max_messages=5)] == ["later"]
    (again,) = broker.receive_deferred("orders", [first.sequence_number])
    assert again.message_id == "later" and again.delivery_count == 2
    broker.abandon("orders", again.lock_token)  # stays deferred
    assert broker.receive("orders") == []
    (again,) = broker.receive_deferred("orders", [first.sequence_number])
    broker.complete("orders", again.lock_token)
    assert broker.peek("orders") == []


def test_a_deferred_message_can_be_dead_lettered(broker, make_entity):
    make_entity()
    broker.send("orders", [msg("d")], timeout=5)
    (m,) = broker.receive("orders", mode="peek_lock")
    broker.defer("orders", m.lock_token)
    (again,) = broker.receive_deferred("orders", [m.sequence_number])
    broker.dead_letter("orders", again.lock_token, reason="gave up")
    (dead,) = broker.receive("orders", sub_queue="dead_letter")
    assert (dead.message_id, dead.dead_letter_reason) == ("d", "gave up")


def test_unknown_or_locked_sequence_numbers_are_not_found(broker, make_entity):
    make_entity()
    broker.send("orders", [msg("a"), msg("b")], timeout=5)
    a, b = broker.receive("orders", mode="peek_lock", max_messages=2)
    broker.defer("orders", a.lock_token)
    with pytest.raises(MessageNotFoundError):
        broker.receive_deferred("orders", [a.sequence_number, b.sequence_number])
    broker.receive_deferred("orders", [a.sequence_number])
    with pytest.raises(MessageNotFoundError):  # locked by the first caller
        broker.receive_deferred("orders", [a.sequence_number])
    with pytest.raises(ValidationError) as err:
        broker.receive_deferred("orders", 5)  # type: ignore[arg-type]
    assert err.value.field == "sequence_numbers"
    with pytest.raises(LockLostError):
        broker.defer("orders", "no-such-token")
