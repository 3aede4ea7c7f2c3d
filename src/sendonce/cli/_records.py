"""Reading JSON Lines and CSV input for ``sendonce publish``, one record at a time.

The rules a spreadsheet export needs: a UTF-8 byte-order mark (Excel's default)
is skipped, a header that names a column twice is refused (the values of all but
the last would be lost without a word), a row with the wrong number of cells is
a bad line, and blank lines are skipped. Records are yielded one by one so a
file of any size is read in bounded memory.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, Literal

__all__ = ["BadLine", "Format", "Record", "format_of", "open_input", "read_records"]

Format = Literal["jsonl", "csv"]


@dataclass(frozen=True, slots=True)
class Record:
    """One input record and the (first) line it was read from."""

    line: int
    fields: dict[str, Any]


class BadLine(Exception):
    """A line that is not a record: malformed JSON, a short CSV row, a repeated header."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


class Header:
    """The CSV header that was read, to show once when fields are missing."""

    def __init__(self) -> None:
        self.columns: list[str] | None = None


def format_of(path: str, fmt: str | None) -> Format:
    """The input format: as given, else ``.csv`` files are CSV and the rest JSON Lines."""
    if fmt is not None:
        return "csv" if fmt == "csv" else "jsonl"
    return "csv" if path.lower().endswith(".csv") else "jsonl"


@contextmanager
def open_input(raw: BinaryIO) -> Iterator[IO[str]]:
    """Text over ``raw``: UTF-8 with an optional byte-order mark, newlines kept for csv."""
    text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
    try:
        yield text
    finally:
        text.detach()


def read_records(
    stream: IO[str], fmt: Format, header: Header | None = None
) -> Iterator[Record | BadLine]:
    """Yield each record with its line number, or a :class:`BadLine` for a malformed one."""
    if fmt == "csv":
        yield from _read_csv(stream, header or Header())
    else:
        yield from _read_jsonl(stream)


def _read_jsonl(stream: IO[str]) -> Iterator[Record | BadLine]:
    for number, text in enumerate(stream, start=1):
        text = text.rstrip("\r\n")  # error columns count from the line's own text
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            yield BadLine(number, f"malformed JSON: {exc.msg} (column {exc.colno})")
            continue
        if not isinstance(value, dict):
            yield BadLine(number, f"expected a JSON object, got {_json_kind(value)}")
            continue
        yield Record(number, value)


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return "a number"


def _read_csv(stream: IO[str], header: Header) -> Iterator[Record | BadLine]:
    reader = csv.reader(stream, strict=True)
    try:
        for columns in reader:
            if columns:
                break
        else:
            return  # an empty file: no records
        header.columns = columns
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            names = ", ".join(repr(c) for c in repeated)
            yield BadLine(
                reader.line_num,
                f"the header names column {names} more than once; every value but the last "
                "would be lost. Rename the columns so each is unique",
            )
            return
        width = len(columns)
        for row in reader:
            if not row:
                continue  # a blank line
            if len(row) != width:
                yield BadLine(reader.line_num, f"expected {width} columns, got {len(row)}")
                continue
            yield Record(reader.line_num, dict(zip(columns, row, strict=True)))
    except csv.Error as exc:
        yield BadLine(reader.line_num, f"malformed CSV: {exc}")
