"""AMQP message fidelity: every body kind, property type and section survives the emulator.

Messages are built with the client's public ``AmqpAnnotatedMessage`` and sent
and received by the unmodified client over a real socket. What comes back is
compared with the client's own decoding of the bytes it sent: equal except for
the sections the broker owns (the header's delivery count and the
``x-opt-`` message annotations Service Bus stamps) and the sender's delivery
annotations, which are for one hop only (AMQP 1.0, section 3.2.2) and never
reach a receiver.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from property_budget import examples as drawn
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator, _codec

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

_BROKER_KEYS = (b"x-opt-sequence-number", b"x-opt-enqueued-time", b"x-opt-locked-until")


def encoded(message: AmqpAnnotatedMessage) -> bytes:
    """The bytes the client puts on the wire for one message."""
    out = bytearray()
    encode_payload(out, PyamqpTransport.to_outgoing_amqp_message(message))
    return bytes(out)


def bare(raw: bytes) -> bytes:
    """Encoded bytes without the delivery-annotations section (0x71)."""
    return b"".join(
        raw[s.start : s.end]
        for s in _codec.split_sections(raw)
        if s.code != _codec.DELIVERY_ANNOTATIONS
    )


def comparable(message: Any) -> Any:
    """A decoded message without what the broker owns (delivery count, x-opt- stamps)."""
    header = message.header
    if header is not None:
        header = header._replace(delivery_count=None)
        if all(v is None for v in header):
            header = None
    annotations = {
        k: v for k, v in (message.message_annotations or {}).items() if k not in _BROKER_KEYS
    }
    return message._replace(header=header, message_annotations=annotations or None)


def expected(message: AmqpAnnotatedMessage) -> Any:
    # Delivery annotations stop at the broker: the receiver gets none of the sender's.
    return comparable(decode_payload(memoryview(encoded(message))))._replace(
        delivery_annotations=None
    )


def received(message: ServiceBusReceivedMessage) -> Any:
    # The client's decoded message: every section as it came off the wire.
    return comparable(message._message)


def send_and_receive(sb: ServiceBusClient, messages: list[AmqpAnnotatedMessage]) -> list[Any]:
    with sb.get_queue_sender("orders", keep_alive=None) as sender:
        for m in messages:
            sender.send_messages(m, timeout=10)
    got: list[ServiceBusReceivedMessage] = []
    with sb.get_queue_receiver(
        "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        while len(got) < len(messages):
            batch = receiver.receive_messages(max_message_count=len(messages), max_wait_time=5)
            if not batch:
                break
            got.extend(batch)
    return got


def client(emu: Emulator) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(emu.connection_string, retry_total=0)


def examples() -> list[AmqpAnnotatedMessage]:
    props = {
        "s": "text",
        "i": -7,
        "f": 0.25,
        "b": True,
        "n": None,
        "u": uuid.UUID(int=42),
    }
    return [
        AmqpAnnotatedMessage(
            value_body={"a": 1, b"k": [1, 2.5, None, b"\x01"], "nested": {"x": [True]}},
            properties={"message_id": "value-1", "subject": "s", "reply_to": "r", "to": "t"},
            application_properties=props,
            annotations={"custom": 7, "label": "x"},
            delivery_annotations={"hop": "one"},
        ),
        AmqpAnnotatedMessage(value_body="just a string", properties={"message_id": "value-2"}),
        AmqpAnnotatedMessage(value_body=12345, properties={"message_id": "value-3"}),
        AmqpAnnotatedMessage(
            sequence_body=[[1, "two"], [b"3", None]],
            properties={"message_id": "seq-1", "content_type": "x/y", "correlation_id": "c"},
        ),
        AmqpAnnotatedMessage(
            data_body=[b"one", b"two", b""],
            properties={"message_id": "data-1"},
            header={"priority": 7, "durable": True, "first_acquirer": True},
            footer={"f": "oot"},
        ),
    ]


def test_every_body_kind_and_property_type_round_trips(emulator: Emulator) -> None:
    sent = examples()
    with client(emulator) as sb:
        got = send_and_receive(sb, sent)
    assert [received(g) for g in got] == [expected(m) for m in sent]
    kinds = [g.raw_amqp_message.body_type for g in got]
    assert kinds == [AmqpMessageBodyType.VALUE] * 3 + [
        AmqpMessageBodyType.SEQUENCE,
        AmqpMessageBodyType.DATA,
    ]
    first = got[0].raw_amqp_message
    assert first.body == {b"a": 1, b"k": [1, 2.5, None, b"\x01"], b"nested": {b"x": [True]}}
    assert first.application_properties is not None
    assert first.application_properties[b"u"] == uuid.UUID(int=42)
    assert first.annotations is not None and first.annotations[b"custom"] == 7
    assert not first.delivery_annotations  # the sender's {"hop": "one"} was for one hop
    assert list(got[3].raw_amqp_message.body) == [[1, b"two"], [b"3", None]]
    assert list(got[4].raw_amqp_message.body) == [b"one", b"two", b""]
    assert got[4].raw_amqp_message.header.priority == 7


def test_the_broker_file_keeps_the_bytes_the_client_sent(
    emulator: Emulator, store: LocalBackend
) -> None:
    sent = examples()
    with client(emulator) as sb, sb.get_queue_sender("orders", keep_alive=None) as sender:
        for m in sent:
            sender.send_messages(m, timeout=10)
    got = store.receive("orders", max_messages=10)
    # Byte for byte, but for the sender's delivery annotations (for the hop to the broker).
    assert [g.raw for g in got] == [bare(encoded(m)) for m in sent]
    assert bare(encoded(sent[0])) != encoded(sent[0])  # it had some
    assert [g.message_id for g in got] == ["value-1", "value-2", "value-3", "seq-1", "data-1"]
    assert got[1].body == b"just a string"


def test_the_asyncio_client_round_trips_a_value_body(emulator: Emulator) -> None:
    import asyncio

    sent = examples()[0]

    async def roundtrip() -> Any:
        async with AsyncServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as sb:
            async with sb.get_queue_sender("orders") as sender:
                await sender.send_messages(sent, timeout=10)
            async with sb.get_queue_receiver(
                "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            ) as receiver:
                (got,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                return received(got)

    assert asyncio.run(roundtrip()) == expected(sent)


# -- property test: random AMQP messages --------------------------------------------------

# The client encodes a Python int as an AMQP int (32 bits): larger ones it cannot send.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.uuids(),
)
# The client turns bytes application properties into str (utf-8): none are drawn.
_app_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.uuids(),
)
_keys = st.text(min_size=1, max_size=10)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=12,
)
_texts = st.text(min_size=1, max_size=30)
# Annotation keys are AMQP symbols: ASCII only (the client encodes any str unchecked).
_symbols = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=10
).filter(lambda k: not k.startswith("x-opt-"))


@st.composite
def amqp_messages(draw: st.DrawFn) -> AmqpAnnotatedMessage:
    kind = draw(st.sampled_from(["value", "sequence", "data"]))
    body: dict[str, Any]
    if kind == "value":
        body = {"value_body": draw(_values)}
    elif kind == "sequence":
        body = {
            "sequence_body": draw(st.lists(st.lists(_values, max_size=3), min_size=1, max_size=3))
        }
    else:
        body = {"data_body": draw(st.lists(st.binary(max_size=50), min_size=1, max_size=3))}
    properties: dict[str, Any] = {"message_id": str(uuid.uuid4())}
    for name in ("subject", "correlation_id", "reply_to", "to"):
        if draw(st.booleans()):
            properties[name] = draw(_texts)
    if draw(st.booleans()):
        properties["content_type"] = draw(_symbols)  # a symbol too
    header: dict[str, Any] = {}
    if draw(st.booleans()):
        header["priority"] = draw(st.integers(0, 9))
    if draw(st.booleans()):
        header["durable"] = draw(st.booleans())
    return AmqpAnnotatedMessage(
        **body,
        properties=properties,
        header=header or None,
        application_properties=draw(st.dictionaries(_keys, _app_scalars, max_size=5)) or None,
        annotations=draw(st.dictionaries(_symbols, _scalars, max_size=3)) or None,
    )


@pytest.fixture
def links(emulator: Emulator) -> Iterator[tuple[Any, Any]]:
    """One sender and one receiver kept open across the examples (opening links is slow)."""
    with (
        client(emulator) as sb,
        sb.get_queue_sender("orders", keep_alive=None) as sender,
        sb.get_queue_receiver(
            "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver,
    ):
        yield sender, receiver


@settings(
    max_examples=drawn(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(messages=st.lists(amqp_messages(), min_size=1, max_size=3))
def test_random_amqp_messages_come_back_equal(
    links: tuple[Any, Any], messages: list[AmqpAnnotatedMessage]
) -> None:
    sender, receiver = links
    sender.send_messages(messages, timeout=10)
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < len(messages):
        batch = receiver.receive_messages(max_message_count=len(messages), max_wait_time=5)
        if not batch:
            break
        got.extend(batch)
    assert [received(g) for g in got] == [expected(m) for m in messages]
