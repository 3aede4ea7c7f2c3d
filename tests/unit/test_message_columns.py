"""MessageColumns (the Spark tasks' bulk messages) reads exactly like a list of Message()."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sendonce import Message
from sendonce._message import MessageFactory
from sendonce._message_columns import MessageColumns

SHARED: dict[str, object] = {"subject": "orders", "content_type": "application/json"}


def expected(
    bodies: list[bytes], ids: list[str], pks: list[str] | None, sids: list[str] | None
) -> list[Message]:
    return [
        Message(
            body,
            message_id=mid,
            partition_key=None if pks is None else pks[i],
            session_id=None if sids is None else sids[i],
            **SHARED,  # type: ignore[arg-type]
        )
        for i, (body, mid) in enumerate(zip(bodies, ids, strict=True))
    ]


def test_columns_read_as_the_messages_message_builds() -> None:
    bodies = [b'{"n":%d}' % i for i in range(5)]
    ids = [f"order-{i}" for i in range(5)]
    columns = MessageColumns.of(MessageFactory(**SHARED), bodies, ids)  # type: ignore[arg-type]
    assert columns is not None
    messages = expected(bodies, ids, None, None)
    assert len(columns) == 5
    assert columns == messages
    assert list(columns) == messages
    assert columns[0] == messages[0] and columns[-1] == messages[-1]
    assert columns.sizes == [m.size for m in messages]
    assert columns.hashes == [m._body_hash for m in messages]
    with pytest.raises(IndexError):
        columns[5]
    part = columns[1:4]
    assert isinstance(part, MessageColumns)
    assert part == messages[1:4]
    assert part.sizes == [m.size for m in messages[1:4]]
    assert "5 messages" in repr(columns) and "order-0" in repr(columns)


def test_keys_count_in_the_size_and_reach_each_message() -> None:
    bodies, ids, keys = [b"a", b"b"], ["m-1", "m-2"], ["k-1", "k-2"]
    make = MessageFactory(**SHARED)  # type: ignore[arg-type]
    with_pk = MessageColumns.of(make, bodies, ids, keys, None)
    both = MessageColumns.of(make, bodies, ids, keys, keys)
    assert with_pk is not None and both is not None
    assert with_pk == expected(bodies, ids, keys, None)
    assert both == expected(bodies, ids, keys, keys)
    assert both.sizes == [m.size for m in expected(bodies, ids, keys, keys)]


@pytest.mark.parametrize(
    ("bodies", "ids", "pks", "sids"),
    [
        ([b"x"], [""], None, None),  # an empty id
        ([b"x"], ["x" * 129], None, None),  # over the id limit
        ([b"x"], ["a\x00b"], None, None),  # NUL
        ([b"x"], ["caf\u00e9"], None, None),  # not ASCII: Message() checks the encoding
        (["text"], ["id"], None, None),  # a str body
        ([bytearray(b"x")], ["id"], None, None),  # not exactly bytes
        ([b"x"], ["id"], ["p"], ["s"]),  # partition key != session id
        ([b"x"], ["id"], [""], None),  # an empty key
        ([b"x", b"y"], ["id"], None, None),  # columns of different lengths
        ([], [], None, None),  # nothing
    ],
)
def test_anything_message_must_check_is_left_to_message(
    bodies: list[object], ids: list[str], pks: list[str] | None, sids: list[str] | None
) -> None:
    assert MessageColumns.of(MessageFactory(), bodies, ids, pks, sids) is None


def test_columns_equal_other_sequences_and_are_not_hashable() -> None:
    columns = MessageColumns.of(MessageFactory(), [b"x"], ["id"])
    assert columns is not None
    assert columns == (Message(b"x", message_id="id"),)
    assert columns != [Message(b"y", message_id="id")]
    assert columns != "id"
    with pytest.raises(TypeError):
        hash(columns)


ascii_text = st.text(st.characters(min_codepoint=1, max_codepoint=127), min_size=1, max_size=130)


@given(st.lists(st.tuples(st.binary(max_size=40), ascii_text, st.none() | ascii_text), min_size=1))
def test_whenever_columns_are_built_they_equal_message(
    rows: list[tuple[bytes, str, str | None]],
) -> None:
    bodies = [r[0] for r in rows]
    ids = [r[1] for r in rows]
    keys = [r[2] for r in rows]
    pks = None if None in keys else [k for k in keys if k is not None]
    columns = MessageColumns.of(MessageFactory(**SHARED), bodies, ids, pks)  # type: ignore[arg-type]
    plain = all(len(i) <= 128 for i in ids) and (pks is None or all(len(k) <= 128 for k in pks))
    assert (columns is not None) == plain
    if columns is not None:
        messages = expected(bodies, ids, pks, None)
        assert columns == messages
        assert columns.sizes == [m.size for m in messages]
        assert columns.hashes == [m._body_hash for m in messages]
