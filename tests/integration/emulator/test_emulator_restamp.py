"""The broker's restamp on delivery keeps the sender's bytes.

Only the broker-owned annotations and the header's delivery count are rewritten,
on the encoded bytes: every properties field, header field, sender annotation
(with its exact AMQP type) and body section comes back as sent, sync and aio.
(Random messages: test_emulator_amqp_fidelity.py.)
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType

from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator, _codec

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

BROKER_KEYS = {
    b"x-opt-sequence-number",
    b"x-opt-enqueued-time",
    b"x-opt-locked-until",
    b"x-opt-lock-token",
}


def client(emu: Emulator) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(emu.connection_string, retry_total=0)


def _text(value: Any) -> Any:
    """The client reads strings back as bytes in some places: compare on one footing."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, datetime):  # sent as an AMQP timestamp, read back as ms
        return int(value.timestamp() * 1000)
    if isinstance(value, dict):
        return {_text(k): _text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_text(v) for v in value]
    return value


def _body(message: AmqpAnnotatedMessage | ServiceBusReceivedMessage) -> Any:
    amqp = message if isinstance(message, AmqpAnnotatedMessage) else message.raw_amqp_message
    if amqp.body_type == AmqpMessageBodyType.DATA:
        return [bytes(chunk) for chunk in amqp.body]
    if amqp.body_type == AmqpMessageBodyType.SEQUENCE:
        return [list(section) for section in amqp.body]
    return amqp.body


def _view(message: AmqpAnnotatedMessage) -> dict[str, Any]:
    """Everything an application can read off a message, broker-owned annotations left out."""
    props = message.properties
    header = message.header
    ttl_set = header is not None and header.time_to_live
    # With a TTL the client stamps creation and expiry times itself at send time.
    stamped_by_client = ("absolute_expiry_time", "creation_time") if ttl_set else ()
    annotations = {
        k: v for k, v in (message.annotations or {}).items() if _text(k) not in BROKER_KEYS
    }
    return _text(
        {
            "body_type": str(message.body_type),
            "body": _body(message),
            "application_properties": dict(message.application_properties or {}),
            "annotations": annotations,
            "delivery_annotations": dict(message.delivery_annotations or {}),
            "properties": None
            if props is None
            else {
                name: getattr(props, name)
                for name in (
                    "message_id",
                    "user_id",
                    "to",
                    "subject",
                    "reply_to",
                    "correlation_id",
                    "content_type",
                    "content_encoding",
                    "absolute_expiry_time",
                    "creation_time",
                    "group_id",
                    "group_sequence",
                    "reply_to_group_id",
                )
                if name not in stamped_by_client
            },
            # The broker always sends a header (it carries the delivery count).
            "header": {
                n: None if header is None else getattr(header, n)
                for n in ("durable", "priority", "time_to_live")
            },
        }
    )


def _roundtrip(sb: ServiceBusClient, sent: list[AmqpAnnotatedMessage]) -> list[Any]:
    with sb.get_queue_sender("orders", keep_alive=None) as sender:
        for message in sent:
            sender.send_messages(message)
    got: list[ServiceBusReceivedMessage] = []
    with sb.get_queue_receiver(
        "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        while len(got) < len(sent):
            batch = receiver.receive_messages(max_message_count=len(sent), max_wait_time=5)
            if not batch:
                break
            got.extend(batch)
    return [_view(m.raw_amqp_message) for m in got]


def rich_messages() -> list[AmqpAnnotatedMessage]:
    stamp = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    app = {
        "str": "text",
        "int": 7,
        "neg": -3,
        "float": 2.5,
        "bool": True,
        "bytes": b"ascii",  # the client decodes binary properties as UTF-8 text
        "uuid": uuid.UUID(int=5),
        "when": stamp,
        "none": None,
    }
    return [
        AmqpAnnotatedMessage(
            value_body={b"binary-key": [1, 2.5, b"x"], "k": {"nested": True}},
            application_properties=app,
            properties={"message_id": "value-1"},
        ),
        AmqpAnnotatedMessage(
            sequence_body=[[1, "two"], [b"three"]], properties={"message_id": "seq-1"}
        ),
        AmqpAnnotatedMessage(
            data_body=[b"first", b"second", b""],
            annotations={"x-opt-custom": "kept", b"x-opt-binary": 12},
            delivery_annotations={"x-opt-da": 3},
            header={"priority": 7, "durable": True, "time_to_live": 60_000},
            properties={
                "message_id": "data-1",
                "user_id": b"user",
                "to": "somewhere",
                "subject": "subj",
                "reply_to": "back",
                "correlation_id": "corr",
                "content_type": "application/x",
                "content_encoding": "gzip",
                "absolute_expiry_time": 1_900_000_000_000,
                "creation_time": 1_800_000_000_000,
                "group_sequence": 4,
                "reply_to_group_id": "rg",
            },
        ),
        AmqpAnnotatedMessage(value_body="plain string", properties={"message_id": 42}),
        AmqpAnnotatedMessage(value_body=None, properties={"message_id": uuid.UUID(int=9)}),
    ]


def test_every_body_kind_and_property_type_round_trips(emulator: Emulator) -> None:
    sent = rich_messages()
    with client(emulator) as sb:
        got = _roundtrip(sb, sent)
    # The sender's delivery annotations were for the hop to the broker (AMQP 1.0, 3.2.2).
    assert got == [{**_view(m), **_text({"delivery_annotations": {}})} for m in sent]


def test_local_receive_gets_the_senders_bytes(emulator: Emulator, store: LocalBackend) -> None:
    sent = rich_messages()
    with client(emulator) as sb, sb.get_queue_sender("orders", keep_alive=None) as sender:
        for message in sent:
            sender.send_messages(message)
    received = store.receive("orders", max_messages=len(sent))
    assert [r.message_id for r in received][:3] == ["value-1", "seq-1", "data-1"]
    for r in received:
        assert r.raw is not None
        sections = [s.code for s in _codec.split_sections(r.raw)]
        assert _codec.DELIVERY_ANNOTATIONS not in sections  # dropped on arrival
        # Restamped as a delivery would be: every client section stays byte-exact.
        stamped = _codec.restamp(r.raw, sequence_number=r.sequence_number, enqueued_time=None)
        kept = {
            bytes(stamped[s.start : s.end])
            for s in _codec.split_sections(stamped)
            if s.code not in (_codec.ANNOTATIONS, _codec.HEADER)
        }
        assert kept == {
            bytes(r.raw[s.start : s.end])
            for s in _codec.split_sections(r.raw)
            if s.code not in (_codec.ANNOTATIONS, _codec.HEADER)
        }


def test_restamp_keeps_the_senders_annotation_bytes() -> None:
    raw = bytes(
        b"\x00\x53\x72"
        + _codec._compound(
            0xD1,
            [
                b"\xa3\x04x-ab",
                b"\x55\x05",
                _codec._symbol("x-opt-sequence-number"),
                b"\x81" + bytes(8),
            ],
        )
        + b"\x00\x53\x75\xa0\x01z"
    )
    stamped = _codec.restamp(raw, sequence_number=3, enqueued_time=None, delivery_count=2)
    assert b"\xa3\x04x-ab\x55\x05" in stamped  # smalllong 5 kept as smalllong
    assert _codec._decode(stamped, _codec.split_sections(stamped)[1]) == {
        "x-ab": 5,
        "x-opt-sequence-number": 3,
    }
    assert stamped.endswith(b"\x00\x53\x75\xa0\x01z")


def test_the_asyncio_client_round_trips_value_and_sequence_bodies(emulator: Emulator) -> None:
    import asyncio

    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    async def run() -> list[Any]:
        sent = rich_messages()[:2]
        async with AsyncClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as sb:
            async with sb.get_queue_sender("orders", keep_alive=None) as sender:
                await sender.send_messages(sent)
            async with sb.get_queue_receiver(
                "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            ) as receiver:
                got = await receiver.receive_messages(max_message_count=2, max_wait_time=5)
        return [[_view(m.raw_amqp_message) for m in got], [_view(m) for m in sent]]

    got, expected = asyncio.run(run())
    assert got == expected
