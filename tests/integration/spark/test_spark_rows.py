"""The column-wise message builder gives exactly what MessageSpec.to_message gives per row.

Both Spark row paths build messages column by column; a difference from the
per-row spec would send a row under another id (a duplicate after a retry).
No Spark here: the builder runs on plain column lists.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from property_budget import examples
from sendonce import MessageSpec
from sendonce.spark._rows import BatchEncoder, ColumnPlan, encode_columns

TEXT = st.text(alphabet=st.sampled_from('ab-_./%:~é漢 "\\'), max_size=8)
KEY = st.one_of(TEXT.filter(bool), st.integers(-(10**12), 10**12))
INSTANT = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-5)), timezone(timedelta(hours=9))]),
)
VALUE = st.one_of(
    st.none(),
    TEXT,
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, places=2),
    st.dates(),
    INSTANT,
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(["x", "y"]), st.integers(), max_size=2),
)
SPECS = [
    MessageSpec("{a}.{b}/x", body=None),
    MessageSpec("{a}", body=None, partition_key="p-{b}"),
    MessageSpec("k:{b}:{a}", body="c", session_id="{a}"),
    MessageSpec("{a}-{b}", body=lambda r: f"{r['a']}|{r['c']}"),
]


def plan_for(
    spec: MessageSpec, rows: list[dict[str, Any]] | None = None, *, declared: bool = True
) -> ColumnPlan:
    """The plan the driver would make; id columns of one Python type get their fast path.

    ``declared=False``: no kinds, as without a schema (each batch finds its own).
    """
    whole = not isinstance(spec.body, str)
    columns = ("a", "b", "c", "d") if whole else ("a", "b", "c")
    kinds = []
    for name in ("a", "b") if declared else ():
        types = {type(r[name]) for r in rows or []}
        if types == {str}:
            kinds.append((name, "str"))
        elif types == {int}:
            kinds.append((name, "int"))
    return ColumnPlan(columns, (None,) * len(columns), tuple(kinds), whole)


@settings(max_examples=examples(150), deadline=None)
@given(
    spec_index=st.integers(0, len(SPECS) - 1),
    rows=st.lists(
        st.fixed_dictionaries({"a": KEY, "b": KEY, "c": TEXT, "d": VALUE}), min_size=1, max_size=8
    ),
    declared=st.booleans(),
)
def test_columns_build_the_messages_the_spec_builds(
    spec_index: int, rows: list[dict[str, Any]], declared: bool
) -> None:
    spec = SPECS[spec_index]
    plan = plan_for(spec, rows, declared=declared)
    columns = {name: [r[name] for r in rows] for name in plan.columns}
    encoded = encode_columns(BatchEncoder(spec, plan), columns, len(rows))
    assert not encoded.errors
    assert encoded.messages == [spec.to_message({n: r[n] for n in plan.columns}) for r in rows]


def test_rows_the_spec_refuses_are_reported_not_raised() -> None:
    spec = MessageSpec("{a}.{b}/x", body=None)
    plan = plan_for(spec)
    columns: dict[str, list[Any]] = {
        "a": ["ok", None, "ok2", "nan"],
        "b": [1, 2, 3, 4],
        "c": ["", "", "", ""],
        "d": [1.5, 2.5, float("nan"), 0.0],
    }
    columns["d"][3] = float("inf")
    encoded = encode_columns(BatchEncoder(spec, plan), columns, 4)
    assert [m.message_id for m in encoded.messages] == ["ok.1/x"]
    failed = sorted(what for what, _ in encoded.errors)
    assert len(failed) == 3 and "nan.4/x" in failed and "ok2.3/x" in failed


def test_an_over_long_id_uses_the_template_overflow_rule() -> None:
    from sendonce import MessageIdTemplate

    spec = MessageSpec(MessageIdTemplate("{a}/{b}", overflow="hash"), body="c")
    plan = ColumnPlan(("a", "b", "c"), (None, None, None), (("a", "str"), ("b", "int")), False)
    columns: dict[str, list[Any]] = {"a": ["x" * 200, "short"], "b": [1, 2], "c": ["p", "q"]}
    encoded = encode_columns(BatchEncoder(spec, plan), columns, 2)
    expected = [
        spec.to_message({"a": a, "b": b, "c": c}) for a, b, c in zip(*columns.values(), strict=True)
    ]
    assert encoded.messages == expected
    assert len(encoded.messages[0].message_id) == 128


def test_naive_timestamps_from_rows_read_as_the_worker_local_time() -> None:
    """Rows carry naive local datetimes; Arrow carries aware ones: same instant, same id."""
    spec = MessageSpec("{t}/{d}", body=None)
    plan = ColumnPlan(("t", "d"), (("ts",), None), (("t", "any"), ("d", "any")), True)
    aware = datetime(2024, 3, 10, 16, 0, tzinfo=UTC)
    naive_local = aware.astimezone().replace(tzinfo=None)
    arrow = encode_columns(BatchEncoder(spec, plan), {"t": [aware], "d": [date(2024, 1, 2)]}, 1)
    rows = encode_columns(
        BatchEncoder(spec, plan), {"t": [naive_local], "d": [date(2024, 1, 2)]}, 1
    )
    assert arrow.messages == rows.messages
    assert arrow.messages[0].message_id == "2024-03-10T16:00:00Z/2024-01-02"
    assert Decimal  # the decimal path is covered by the property test


def test_an_int_too_long_for_text_fails_its_row_without_a_schema() -> None:
    spec = MessageSpec("{a}/{b}", body="c")
    plan = ColumnPlan(("a", "b", "c"), (None, None, None), (), False)  # kinds found per batch
    columns: dict[str, list[Any]] = {"a": [1, 10**5000, 3], "b": [1, 2, 3], "c": ["p", "q", "r"]}
    encoded = encode_columns(BatchEncoder(spec, plan), columns, 3)
    assert [m.message_id for m in encoded.messages] == ["1/1", "3/3"]
    assert [type(e).__name__ for _, e in encoded.errors] == ["MessageIdError"]


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), INSTANT, st.datetimes(datetime(1970, 1, 2), datetime(2100, 1, 1))),
        max_size=6,
    )
)
def test_a_timestamp_column_is_normalised_as_each_value_would_be(column: list[Any]) -> None:
    """Aware UTC values (Arrow) are kept; naive (Row) and other zones become UTC."""
    from sendonce.spark._rows import _to_utc, normalize_columns

    plan = ColumnPlan(("t",), (("ts",),), (), True)
    got = normalize_columns(plan, {"t": list(column)})["t"]
    expected = [None if v is None else _to_utc(v) for v in column]
    assert got == expected
    assert [getattr(v, "tzinfo", None) for v in got] == [UTC if v else None for v in expected]


def test_ids_the_template_refuses_fail_their_row_only() -> None:
    spec = MessageSpec("{a}/{b}", body="c")
    plan = ColumnPlan(("a", "b", "c"), (None, None, None), (("a", "str"),), False)
    columns: dict[str, list[Any]] = {
        "a": ["x" * 200, "ok", "fine"],
        "b": [1, datetime(2024, 1, 1), 3],  # a naive datetime has no canonical text
        "c": ["p", "q", "r"],
    }
    encoded = encode_columns(BatchEncoder(spec, plan), columns, 3)
    assert [m.message_id for m in encoded.messages] == ["fine/3"]
    assert sorted(type(e).__name__ for _, e in encoded.errors) == ["MessageIdError"] * 2


@settings(max_examples=examples(150), deadline=None)
@given(
    column=st.one_of(
        st.lists(VALUE, max_size=6),
        st.lists(INSTANT, max_size=6),
        st.lists(st.datetimes(datetime(1970, 1, 2), datetime(2100, 1, 1)), max_size=6),
    )
)
def test_rows_without_a_schema_normalise_each_value_by_its_type(column: list[Any]) -> None:
    # Columns whose values need nothing, or are all datetimes, are normalised in one
    # pass; every value must come out as the per-value rule makes it.
    from sendonce.spark._rows import _dynamic, normalize_columns

    plan = ColumnPlan(("d",), (None,), (), True, dynamic=True)
    expected = [_dynamic(v) for v in column]
    got = normalize_columns(plan, {"d": list(column)})["d"]
    assert got == expected
    assert [type(v) for v in got] == [type(v) for v in expected]
    assert [getattr(v, "tzinfo", None) for v in got] == [
        getattr(v, "tzinfo", None) for v in expected
    ]
