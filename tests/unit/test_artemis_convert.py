"""The Artemis backend's own encoding of a plain message (``artemis._convert``) is the very
bytes proton writes for it, whatever the lengths (str8/str32, list8/list32 boundaries) and
characters; anything else still goes through proton."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("proton")

from proton import Message as ProtonMessage

from sendonce import Message
from sendonce.backends.artemis._convert import _plain, encode
from sendonce.errors import ValidationError


def _proton_bytes(message: Message) -> bytes:
    props = dict(message.application_properties or {})
    props["_AMQ_DUPL_ID"] = message.message_id
    body = message.body
    return bytes(
        ProtonMessage(
            body=body,
            inferred=isinstance(body, bytes),
            id=message.message_id,
            durable=True,
            properties=props,
        ).encode()
    )


LENGTHS = [1, 2, 120, 126, 127, 128, 250, 251, 252, 253, 254, 255, 256, 257, 1000, 70_000]


@pytest.mark.parametrize("n", LENGTHS)
def test_a_plain_message_is_encoded_as_proton_encodes_it(n: int) -> None:
    ids = ["i", "x" * min(n, 128), "ü" * min(n, 64)]
    props_choices = [
        None,
        {"a": "v" * n},
        {"k": "z", "k2": "é" * n},
    ]
    checked = 0
    for body in ("b" * n, b"y" * n, "é" * n):
        for message_id in ids:
            for props in [*props_choices, {"_AMQ_DUPL_ID": message_id, "k": "z"}]:
                message = Message(body, message_id=message_id, application_properties=props)
                fast = _plain(message)
                assert fast is not None
                assert fast == _proton_bytes(message)
                assert encode(message) == fast
                decoded = ProtonMessage()
                decoded.decode(fast)
                assert decoded.id == message_id and decoded.durable
                assert decoded.properties["_AMQ_DUPL_ID"] == message_id
                assert decoded.body == body
                checked += 1
    assert checked == 36


def test_anything_else_goes_through_proton() -> None:
    for message in (
        Message("b", message_id="m", session_id="g"),
        Message("b", message_id="m", subject="s"),
        Message("b", message_id="m", time_to_live=timedelta(seconds=5)),
        Message("b", message_id="m", application_properties={"n": 1}),
    ):
        assert _plain(message) is None
        decoded = ProtonMessage()
        decoded.decode(encode(message))
        assert decoded.id == "m" and decoded.properties["_AMQ_DUPL_ID"] == "m"


def test_a_different_duplicate_id_property_is_refused_naming_the_field() -> None:
    message = Message("b", message_id="m", application_properties={"_AMQ_DUPL_ID": "other"})
    assert _plain(message) is None
    with pytest.raises(ValidationError) as raised:
        encode(message)
    assert raised.value.field == "application_properties"
