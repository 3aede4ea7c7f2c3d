"""Message (an immutable, validated value) and MessageSpec (record -> Message)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from sendonce import (
    KeyRuleError,
    Message,
    MessageIdError,
    MessageIdTemplate,
    MessageSpec,
    ValidationError,
)
from sendonce._message import canonical_json

WHEN = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def full_message() -> Message:
    return Message(
        "héllo",
        message_id="12345.2017/payment",
        partition_key="12345",
        session_id="12345",
        scheduled_enqueue_time=WHEN,
        subject="payment",
        content_type="text/plain",
        correlation_id="corr-1",
        application_properties={"n": 1, "f": 1.5, "b": True, "raw": b"\x00", "none": None},
        time_to_live=timedelta(hours=1),
    )


# ---------------------------------------------------------------- Message


def test_minimal_message_defaults() -> None:
    m = Message(b"x", message_id="m-1")
    assert m.body == b"x"
    assert m.message_id == "m-1"
    for name in (
        "partition_key",
        "session_id",
        "scheduled_enqueue_time",
        "subject",
        "content_type",
        "correlation_id",
        "application_properties",
        "time_to_live",
    ):
        assert getattr(m, name) is None


def test_options_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        Message(b"x", "m-1")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Message(b"x")  # type: ignore[call-arg]


def test_body_bytes_and_size() -> None:
    m = Message("é", message_id="id")
    assert m.body_bytes == "é".encode()
    assert m.size == 2 + 2
    plain = Message(b"x" * 100, message_id="m")
    bigger = Message(
        b"x" * 100,
        message_id="m",
        partition_key="pk",
        subject="subj",
        application_properties={"key": "value"},
    )
    assert plain.size == 101
    assert bigger.size == 101 + 2 + 4 + 3 + 5


def test_message_is_immutable() -> None:
    m = full_message()
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.message_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        m.application_properties["n"] = 2  # type: ignore[index]


def test_properties_are_copied_at_construction() -> None:
    props: dict[str, Any] = {"a": 1}
    m = Message(b"x", message_id="m", application_properties=props)
    props["a"] = 2
    props["b"] = 3
    assert dict(m.application_properties or {}) == {"a": 1}


def test_pickle_round_trip_keeps_every_field() -> None:
    m = full_message()
    copy = pickle.loads(pickle.dumps(m))
    assert copy == m
    assert hash(copy) == hash(m)
    for f in dataclasses.fields(Message):
        if f.name.startswith("_"):
            continue
        assert getattr(copy, f.name) == getattr(m, f.name), f.name
    assert copy.size == m.size
    with pytest.raises(TypeError):
        copy.application_properties["n"] = 3


def test_equality_and_hash() -> None:
    a = Message(b"x", message_id="m", partition_key="p")
    assert a == Message(b"x", message_id="m", partition_key="p")
    assert hash(a) == hash(Message(b"x", message_id="m", partition_key="p"))
    assert a != Message(b"y", message_id="m", partition_key="p")
    assert a != Message(b"x", message_id="m2", partition_key="p")
    assert a != Message(b"x", message_id="m", partition_key="q")
    assert len({a, Message(b"x", message_id="m", partition_key="p")}) == 1


@pytest.mark.parametrize("name", ["message_id", "partition_key", "session_id"])
def test_128_characters_is_the_limit(name: str) -> None:
    ok: dict[str, Any] = {"message_id": "m", name: "k" * 128}
    if name == "session_id":
        ok["partition_key"] = "k" * 128
    assert getattr(Message(b"x", **ok), name) == "k" * 128
    bad = {**ok, name: "k" * 129}
    if name == "session_id":
        bad.pop("partition_key")
    error = MessageIdError if name == "message_id" else KeyRuleError
    with pytest.raises(error) as ei:
        Message(b"x", **bad)
    assert ei.value.field == name
    assert name in str(ei.value)
    assert "129" in str(ei.value)


def test_partition_key_must_equal_session_id() -> None:
    Message(b"x", message_id="m", partition_key="s", session_id="s")
    Message(b"x", message_id="m", session_id="s")
    Message(b"x", message_id="m", partition_key="p")
    with pytest.raises(KeyRuleError) as ei:
        Message(b"x", message_id="m", partition_key="p", session_id="s")
    assert ei.value.field == "partition_key"
    assert "session_id" in str(ei.value)
    assert "'m'" in str(ei.value)  # names the message


def test_empty_id_is_refused_because_the_client_would_randomise_it() -> None:
    with pytest.raises(MessageIdError, match="random") as ei:
        Message(b"x", message_id="")
    assert ei.value.field == "message_id"


@pytest.mark.parametrize("key", ["partition_key", "session_id"])
def test_empty_keys_are_refused(key: str) -> None:
    kwargs: dict[str, Any] = {key: ""}
    with pytest.raises(KeyRuleError) as ei:
        Message(b"x", message_id="m", **kwargs)
    assert ei.value.field == key


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"body": 1}, "body"),
        ({"body": bytearray(b"x")}, "body"),
        ({"body": None}, "body"),
        ({"message_id": 1}, "message_id"),
        ({"message_id": None}, "message_id"),
        ({"partition_key": 1}, "partition_key"),
        ({"session_id": b"s"}, "session_id"),
        ({"subject": 1}, "subject"),
        ({"content_type": b"x"}, "content_type"),
        ({"correlation_id": 5}, "correlation_id"),
        ({"scheduled_enqueue_time": datetime(2030, 1, 1)}, "scheduled_enqueue_time"),
        ({"scheduled_enqueue_time": "2030-01-01T00:00:00Z"}, "scheduled_enqueue_time"),
        ({"time_to_live": timedelta(0)}, "time_to_live"),
        ({"time_to_live": timedelta(seconds=-1)}, "time_to_live"),
        ({"time_to_live": 60}, "time_to_live"),
        ({"application_properties": [("a", 1)]}, "application_properties"),
        ({"application_properties": {"a": [1]}}, "application_properties"),
        ({"application_properties": {1: "a"}}, "application_properties"),
        ({"application_properties": {"a": Decimal(1)}}, "application_properties"),
    ],
)
def test_bad_fields_raise_validation_error_naming_them(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"body": b"x", "message_id": "m", **kwargs}
    body = args.pop("body")
    with pytest.raises(ValidationError) as ei:
        Message(body, **args)
    assert ei.value.field == field
    assert field.split("_")[0] in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_valid_property_types() -> None:
    m = Message(
        b"x",
        message_id="m",
        application_properties={"s": "v", "i": 1, "f": 0.5, "b": False, "y": b"", "n": None},
    )
    assert m.application_properties is not None
    assert m.application_properties["f"] == 0.5


# ---------------------------------------------------------------- canonical JSON


def test_canonical_json_is_sorted_compact_utf8() -> None:
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    assert canonical_json({"a": "é", "b": 1}) == canonical_json({"b": 1, "a": "é"})


def test_canonical_json_encodes_id_types() -> None:
    record = {
        "d": Decimal("1.50"),
        "t": datetime(2017, 5, 1, 12, 0, tzinfo=UTC),
        "day": date(2017, 5, 1),
        "u": uuid.UUID(int=1),
        "raw": b"\x01\xff",
        "nested": {"z": 1, "y": [1, 2]},
    }
    decoded = json.loads(canonical_json(record))
    assert decoded == {
        "d": "1.50",
        "t": "2017-05-01T12:00:00+00:00",
        "day": "2017-05-01",
        "u": str(uuid.UUID(int=1)),
        "raw": "01ff",
        "nested": {"y": [1, 2], "z": 1},
    }


def test_canonical_json_of_spark_rows() -> None:
    from pyspark.sql import Row

    row = Row(b=1, a=Row(y="é", x=2))
    assert canonical_json(row) == '{"a":{"x":2,"y":"é"},"b":1}'.encode()
    assert canonical_json(row) == canonical_json({"b": 1, "a": {"y": "é", "x": 2}})


def test_canonical_json_of_numpy_scalars() -> None:
    np = pytest.importorskip("numpy")
    assert canonical_json({"n": np.int64(3), "f": np.float64(0.5)}) == b'{"f":0.5,"n":3}'


# ---------------------------------------------------------------- MessageSpec


def test_spec_builds_id_keys_and_json_body() -> None:
    spec = MessageSpec("{order_id}.{year}/payment", partition_key="{order_id}", subject="pay")
    m = spec.to_message({"order_id": 12345, "year": 2017, "amount": Decimal("9.90")})
    assert m.message_id == "12345.2017/payment"
    assert m.partition_key == "12345"
    assert m.session_id is None
    assert m.subject == "pay"
    assert m.content_type == "application/json"
    assert m.body == b'{"amount":"9.90","order_id":12345,"year":2017}'
    assert spec({"order_id": 12345, "year": 2017, "amount": Decimal("9.90")}) == m


def test_spec_accepts_template_objects() -> None:
    tpl = MessageIdTemplate("{k}", max_length=40, overflow="hash")
    spec = MessageSpec(tpl, partition_key=MessageIdTemplate("{p}"))
    assert spec.message_id is tpl
    m = spec.to_message({"k": "x" * 60, "p": "P"})
    assert len(m.message_id) == 40
    assert m.partition_key == "P"


def test_spec_body_from_a_field() -> None:
    spec = MessageSpec("{id}", body="payload")
    assert spec.to_message({"id": 1, "payload": "text"}).body == "text"
    assert spec.to_message({"id": 1, "payload": b"raw"}).body == b"raw"
    assert spec.to_message({"id": 1, "payload": bytearray(b"ba")}).body == b"ba"
    assert spec.to_message({"id": 1, "payload": memoryview(b"mv")}).body == b"mv"
    assert spec.content_type is None


def test_spec_body_from_a_callable() -> None:
    spec = MessageSpec("{id}", body=lambda r: f"order {r['id']}", content_type="text/plain")
    m = spec.to_message({"id": 7})
    assert m.body == "order 7"
    assert m.content_type == "text/plain"


def test_spec_session_id_becomes_partition_key() -> None:
    spec = MessageSpec("{id}", session_id="{customer}")
    m = spec.to_message({"id": 1, "customer": "c-9"})
    assert m.session_id == "c-9"
    assert m.partition_key == "c-9"
    same = MessageSpec("{id}", session_id="{customer}", partition_key="{customer}")
    assert same.to_message({"id": 1, "customer": "c-9"}) == m


def test_spec_mismatched_partition_key_and_session_id() -> None:
    spec = MessageSpec("{id}", session_id="{customer}", partition_key="{region}")
    assert spec.to_message({"id": 1, "customer": "c", "region": "c"}).partition_key == "c"
    with pytest.raises(KeyRuleError) as ei:
        spec.to_message({"id": 1, "customer": "c", "region": "eu"})
    assert ei.value.field == "partition_key"


def test_spec_fields_lists_everything_it_reads() -> None:
    spec = MessageSpec("{a}.{b}", partition_key="{c}.{a}", session_id="{c}.{a}", body="body")
    assert spec.fields == ["a", "b", "c", "body"]
    assert MessageSpec("{a}", body="a").fields == ["a"]
    assert MessageSpec("{a}").fields == ["a"]


def test_spec_properties_are_copied() -> None:
    props: dict[str, Any] = {"source": "batch"}
    spec = MessageSpec("{a}", application_properties=props)
    props["source"] = "changed"
    m = spec.to_message({"a": 1})
    assert dict(m.application_properties or {}) == {"source": "batch"}


def test_spec_with_spark_rows() -> None:
    from pyspark.sql import Row

    spec = MessageSpec("{order_id}.{year}/payment", partition_key="{order_id}")
    m = spec.to_message(Row(order_id=12345, year=2017))
    assert m.message_id == "12345.2017/payment"
    assert m.partition_key == "12345"
    assert m.body == b'{"order_id":12345,"year":2017}'
    with pytest.raises(ValidationError) as ei:
        MessageSpec("{order_id}", body="payload").to_message(Row(order_id=1))
    assert ei.value.field == "payload"


@pytest.mark.parametrize("option", ["message_id", "partition_key", "session_id"])
def test_spec_template_errors_name_the_option(option: str) -> None:
    kwargs: dict[str, Any] = {"message_id": "{a}"}
    kwargs[option] = "{a}{b}"
    message_id = kwargs.pop("message_id")
    with pytest.raises(MessageIdError) as ei:
        MessageSpec(message_id, **kwargs)
    assert ei.value.field == option
    assert option in str(ei.value)


@pytest.mark.parametrize("key", ["partition_key", "session_id"])
def test_spec_key_overflow_names_the_key(key: str) -> None:
    kwargs: dict[str, Any] = {key: "{b}"}
    spec = MessageSpec("{a}", **kwargs)
    with pytest.raises(KeyRuleError) as ei:
        spec.to_message({"a": "1", "b": "x" * 200})
    assert ei.value.field == key
    assert key in str(ei.value)


def test_spec_missing_record_fields_are_named() -> None:
    spec = MessageSpec("{a}", partition_key="{p}", body="payload")
    with pytest.raises(MessageIdError) as ei:
        spec.to_message({"p": 1, "payload": "x"})
    assert ei.value.field == "a"
    with pytest.raises(MessageIdError) as ei:
        spec.to_message({"a": 1, "payload": "x"})
    assert ei.value.field == "p"
    with pytest.raises(ValidationError) as vi:
        spec.to_message({"a": 1, "p": 1})
    assert vi.value.field == "payload"
    assert "payload" in str(vi.value)


@pytest.mark.parametrize(
    ("kwargs", "record", "field"),
    [
        ({"body": 5}, None, "body"),
        ({"body": ""}, None, "body"),
        ({"subject": 1}, None, "subject"),
        ({"content_type": b"x"}, None, "content_type"),
        ({"body": "payload"}, {"id": 1, "payload": 12}, "payload"),
        ({"body": lambda r: 12}, {"id": 1}, "body"),
        ({}, {"id": 1, "obj": object()}, "body"),
    ],
)
def test_spec_body_errors(kwargs: dict[str, Any], record: Any, field: str | None) -> None:
    if record is None:
        with pytest.raises(ValidationError) as ei:
            MessageSpec("{id}", **kwargs)
        assert ei.value.field == field
        return
    spec = MessageSpec("{id}", **kwargs)
    if field is None:
        spec.to_message(record)
        return
    with pytest.raises(ValidationError) as ei:
        spec.to_message(record)
    assert ei.value.field == field
    assert field in str(ei.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_spec_json_body_refuses_non_json_floats(value: float) -> None:
    with pytest.raises(ValidationError) as ei:
        MessageSpec("{id}").to_message({"id": 1, "f": value})
    assert ei.value.field == "body"


def _body_upper(record: Any) -> str:
    return str(record["text"]).upper()


def test_spec_pickle_round_trip() -> None:
    spec = MessageSpec(
        MessageIdTemplate("{id}.{text}", max_length=64, overflow="hash"),
        body=_body_upper,
        partition_key="{id}",
        subject="s",
        content_type="text/plain",
        application_properties={"k": "v"},
    )
    copy = pickle.loads(pickle.dumps(spec))
    record = {"id": 3, "text": "abc"}
    assert copy.to_message(record) == spec.to_message(record)
    assert copy.fields == spec.fields
    assert repr(copy) == repr(spec)
    json_spec = pickle.loads(pickle.dumps(MessageSpec("{id}")))
    assert json_spec.to_message(record).body == b'{"id":3,"text":"abc"}'


def test_spec_with_lambda_ships_through_cloudpickle() -> None:
    """Spark ships specs with cloudpickle, which handles closures and lambdas."""
    from pyspark import cloudpickle

    suffix = "!"
    spec = MessageSpec("{id}", body=lambda r: f"{r['id']}{suffix}")
    copy = cloudpickle.loads(cloudpickle.dumps(spec))  # type: ignore[no-untyped-call]
    assert copy.to_message({"id": 1}).body == "1!"


def test_spec_repr() -> None:
    spec = MessageSpec("{a}", partition_key="{b}", body="c")
    assert repr(spec) == "MessageSpec('{a}', body='c', partition_key='{b}', session_id=None)"


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"body": "\ud800"}, ValidationError, "body"),
        ({"message_id": "m\ud800"}, MessageIdError, "message_id"),
        ({"partition_key": "\udcff"}, KeyRuleError, "partition_key"),
    ],
    ids=["body", "message_id", "partition_key"],
)
def test_unencodable_text_is_a_validation_error(
    kwargs: dict[str, Any], error: type[ValidationError], field: str
) -> None:
    args: dict[str, Any] = {"body": b"x", "message_id": "m", **kwargs}
    body = args.pop("body")
    with pytest.raises(error) as ei:
        Message(body, **args)
    assert ei.value.field == field
