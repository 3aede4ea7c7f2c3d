"""A batch's normalised columns, whose timestamps are made timezone-aware only when read.

``Row`` objects carry naive timestamps in the worker's local time zone, and every
reader of a batch expects aware UTC values. Making each value aware costs more
than the rest of the encoding of its column. Where the worker's zone is UTC the
naive value already *is* the UTC time, so a JSON body can be written straight from
it ("+00:00" appended) and no aware value is ever needed. :class:`Columns` keeps
such columns naive until something reads them, and then converts the whole column
(or, for one row, one value): no reader can ever see a naive value.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

__all__ = ["Columns", "naive_utc_column"]

_AWARE = partial(datetime.replace, tzinfo=UTC)  # a naive UTC time made aware; never raises


def _zone_is_utc() -> bool:
    """The process's local zone is UTC itself (not merely an offset of 0 today)."""
    return time.timezone == 0 and time.altzone == 0 and set(time.tzname) == {"UTC"}


def naive_utc_column(values: list[Any]) -> bool:
    """True when ``values`` are naive datetimes that are UTC times (local zone UTC).

    The C library's view of the zone is checked too, on the first and last value: a
    ``TZ`` changed without ``time.tzset()`` must not pass for UTC.
    """
    if not values or not _zone_is_utc() or set(map(type, values)) != {datetime}:
        return False
    if {v.tzinfo for v in values} != {None}:
        return False
    try:
        return all(v.astimezone(UTC) == _AWARE(v) for v in (values[0], values[-1]))
    except (OverflowError, ValueError):  # year 1 or 9999: astimezone cannot tell
        return False


class Columns(Mapping[str, list[Any]]):
    """Column name -> values, with naive UTC timestamp columns converted on first read.

    ``naive(name)`` hands the JSON body builder the naive values of a column not read
    yet; ``row(i)`` builds one record converting only that row's values.
    """

    __slots__ = ("_naive", "_names", "_ready")

    def __init__(
        self, names: list[str], ready: dict[str, list[Any]], naive: dict[str, list[datetime]]
    ) -> None:
        """``names`` in the batch's order; each is in exactly one of ``ready`` and ``naive``."""
        if sorted(names) != sorted([*ready, *naive]):
            raise ValueError("every column must be either ready or naive")
        self._names = names
        self._ready = ready
        self._naive = naive

    def __getitem__(self, name: str) -> list[Any]:
        values = self._ready.get(name)
        if values is None:
            pending = self._naive.pop(name)  # KeyError for an unknown name, as a dict
            values = self._ready[name] = list(map(_AWARE, pending))
        return values

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._ready or name in self._naive

    def naive(self, name: str) -> list[datetime] | None:
        """The naive UTC values of ``name`` if no reader has converted it yet."""
        return self._naive.get(name)

    def row(self, index: int) -> dict[str, Any]:
        """One record, aware timestamps included, without converting whole columns."""
        record = {name: values[index] for name, values in self._ready.items()}
        for name, values in self._naive.items():
            record[name] = _AWARE(values[index])
        return {name: record[name] for name in self._names}

    def __repr__(self) -> str:
        return f"Columns({list(self._names)!r}, naive={list(self._naive)!r})"
