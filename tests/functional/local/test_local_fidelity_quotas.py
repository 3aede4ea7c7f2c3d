"""Service Bus's message property quotas (32 KB per property, 64 KB for all) on the local
broker: refused before anything is sent by a sender, and refused by the broker itself for
whoever writes to it directly, with nothing stored."""

from __future__ import annotations

import pytest

from sendonce import (
    EntityProfile,
    IdempotentSender,
    Message,
    MessageSizeError,
    PermanentSendError,
)
from sendonce._message import MessageFactory
from sendonce._message_columns import MessageColumns

BIG = "x" * 40 * 1024


def big_property(message_id: str = "big") -> Message:
    return Message(b"small body", message_id=message_id, application_properties={"trace": BIG})


@pytest.mark.parametrize("count", [3, 100])  # 100: the planner's fast path for many messages
def test_a_sender_refuses_a_batch_with_an_oversized_property_and_sends_nothing(
    broker, make_entity, count
):
    make_entity()
    good = [Message(b"ok", message_id=f"ok-{i}") for i in range(count)]
    with IdempotentSender(broker, "orders") as sender, pytest.raises(MessageSizeError) as refused:
        sender.send_many([*good, big_property(), *good[:1]])
    assert refused.value.field == "application_properties"
    assert "'trace'" in str(refused.value)
    assert f"messages[{count}]" in str(refused.value)
    assert "nothing" in str(refused.value)
    assert broker.count("orders") == 0


def test_a_sender_refuses_one_oversized_property_and_sends_nothing(broker, make_entity):
    make_entity()
    with IdempotentSender(broker, "orders") as sender, pytest.raises(MessageSizeError) as refused:
        sender.send(big_property())
    assert refused.value.field == "application_properties"
    assert broker.count("orders") == 0


def test_columns_with_an_oversized_shared_property_are_refused(broker, make_entity):
    make_entity()
    factory = MessageFactory(application_properties={"trace": BIG})
    columns = MessageColumns.of(factory, [b"a", b"b"], ["c-1", "c-2"])
    assert columns is not None
    with IdempotentSender(broker, "orders") as sender, pytest.raises(MessageSizeError):
        sender.send_many(columns)
    assert broker.count("orders") == 0


def test_the_broker_refuses_an_oversized_property_sent_to_it_directly(broker, make_entity):
    make_entity()
    with pytest.raises(PermanentSendError, match="'trace'") as refused:
        broker.send("orders", [Message(b"ok", message_id="ok"), big_property()], timeout=5)
    assert refused.value.condition == "amqp:link:message-size-exceeded"
    assert broker.count("orders") == 0
    assert broker.message_ids("orders") == []  # not remembered either: a resend may succeed


def test_the_broker_refuses_properties_over_64_kb_together(broker, make_entity):
    make_entity()
    props = {f"p{i}": "v" * 30_000 for i in range(3)}
    with pytest.raises(PermanentSendError, match="together"):
        broker.send(
            "orders", [Message(b"", message_id="m", application_properties=props)], timeout=5
        )
    assert broker.count("orders") == 0


def test_a_large_body_with_small_properties_is_accepted(broker, make_entity):
    make_entity()
    message = Message(b"x" * 200_000, message_id="m", application_properties={"k": "v"})
    with IdempotentSender(broker, "orders") as sender:
        assert sender.send(message).outcome == "sent"
    assert broker.count("orders") == 1


def test_an_artemis_style_entity_takes_large_properties(broker):
    broker.create_entity(EntityProfile("artemis", id_cache_size=100))
    with IdempotentSender(broker, "artemis") as sender:
        assert sender.send(big_property()).outcome == "sent"
