"""Naive UTC timestamp columns (a worker in UTC) give the messages aware values give.

``Row`` objects carry naive local timestamps. Where the local zone is UTC the batch
keeps them naive until read, and JSON bodies are written from them directly; any
difference from the aware values would send a row under another id or body than
the Arrow path, or than a worker in another zone. No Spark here: the builder runs
on plain column lists, as it does inside a task.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from property_budget import examples
from sendonce import MessageSpec
from sendonce.spark import _columns
from sendonce.spark._columns import Columns, naive_utc_column
from sendonce.spark._rows import BatchEncoder, ColumnPlan, encode_columns, normalize_columns

pytestmark = pytest.mark.skipif(
    time.tzname != ("UTC", "UTC") or time.timezone != 0,
    reason="these run where the tests' own zone is UTC (CI); a subprocess covers other zones",
)

NAIVE = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1))
SPECS = [
    MessageSpec("order-{id}/created"),  # JSON body of the whole row
    MessageSpec("{id}@{at}"),  # the timestamp in the id too
    MessageSpec("{id}", body=lambda r: f"{r['at'].isoformat()}|{r['note']}"),
]
DYNAMIC = ColumnPlan(("id", "at", "note"), (None, None, None), (), True, dynamic=True)
DECLARED = ColumnPlan(("id", "at", "note"), (None, ("ts",), None), (("id", "int"),), True)


def messages(spec: MessageSpec, plan: ColumnPlan, columns: dict[str, list[Any]]) -> list[Any]:
    encoder = BatchEncoder(spec, plan)
    encoded = encode_columns(encoder, dict(columns), len(columns["id"]))
    assert not encoded.errors
    # The column-wise builders checked their first row against the per-row spec and
    # kept their fast path (a mismatch would fall back to building row by row).
    assert encoder.id.trusted and (encoder.json is None or encoder.json.trusted)
    return [(m.message_id, m.body) for m in encoded.messages]


@settings(max_examples=examples(120), deadline=None)
@given(
    times=st.lists(NAIVE, min_size=1, max_size=8),
    spec_index=st.integers(0, len(SPECS) - 1),
    declared=st.booleans(),
)
def test_naive_utc_columns_encode_as_their_aware_values(
    times: list[datetime], spec_index: int, declared: bool
) -> None:
    spec, plan = SPECS[spec_index], DECLARED if declared else DYNAMIC
    rows = len(times)
    naive = {"id": list(range(rows)), "at": times, "note": ['x"é'] * rows}
    aware = dict(naive, at=[t.replace(tzinfo=UTC) for t in times])  # what Arrow hands over
    assert messages(spec, plan, naive) == messages(spec, plan, aware)
    with pytest.MonkeyPatch.context() as patch:  # the eager conversion, as in other zones
        patch.setattr(_columns, "_zone_is_utc", lambda: False)
        assert messages(spec, plan, naive) == messages(spec, plan, aware)


@given(times=st.lists(NAIVE, min_size=1, max_size=5))
def test_no_reader_ever_sees_a_naive_value(times: list[datetime]) -> None:
    columns = normalize_columns(
        DYNAMIC, {"id": [1] * len(times), "at": list(times), "note": ["n"] * len(times)}
    )
    assert isinstance(columns, Columns) and columns.naive("at") == times
    assert list(columns) == ["id", "at", "note"]  # the batch's column order
    assert all(v.tzinfo is UTC for v in columns.row(0).values() if isinstance(v, datetime))
    assert columns.naive("at") == times  # one row read converts nothing else
    assert [v.tzinfo for v in columns["at"]] == [UTC] * len(times)
    assert columns.naive("at") is None  # read once: aware from then on
    assert dict(columns.items())["at"] == [t.replace(tzinfo=UTC) for t in times]


def test_only_naive_datetimes_of_a_utc_zone_stay_naive() -> None:
    naive = [datetime(2026, 1, 1, 12), datetime(2026, 7, 1, 12)]
    assert naive_utc_column(naive)
    assert not naive_utc_column([])
    assert not naive_utc_column([*naive, None])  # nulls: converted the usual way
    assert not naive_utc_column([naive[0].replace(tzinfo=UTC)])  # aware already (Arrow)
    assert not naive_utc_column([datetime(1, 1, 1)])  # astimezone cannot say at year 1


@pytest.mark.parametrize("zone", ["America/New_York", "Etc/GMT-3"])
def test_in_another_zone_naive_values_are_converted(zone: str) -> None:
    """A worker in another zone: its naive values are local times, converted to UTC."""
    script = (
        "from datetime import datetime\n"
        "from sendonce import MessageSpec\n"
        "from sendonce.spark._columns import naive_utc_column\n"
        "from sendonce.spark._rows import BatchEncoder, ColumnPlan, encode_columns\n"
        "plan = ColumnPlan(('id', 'at'), (None, None), (), True, dynamic=True)\n"
        "times = [datetime(2026, 1, 1), datetime(2026, 7, 1)]\n"
        "assert not naive_utc_column(times)\n"
        "out = encode_columns(BatchEncoder(MessageSpec('{id}'), plan), "
        "{'id': [1, 2], 'at': times}, 2)\n"
        "print(*[m.body.decode() for m in out.messages], sep='\\n')\n"
    )
    env = dict(os.environ, TZ=zone)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    expected = {
        "America/New_York": ["2026-01-01T05:00:00+00:00", "2026-07-01T04:00:00+00:00"],
        "Etc/GMT-3": ["2025-12-31T21:00:00+00:00", "2026-06-30T21:00:00+00:00"],
    }[zone]
    assert out == [
        f'{{"at":"{expected[0]}","id":1}}'.replace(" ", ""),
        f'{{"at":"{expected[1]}","id":2}}'.replace(" ", ""),
    ]
