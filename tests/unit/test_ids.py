"""MessageIdTemplate and content_message_id: examples, canonical values, rejections."""

from __future__ import annotations

import enum
import hashlib
import pickle
import re
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal, localcontext
from typing import Any

import pytest

from sendonce import MessageIdError, MessageIdTemplate, content_message_id
from sendonce._ids import canonical_text

# ---------------------------------------------------------------- basics


def test_design_example() -> None:
    t = MessageIdTemplate("{order_id}.{year}/payment")
    assert t.fields == ("order_id", "year")
    assert t.build({"order_id": 12345, "year": 2017}) == "12345.2017/payment"
    assert t({"order_id": 12345, "year": 2017}) == "12345.2017/payment"


def test_fields_in_template_order_and_literals_kept() -> None:
    t = MessageIdTemplate("inv:{tenant}/{invoice}#{line}!")
    assert t.fields == ("tenant", "invoice", "line")
    assert t.build({"line": 3, "invoice": "A-1", "tenant": "acme"}) == "inv:acme/A-1#3!"


def test_extra_record_fields_are_ignored() -> None:
    t = MessageIdTemplate("{a}.{b}")
    assert t.build({"a": 1, "b": 2, "c": object()}) == "1.2"


def test_escaped_braces_are_literal_text() -> None:
    t = MessageIdTemplate("{{x}}{a}.{b}")
    assert t.fields == ("a", "b")
    assert t.build({"a": "1", "b": "2"}) == "{x}1.2"


def test_record_can_be_any_indexable_object() -> None:
    class Rec:
        def __getitem__(self, key: str) -> str:
            return key.upper()

    assert MessageIdTemplate("{a}.{b}").build(Rec()) == "A.B"


def test_spark_row_is_a_record() -> None:
    from pyspark.sql import Row

    t = MessageIdTemplate("{order_id}.{year}/payment")
    assert t.build(Row(order_id=12345, year=2017)) == "12345.2017/payment"
    assert t.build(Row(year=2017, order_id="12345", other=1.5)) == "12345.2017/payment"


def test_spark_row_missing_field_names_it() -> None:
    from pyspark.sql import Row

    t = MessageIdTemplate("{order_id}.{year}/payment")
    with pytest.raises(MessageIdError) as ei:
        t.build(Row(order_id=1))
    assert ei.value.field == "year"
    assert "year" in str(ei.value)


# ---------------------------------------------------------------- escaping


def test_split_between_fields_is_unambiguous() -> None:
    t = MessageIdTemplate("{a}.{b}")
    assert t.build({"a": "1.2", "b": "3"}) != t.build({"a": "1", "b": "2.3"})
    assert t.build({"a": "1.2", "b": "3"}) == "1%2E2.3"
    # only the separator's first char and % are escaped in a non-final field
    assert t.build({"a": "1", "b": "2.3"}) == "1.2.3"


def test_escape_char_itself_is_escaped_everywhere() -> None:
    t = MessageIdTemplate("{a}.{b}", allow_empty=True)
    assert t.build({"a": "%2E", "b": "%"}) == "%252E.%25"
    assert t.build({"a": "%2E", "b": ""}) != t.build({"a": ".", "b": ""})


def test_multi_char_separator_escapes_its_first_char() -> None:
    t = MessageIdTemplate("{a}::{b}")
    assert t.build({"a": "x:", "b": "y"}) != t.build({"a": "x", "b": ":y"})
    assert t.build({"a": "x:", "b": ":y"}) == "x%3A:::y"


def test_non_ascii_separator_is_percent_encoded_as_utf8() -> None:
    t = MessageIdTemplate("{a}→{b}")
    assert t.build({"a": "1→2", "b": "3"}) == "1%E2%86%922→3"
    assert t.build({"a": "1→2", "b": "3"}) != t.build({"a": "1", "b": "2→3"})


def test_values_equal_to_template_literals() -> None:
    t = MessageIdTemplate("p/{a}/{b}/s", allow_empty=True)
    ids = {
        t.build({"a": a, "b": b})
        for a, b in [("/", ""), ("", "/"), ("p", "s"), ("/s", ""), ("", "/s"), ("p/", "/s")]
    }
    assert len(ids) == 6


def test_empty_strings_are_distinct_from_each_other_positions() -> None:
    t = MessageIdTemplate("{a}.{b}.{c}", allow_empty=True)
    ids = {
        t.build(dict(zip("abc", v, strict=True)))
        for v in [("", "", "."), ("", ".", ""), (".", "", "")]
    }
    assert len(ids) == 3


@pytest.mark.parametrize("record", [{"a": "", "b": 2017}, {"a": "12345", "b": ""}])
def test_an_empty_field_is_refused_as_missing_data(record: dict[str, Any]) -> None:
    # Issue 14: ",2017" and another ",2017" record would share the id ".2017/payment".
    t = MessageIdTemplate("{a}.{b}/payment")
    name = next(k for k, v in record.items() if v == "")
    with pytest.raises(MessageIdError, match=f"field '{name}' is empty") as caught:
        t.build(record)
    assert caught.value.field == name
    assert MessageIdTemplate("{a}.{b}/payment", allow_empty=True).build(record) in (
        ".2017/payment",
        "12345./payment",
    )


def test_allow_empty_is_part_of_the_template_identity() -> None:
    strict, lenient = MessageIdTemplate("{a}/x"), MessageIdTemplate("{a}/x", allow_empty=True)
    assert strict != lenient
    assert pickle.loads(pickle.dumps(lenient)).build({"a": ""}) == "/x"
    with pytest.raises(MessageIdError):
        MessageIdTemplate("{a}/x", allow_empty=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["abc", "ABC-def_123", "0", "-", "_", "a-b-c_d"])
def test_readable_values_are_unchanged(value: str) -> None:
    t = MessageIdTemplate("{a}.{b}/{c}:x")
    assert t.build({"a": value, "b": value, "c": value}) == f"{value}.{value}/{value}:x"


# ---------------------------------------------------------------- canonical values


def _id(value: Any) -> str:
    return MessageIdTemplate("{v}/x").build({"v": value})


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (12345, "12345"),
        (0, "0"),
        (-7, "-7"),
        (Decimal("1.50"), Decimal("1.5")),
        (Decimal("1.50"), "1.5"),
        (Decimal("100"), 100),
        (Decimal("1E+2"), 100),
        (Decimal("2.000"), 2),
        (Decimal("-0"), 0),
        (Decimal("0.000"), "0"),
        (
            datetime(2017, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
            datetime(2017, 5, 1, 12, 0, tzinfo=UTC),
        ),
        (
            datetime(2017, 5, 1, 12, 0, 0, 1, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
            datetime(2017, 5, 1, 17, 30, 0, 1, tzinfo=UTC),
        ),
        (date(2017, 5, 1), "2017-05-01"),
        (uuid.UUID("12345678-1234-5678-1234-567812345678"), "12345678-1234-5678-1234-567812345678"),
    ],
)
def test_canonical_equivalence(left: Any, right: Any) -> None:
    assert _id(left) == _id(right)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("é😀", "é😀"),
        (12345, "12345"),
        (-3, "-3"),
        (10**30, "1" + "0" * 30),
        (Decimal("1.50"), "1.5"),
        (Decimal("1E+3"), "1000"),
        (Decimal("0.0001000"), "0.0001"),
        (Decimal("-2.50"), "-2.5"),
        (datetime(2017, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))), "2017-05-01T12:00:00Z"),
        (datetime(2017, 5, 1, 12, 0, 0, 250, tzinfo=UTC), "2017-05-01T12:00:00.000250Z"),
        (date(2017, 5, 1), "2017-05-01"),
        (uuid.UUID("12345678-1234-5678-1234-567812345678"), "12345678-1234-5678-1234-567812345678"),
    ],
)
def test_canonical_text_table(value: Any, text: str) -> None:
    assert canonical_text(value, "f") == text


def test_zoneinfo_datetimes_are_the_same_instant() -> None:
    from zoneinfo import ZoneInfo

    paris = datetime(2017, 7, 1, 14, 0, tzinfo=ZoneInfo("Europe/Paris"))
    tokyo = datetime(2017, 7, 1, 21, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    assert _id(paris) == _id(tokyo) == "2017-07-01T12:00:00Z/x"


def test_different_instants_differ() -> None:
    a = datetime(2017, 5, 1, 12, 0, tzinfo=UTC)
    assert _id(a) != _id(a + timedelta(microseconds=1))
    assert _id(a) != _id(a.date())


def test_str_and_int_enums_use_their_values() -> None:
    class Colour(enum.StrEnum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    assert _id(Colour.RED) == _id("red")
    assert _id(Level.HIGH) == _id(3)


def test_numpy_and_pandas_scalars() -> None:
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    assert _id(np.int64(12345)) == _id(12345)
    aware = pd.Timestamp("2017-05-01 14:00", tz="Europe/Paris")
    assert _id(aware) == _id(datetime(2017, 5, 1, 12, 0, tzinfo=UTC))
    for bad in (np.float64(1.0), np.bool_(True), pd.Timestamp("2017-05-01 14:00")):
        with pytest.raises(MessageIdError) as ei:
            _id(bad)
        assert ei.value.field == "v"


def test_str_subclass_uses_its_text() -> None:
    class Tagged(str):
        def __str__(self) -> str:
            return "not-the-value"

    assert _id(Tagged("abc")) == _id("abc")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (None, "None"),
        (1.5, "float"),
        (1.0, "float"),
        (float("nan"), "float"),
        (True, "bool"),
        (False, "bool"),
        (datetime(2017, 5, 1, 12, 0), "naive"),
        (Decimal("NaN"), "finite"),
        (Decimal("Infinity"), "finite"),
        (Decimal("sNaN"), "finite"),
        (b"bytes", "bytes"),
        ([1, 2], "list"),
        (object(), "object"),
        (1 + 2j, ""),
        (timedelta(seconds=1), "timedelta"),
    ],
    # No memory address in an id: every pytest-xdist worker must collect the same names.
    ids=lambda value: re.sub(r" at 0x[0-9a-f]+", "", repr(value)),
)
def test_unsupported_values_raise_naming_the_field(value: Any, words: str) -> None:
    t = MessageIdTemplate("{order_id}.{amount}/x")
    with pytest.raises(MessageIdError) as ei:
        t.build({"order_id": 1, "amount": value})
    assert ei.value.field == "amount"
    assert "'amount'" in str(ei.value)
    assert words in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_missing_field_names_it() -> None:
    t = MessageIdTemplate("{order_id}.{year}/payment")
    for record in ({"order_id": 1}, {}, [1, 2], None, 5):
        with pytest.raises(MessageIdError) as ei:
            t.build(record)
        assert ei.value.field in ("order_id", "year")
        assert ei.value.field in str(ei.value)
    with pytest.raises(MessageIdError, match="'year'") as ei:
        t.build({"order_id": 1})
    assert ei.value.field == "year"


# B1-B3 were found by these tests and fixed in 08de193.


def test_decimal_canonical_ignores_context_precision() -> None:
    baseline = _id(Decimal("1.234567"))
    with localcontext() as ctx:
        ctx.prec = 5
        assert _id(Decimal("1.234567")) == baseline


def test_decimal_with_many_digits_stay_distinct() -> None:
    a = Decimal("0.12345678901234567890123456789011")
    b = Decimal("0.12345678901234567890123456789012")
    assert _id(a) != _id(b)


@pytest.mark.parametrize("value", [10**5000, Decimal("1E+5000")], ids=["int", "decimal"])
def test_huge_numbers_raise_message_id_error_naming_field(value: Any) -> None:
    with pytest.raises(MessageIdError) as ei:
        MessageIdTemplate("{big}", overflow="hash").build({"big": value})
    assert ei.value.field == "big"


# ---------------------------------------------------------------- template rejection


@pytest.mark.parametrize(
    "template",
    [
        "{a}{b}",
        "{a!r}",
        "{a!s}",
        "{a:>5}",
        "{a.b}",
        "{a[0]}",
        "{}",
        "{0}",
        "{a}.{}",
        "no fields",
        "{{a}}",
        "{a}x{b}",
        "{a}7{b}",
        "{a}%{b}",
        "{a}.{a}",
        "{a",
        "a}",
        "{a}.{b",
        "{a!}",
        "{a-b}",
        "",
    ],
)
def test_template_rejected(template: str) -> None:
    with pytest.raises(MessageIdError) as ei:
        MessageIdTemplate(template)
    assert ei.value.field == "template"
    assert "template" in str(ei.value)


def test_template_rejection_explains_why() -> None:
    with pytest.raises(MessageIdError, match="not separated"):
        MessageIdTemplate("{a}{b}")
    with pytest.raises(MessageIdError, match="appears twice"):
        MessageIdTemplate("{a}.{a}")
    with pytest.raises(MessageIdError, match="no fields"):
        MessageIdTemplate("constant")


@pytest.mark.parametrize("template", [1, None, b"{a}"])
def test_template_must_be_str(template: Any) -> None:
    with pytest.raises(MessageIdError) as ei:
        MessageIdTemplate(template)
    assert ei.value.field == "template"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_length": 0}, "max_length"),
        ({"max_length": 129}, "max_length"),
        ({"max_length": True}, "max_length"),
        ({"max_length": 64.0}, "max_length"),
        ({"overflow": "truncate"}, "overflow"),
        ({"overflow": "hash", "max_length": 33}, "max_length"),
    ],
)
def test_bad_options_name_the_option(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(MessageIdError) as ei:
        MessageIdTemplate("{a}", **kwargs)
    assert ei.value.field == field
    assert field in str(ei.value)


def test_options_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        MessageIdTemplate("{a}", 64)  # type: ignore[call-arg]


# ---------------------------------------------------------------- length


def test_max_length_is_inclusive() -> None:
    t = MessageIdTemplate("{a}", max_length=10)
    assert t.build({"a": "x" * 10}) == "x" * 10
    with pytest.raises(MessageIdError) as ei:
        t.build({"a": "x" * 11})
    assert ei.value.field == "message_id"
    assert "11 characters" in str(ei.value)
    assert "'{a}'" in str(ei.value)  # names the template


def test_length_counts_escapes() -> None:
    t = MessageIdTemplate("{a}.{b}", max_length=10)
    assert t.build({"a": "1234", "b": "1234"}) == "1234.1234"
    with pytest.raises(MessageIdError):
        t.build({"a": "12..", "b": "1234"})  # 12%2E%2E.1234 is 13 chars


def test_default_limit_is_128() -> None:
    t = MessageIdTemplate("{a}")
    assert t.max_length == 128
    assert t.build({"a": "x" * 128}) == "x" * 128
    with pytest.raises(MessageIdError):
        t.build({"a": "x" * 129})


def test_empty_id_is_refused() -> None:
    with pytest.raises(MessageIdError) as ei:
        MessageIdTemplate("{a}").build({"a": ""})
    assert ei.value.field == "a"


def test_hash_overflow_is_bounded_deterministic_and_readable() -> None:
    t = MessageIdTemplate("{customer}.{order}/payment", max_length=64, overflow="hash")
    short = t.build({"customer": "acme", "order": 1})
    assert short == "acme.1/payment"  # under the limit: untouched
    record = {"customer": "c" * 80, "order": 7}
    full = "c" * 80 + ".7/payment"
    hashed = t.build(record)
    assert len(hashed) == 64
    assert hashed == t.build(dict(record))
    digest = hashlib.sha256(full.encode()).hexdigest()[:32]
    assert hashed == full[: 64 - 33] + "~" + digest
    other = t.build({"customer": "c" * 80, "order": 8})
    assert other != hashed
    assert other[:31] == hashed[:31]  # readable prefix shared


def test_hash_overflow_at_smallest_allowed_length() -> None:
    t = MessageIdTemplate("{a}", max_length=34, overflow="hash")
    hashed = t.build({"a": "y" * 100})
    assert len(hashed) == 34
    assert hashed.startswith("y~")


def test_hash_overflow_cannot_collide_with_unhashed_id() -> None:
    t = MessageIdTemplate("{a}", overflow="hash")
    hashed = t.build({"a": "x" * 200})
    assert t.build({"a": hashed}) != hashed


# ---------------------------------------------------------------- value semantics


def test_templates_pickle_round_trip() -> None:
    t = MessageIdTemplate("{order_id}.{year}/payment", max_length=40, overflow="hash")
    copy = pickle.loads(pickle.dumps(t))
    assert copy == t
    assert hash(copy) == hash(t)
    assert copy.fields == t.fields
    for record in ({"order_id": 12345, "year": 2017}, {"order_id": "z" * 60, "year": 1}):
        assert copy.build(record) == t.build(record)
    assert repr(copy) == repr(t)


def test_equality_covers_options() -> None:
    assert MessageIdTemplate("{a}") == MessageIdTemplate("{a}")
    assert MessageIdTemplate("{a}") != MessageIdTemplate("{a}", max_length=64)
    assert MessageIdTemplate("{a}", max_length=64) != MessageIdTemplate(
        "{a}", max_length=64, overflow="hash"
    )
    assert MessageIdTemplate("{a}") != "{a}"
    assert len({MessageIdTemplate("{a}"), MessageIdTemplate("{a}")}) == 1


def test_repr_shows_template_and_options() -> None:
    assert repr(MessageIdTemplate("{a}.x")) == (
        "MessageIdTemplate('{a}.x', max_length=128, overflow='error')"
    )


# ---------------------------------------------------------------- content ids


def test_content_id_is_sha256_of_body() -> None:
    body = b'{"order":1}'
    assert content_message_id(body) == hashlib.sha256(body).hexdigest()
    assert len(content_message_id(body)) == 64


def test_content_id_str_is_utf8() -> None:
    assert content_message_id("é") == content_message_id("é".encode())
    for view in (bytearray(b"ab"), memoryview(b"ab")):
        body: Any = view  # accepted at run time beyond the annotated bytes | str
        assert content_message_id(body) == content_message_id(b"ab")


def test_content_id_depends_on_every_byte() -> None:
    assert content_message_id(b"a") != content_message_id(b"b")
    assert content_message_id(b"") == hashlib.sha256(b"").hexdigest()


def test_content_id_prefix() -> None:
    assert (
        content_message_id(b"x", prefix="orders/") == "orders/" + hashlib.sha256(b"x").hexdigest()
    )
    assert len(content_message_id(b"x", prefix="p" * 64)) == 128
    with pytest.raises(MessageIdError) as ei:
        content_message_id(b"x", prefix="p" * 65)
    assert ei.value.field == "prefix"
    with pytest.raises(MessageIdError) as ei:
        content_message_id(b"x", prefix=1)  # type: ignore[arg-type]
    assert ei.value.field == "prefix"


@pytest.mark.parametrize("body", [None, 1, {"a": 1}, ["x"]])
def test_content_id_body_type_names_body(body: Any) -> None:
    with pytest.raises(MessageIdError) as ei:
        content_message_id(body)
    assert ei.value.field == "body"
    assert "body" in str(ei.value)


# ---------------------------------------------------------------- edges found later


@pytest.mark.parametrize(
    "value",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=2))),
        datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-2))),
    ],
    ids=["min-plus-2h", "max-minus-2h"],
)
def test_datetime_out_of_utc_range_raises_message_id_error(value: datetime) -> None:
    with pytest.raises(MessageIdError) as ei:
        MessageIdTemplate("{at}").build({"at": value})
    assert ei.value.field == "at"


@pytest.mark.parametrize("overflow", ["error", "hash"])
def test_unencodable_text_raises_message_id_error(overflow: Any) -> None:
    t = MessageIdTemplate("{a}/x", overflow=overflow)
    for value in ("\ud800", "ok\udcff" * 100):
        with pytest.raises(MessageIdError) as ei:
            t.build({"a": value})
        assert ei.value.field == "a"


@pytest.mark.parametrize(
    "text", ["{a}\ud800x", "\udcff{a}", "{a}.\ud800{b}"], ids=["tail", "head", "sep"]
)
def test_template_with_unencodable_literal_is_rejected(text: str) -> None:
    with pytest.raises(MessageIdError) as ei:
        MessageIdTemplate(text)
    assert ei.value.field == "template"
