"""Message <-> ServiceBusMessage: every property survives, the id is always ours."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from hypothesis import given, settings
from hypothesis import strategies as st

from property_budget import examples
from sendonce import Message
from sendonce.backends.servicebus._convert import from_servicebus_message, to_servicebus_message
from sendonce.errors import MessageIdError, ValidationError

FULL = Message(
    "héllo wörld",
    message_id="order-42.2026/payment",
    partition_key="customer-7",
    session_id="customer-7",
    scheduled_enqueue_time=datetime(2030, 5, 17, 8, 30, tzinfo=UTC),
    subject="payment",
    content_type="application/json",
    correlation_id="corr-1",
    application_properties={"tenant": "acme", "n": 3, "ratio": 0.5, "flag": True, "raw": b"\x00"},
    time_to_live=timedelta(minutes=90),
)


def test_every_property_is_carried_over() -> None:
    sb = to_servicebus_message(FULL)
    assert sb.message_id == "order-42.2026/payment"
    assert b"".join(sb.body) == "héllo wörld".encode()
    assert sb.partition_key == "customer-7"
    assert sb.session_id == "customer-7"
    assert sb.subject == "payment"
    assert sb.content_type == "application/json"
    assert sb.correlation_id == "corr-1"
    assert sb.application_properties == dict(FULL.application_properties or {})
    assert sb.time_to_live == timedelta(minutes=90)
    assert sb.scheduled_enqueue_time_utc == datetime(2030, 5, 17, 8, 30, tzinfo=UTC)


def test_the_round_trip_preserves_every_property() -> None:
    back = from_servicebus_message(to_servicebus_message(FULL))
    assert back.body == FULL.body_bytes  # str bodies travel as UTF-8 bytes
    for name in (
        "message_id",
        "partition_key",
        "session_id",
        "subject",
        "content_type",
        "correlation_id",
        "application_properties",
        "time_to_live",
        "scheduled_enqueue_time",
    ):
        assert getattr(back, name) == getattr(FULL, name), name


def test_a_minimal_message_sets_nothing_else() -> None:
    sb = to_servicebus_message(Message(b"\x00\x01", message_id="m"))
    assert sb.message_id == "m"
    assert sb.partition_key is None and sb.session_id is None
    assert sb.application_properties is None
    assert sb.time_to_live is None
    assert sb.scheduled_enqueue_time_utc is None
    back = from_servicebus_message(sb)
    assert back == Message(b"\x00\x01", message_id="m")


def test_a_scheduled_time_in_another_zone_is_the_same_instant() -> None:
    when = datetime(2030, 1, 1, 10, tzinfo=timezone(timedelta(hours=2)))
    sb = to_servicebus_message(Message("x", message_id="m", scheduled_enqueue_time=when))
    assert sb.scheduled_enqueue_time_utc == when


def test_the_message_put_on_the_wire_keeps_our_id() -> None:
    # What the client encodes into a batch (the AMQP properties section), not just the wrapper.
    sb = to_servicebus_message(FULL)
    batch = ServiceBusMessageBatch(max_size_in_bytes=64 * 1024, amqp_transport=PyamqpTransport)
    batch.add_message(sb)
    (outgoing,) = batch._messages
    assert outgoing._message.properties.message_id in (
        b"order-42.2026/payment",
        "order-42.2026/payment",
    )


def test_the_clients_random_id_never_gets_through(mocker: Any) -> None:
    # If the client ever ignored the id we pass, conversion refuses rather than send a UUID.
    import sendonce.backends.servicebus._convert as convert

    real = convert.ServiceBusMessage

    def careless(body: Any, **kwargs: Any) -> ServiceBusMessage:
        kwargs["message_id"] = None
        return real(body, **kwargs)

    mocker.patch.object(convert, "ServiceBusMessage", side_effect=careless)
    with pytest.raises(MessageIdError) as info:
        to_servicebus_message(Message("x", message_id="ours"))
    assert info.value.field == "message_id"
    assert "'ours'" in str(info.value)


def test_the_client_default_would_be_random_which_is_why_we_check() -> None:
    assert ServiceBusMessage("x").message_id  # a random UUID: never what we send


def test_only_messages_are_converted() -> None:
    with pytest.raises(ValidationError):
        to_servicebus_message({"body": "x"})  # type: ignore[arg-type]


def test_a_message_without_id_cannot_come_back() -> None:
    sb = ServiceBusMessage("x")
    sb.message_id = None
    sb._raw_amqp_message.properties.message_id = None
    with pytest.raises(MessageIdError):
        from_servicebus_message(sb)


keys = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"),
    min_size=1,
    max_size=128,
)
prop_values = st.one_of(
    st.text(max_size=20), st.integers(-(2**31), 2**31 - 1), st.booleans(), st.binary(max_size=8)
)


@settings(max_examples=examples(150), deadline=None)
@given(
    body=st.one_of(st.binary(max_size=200), st.text(max_size=200)),
    message_id=keys,
    key=st.one_of(st.none(), keys),
    use_session=st.booleans(),
    subject=st.one_of(st.none(), st.text(max_size=30)),
    props=st.one_of(st.none(), st.dictionaries(st.text(min_size=1, max_size=10), prop_values)),
    ttl_seconds=st.one_of(st.none(), st.integers(1, 10**6)),
)
def test_round_trip_property(
    body: bytes | str,
    message_id: str,
    key: str | None,
    use_session: bool,
    subject: str | None,
    props: dict[str, Any] | None,
    ttl_seconds: int | None,
) -> None:
    message = Message(
        body,
        message_id=message_id,
        partition_key=key,
        session_id=key if use_session else None,
        subject=subject,
        application_properties=props,
        time_to_live=None if ttl_seconds is None else timedelta(seconds=ttl_seconds),
    )
    sb = to_servicebus_message(message)
    assert sb.message_id == message_id
    back = from_servicebus_message(sb)
    assert back.body == message.body_bytes
    assert back.message_id == message.message_id
    assert back.partition_key == message.partition_key
    assert back.session_id == message.session_id
    assert back.subject == message.subject
    assert back.application_properties == message.application_properties
    assert back.time_to_live == message.time_to_live
