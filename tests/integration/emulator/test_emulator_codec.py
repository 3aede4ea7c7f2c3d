"""The emulator's byte-level handling of messages, on bytes the real client encodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._pyamqp import utils as pyamqp_utils
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._pyamqp.message import BatchMessage
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from proton import Message as ProtonMessage

from sendonce.emulator import _codec


def encoded(message: ServiceBusMessage) -> bytes:
    """The bytes the client puts on the wire for one message."""
    out = bytearray()
    encode_payload(out, PyamqpTransport.to_outgoing_amqp_message(message.raw_amqp_message))
    return bytes(out)


def encoded_batch(*messages: ServiceBusMessage) -> bytes:
    batch: Any = PyamqpTransport.build_batch_message([])
    for m in messages:
        outgoing = PyamqpTransport.to_outgoing_amqp_message(m.raw_amqp_message)
        pyamqp_utils.add_batch(batch, outgoing)  # type: ignore[no-untyped-call]
    pyamqp_utils.set_message_properties(batch, [messages[0].message_id])
    out = bytearray()
    encode_payload(out, BatchMessage(*batch))
    return bytes(out)


def test_fields_the_store_needs_are_read() -> None:
    at = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    sb = ServiceBusMessage(
        b"payload",
        message_id="m-1",
        session_id="s-1",
        subject="subj",
        content_type="text/plain",
        correlation_id="c-1",
        application_properties={"k": "v", "n": 7},
        time_to_live=timedelta(seconds=90),
        scheduled_enqueue_time_utc=at,
    )
    decoded = _codec.to_message(encoded(sb))
    m = decoded.message
    assert decoded.has_message_id
    assert (m.message_id, m.session_id, m.partition_key) == ("m-1", "s-1", None)
    assert (m.subject, m.content_type, m.correlation_id) == ("subj", "text/plain", "c-1")
    assert m.body == b"payload"
    assert dict(m.application_properties or {}) == {"k": "v", "n": 7}
    assert m.time_to_live == timedelta(seconds=90)
    assert m.scheduled_enqueue_time == at


def test_a_message_without_id_gets_a_random_one() -> None:
    raw = bytes(ProtonMessage(body="x").encode())
    first, second = _codec.to_message(raw), _codec.to_message(raw)
    assert not first.has_message_id
    assert first.message.message_id != second.message.message_id


def test_batches_are_split_into_the_inner_messages() -> None:
    one = ServiceBusMessage(b"1", message_id="b-1")
    two = ServiceBusMessage("2", message_id="b-2", partition_key="p")
    wrapper = encoded_batch(one, two)
    assert _codec.is_batch(wrapper)
    inner = _codec.unbatch(wrapper)
    assert inner == [encoded(one), encoded(two)]
    assert [_codec.to_message(raw).message.message_id for raw in inner] == ["b-1", "b-2"]


def test_a_single_message_is_not_a_batch() -> None:
    single = encoded(ServiceBusMessage(b"just one", message_id="s"))
    assert not _codec.is_batch(single)
    assert _codec.unbatch(single) == [single]


def test_restamp_keeps_every_other_section_byte_for_byte() -> None:
    raw = encoded(
        ServiceBusMessage(b"body", message_id="r-1", application_properties={"a": 1}, subject="x")
    )
    enqueued = datetime(2030, 1, 1, tzinfo=UTC)
    out = _codec.restamp(
        raw,
        sequence_number=42,
        enqueued_time=enqueued,
        locked_until=enqueued + timedelta(minutes=1),
        delivery_count=2,
    )
    kept = {s.code: raw[s.start : s.end] for s in _codec.split_sections(raw)}
    restamped = {s.code: out[s.start : s.end] for s in _codec.split_sections(out)}
    for code in (_codec.PROPERTIES, _codec.APPLICATION_PROPERTIES, _codec.DATA):
        assert restamped[code] == kept[code]
    decoded: Any = decode_payload(memoryview(out))
    assert decoded.message_annotations[b"x-opt-sequence-number"] == 42
    assert decoded.message_annotations[b"x-opt-enqueued-time"] == int(enqueued.timestamp() * 1000)
    assert decoded.header.delivery_count == 2


def test_messages_stored_without_raw_bytes_are_encoded_for_the_client() -> None:
    raw = _codec.encode_fields(
        message_id="l-1", body=b"local", subject="s", application_properties={"p": 1}
    )
    decoded: Any = decode_payload(
        memoryview(_codec.restamp(raw, sequence_number=1, enqueued_time=None))
    )
    assert decoded.properties.message_id == b"l-1"
    assert list(decoded.data) == [b"local"]
    assert decoded.application_properties == {b"p": 1}


@pytest.mark.parametrize("junk", [b"\x01\x02", b"\x00\x53\x75\xb0\xff\xff\xff\xff", b"\x00\x53"])
def test_malformed_bytes_raise_codec_error(junk: bytes) -> None:
    with pytest.raises((_codec.CodecError, IndexError)):
        _codec.unbatch(junk)
