"""Message expiry by the broker's clock, on a real broker file."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendonce import ConfigurationError, EntityProfile, Message
from sendonce.backends import Ack


def msg(message_id: str, ttl: timedelta | None = None) -> Message:
    return Message("b", message_id=message_id, time_to_live=ttl)


def test_a_message_ttl_removes_it_from_receive_and_peek(broker, make_entity, clock):
    make_entity()
    broker.send("orders", [msg("short", timedelta(seconds=30)), msg("forever")], timeout=5)
    assert [m.message_id for m in broker.peek("orders", max_messages=5)] == ["short", "forever"]
    clock.advance(seconds=31)
    assert [m.message_id for m in broker.peek("orders", max_messages=5)] == ["forever"]
    assert [m.message_id for m in broker.receive("orders", max_messages=5)] == ["forever"]
    assert broker.peek("orders", sub_queue="dead_letter") == []
    # expiry removes the message, not its id: a resend inside the window is a duplicate
    assert broker.send("orders", [msg("short")], timeout=5) == [Ack("duplicate")]


def test_the_entity_default_ttl_caps_the_message_ttl(broker, make_entity, clock):
    make_entity(default_message_time_to_live=timedelta(minutes=1))
    broker.send(
        "orders",
        [msg("default"), msg("longer", timedelta(hours=1)), msg("shorter", timedelta(seconds=10))],
        timeout=5,
    )
    clock.advance(seconds=11)
    assert [m.message_id for m in broker.peek("orders", max_messages=5)] == ["default", "longer"]
    clock.advance(seconds=50)
    assert broker.receive("orders", max_messages=5) == []


def test_expired_messages_are_dead_lettered_when_the_entity_says_so(broker, make_entity, clock):
    make_entity(
        default_message_time_to_live=timedelta(minutes=1), dead_lettering_on_message_expiration=True
    )
    broker.send("orders", [msg("old")], timeout=5)
    clock.advance(minutes=2)
    assert broker.receive("orders") == []
    (dead,) = broker.receive("orders", sub_queue="dead_letter")
    assert dead.message_id == "old"
    assert dead.dead_letter_reason == "TTLExpiredException"


def test_a_locked_message_does_not_expire_until_its_lock_is_gone(broker, make_entity, clock):
    make_entity()
    broker.send("orders", [msg("m", timedelta(seconds=30))], timeout=5)
    (m,) = broker.receive("orders", mode="peek_lock", lock_duration=timedelta(seconds=60))
    clock.advance(seconds=40)
    broker.complete("orders", m.lock_token)  # still held: settles normally
    assert broker.peek("orders") == []


def test_scheduled_messages_expire_from_their_scheduled_time(broker, make_entity, clock):
    make_entity()
    broker.schedule(
        "orders", [msg("s", timedelta(seconds=30))], clock.now + timedelta(minutes=5), timeout=5
    )
    clock.advance(minutes=5, seconds=10)
    assert [m.message_id for m in broker.receive("orders")] == ["s"]


def test_a_bad_default_ttl_names_the_field():
    with pytest.raises(ConfigurationError) as err:
        EntityProfile("q", default_message_time_to_live=timedelta(0))
    assert err.value.field == "default_message_time_to_live"
    with pytest.raises(ConfigurationError) as err:
        EntityProfile("q", dead_lettering_on_message_expiration=1)  # type: ignore[arg-type]
    assert err.value.field == "dead_lettering_on_message_expiration"
