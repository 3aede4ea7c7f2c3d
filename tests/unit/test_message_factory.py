"""MessageFactory (the Spark encoder's fast path) builds exactly what Message() builds."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sendonce import KeyRuleError, Message, MessageIdError, ValidationError
from sendonce._message import MessageFactory

SHARED = [
    {},
    {"subject": "orders", "content_type": "application/json"},
    {"application_properties": {"source": "spark", "n": 3, "flag": True}},
]


def same(a: Message, b: Message) -> None:
    assert a == b
    assert (a.size, a._body_hash, a.body_bytes) == (b.size, b._body_hash, b.body_bytes)
    assert repr(a) == repr(b)
    assert pickle.loads(pickle.dumps(a)) == b


@pytest.mark.parametrize("shared", SHARED)
@pytest.mark.parametrize(
    ("body", "message_id", "pk", "sid"),
    [
        (b'{"a":1}', "order-1", None, None),
        ("plain text", "order-2", "p-1", None),
        ("text", "order-3", "s-1", "s-1"),
        ("text", "order-4", None, "s-2"),
        ("caf\u00e9 \u2603", "order-5", None, None),  # non-ASCII body: the slow path
        (b"", "x" * 128, None, None),
        ("body", "ord\u00e9r-6", "cl\u00e9", None),  # non-ASCII id and key
    ],
)
def test_the_factory_builds_what_message_builds(
    shared: dict[str, object], body: bytes | str, message_id: str, pk: str | None, sid: str | None
) -> None:
    make = MessageFactory(**shared)  # type: ignore[arg-type]
    expected = Message(body, message_id=message_id, partition_key=pk, session_id=sid, **shared)  # type: ignore[arg-type]
    same(make(body, message_id, pk, sid), expected)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((b"x", ""), MessageIdError),
        ((b"x", "x" * 129), MessageIdError),
        ((b"x", "a\x00b"), MessageIdError),
        ((b"x", "a\ud800"), MessageIdError),
        ((b"x", "id", "k" * 129), KeyRuleError),
        ((b"x", "id", "p", "s"), KeyRuleError),
        ((b"x", "id", None, ""), KeyRuleError),
        (("\ud800", "id"), ValidationError),
        ((123, "id"), ValidationError),
    ],
)
def test_what_message_refuses_the_factory_refuses_the_same_way(
    args: tuple[object, ...], error: type[Exception]
) -> None:
    with pytest.raises(error) as by_message:
        Message(
            args[0],
            message_id=args[1],
            partition_key=args[2] if len(args) > 2 else None,  # type: ignore[arg-type]
            session_id=args[3] if len(args) > 3 else None,
        )  # type: ignore[arg-type]
    with pytest.raises(error) as by_factory:
        MessageFactory()(*args)  # type: ignore[arg-type]
    assert str(by_factory.value) == str(by_message.value)


def test_bad_shared_fields_are_refused_once_like_message_does() -> None:
    with pytest.raises(ValidationError, match="application propert"):
        MessageFactory(application_properties={"k": object()})  # type: ignore[dict-item]


@given(
    body=st.one_of(st.binary(max_size=50), st.text(max_size=50)),
    message_id=st.text(min_size=1, max_size=130),
    key=st.one_of(st.none(), st.text(max_size=130)),
)
def test_any_input_gives_an_equal_message_or_the_same_error(
    body: bytes | str, message_id: str, key: str | None
) -> None:
    try:
        expected = Message(body, message_id=message_id, partition_key=key)
    except ValidationError as exc:
        with pytest.raises(type(exc)):
            MessageFactory()(body, message_id, key)
        return
    same(MessageFactory()(body, message_id, key), expected)
