"""Reading JSON Lines and CSV input for ``sendonce publish``, one record at a time.

The rules a spreadsheet export needs: a UTF-8 byte-order mark (Excel's default)
is skipped, other encodings (cp1252, UTF-16) are read with ``--encoding``, other
separators with ``--delimiter``, a header that names a column twice is refused
(the values of all but the last would be lost without a word), a row with the
wrong number of cells is a bad line, blank lines are skipped, a field may be as
long as the entity's message size, and surrounding spaces are kept unless
``--strip`` (and counted, so the user is told). Records are yielded one by one
so a file of any size is read in bounded memory.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, Literal

__all__ = ["BadLine", "Format", "Reading", "Record", "format_of", "open_input", "read_records"]

Format = Literal["jsonl", "csv"]
_CSV_DEFAULT_FIELD_LIMIT = 131_072  # Python's csv default


@dataclass(frozen=True, slots=True)
class Reading:
    """How to read the input: its format and the options a spreadsheet export may need."""

    format: Format = "jsonl"
    encoding: str = "utf-8-sig"
    delimiter: str = ","
    strip: bool = False
    field_limit: int = _CSV_DEFAULT_FIELD_LIMIT
    """The longest CSV field accepted: the entity's message size (a longer one cannot fit)."""


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
    """What reading saw that deserves a note once: the CSV header, values with spaces."""

    def __init__(self) -> None:
        self.columns: list[str] | None = None
        self.spaced = 0
        """Records with a value that has surrounding spaces (kept: without --strip)."""
        self.first_spaced: int | None = None


def format_of(path: str, fmt: str | None) -> Format:
    """The input format: as given, else ``.csv`` files are CSV and the rest JSON Lines."""
    if fmt is not None:
        return "csv" if fmt == "csv" else "jsonl"
    return "csv" if path.lower().endswith(".csv") else "jsonl"


@contextmanager
def open_input(raw: BinaryIO, encoding: str = "utf-8-sig") -> Iterator[IO[str]]:
    """Text over ``raw`` (UTF-8 with an optional byte-order mark by default), newlines
    kept for csv."""
    text = io.TextIOWrapper(raw, encoding=encoding, newline="")
    try:
        yield text
    finally:
        text.detach()


def read_records(
    stream: IO[str], reading: Reading | Format, header: Header | None = None
) -> Iterator[Record | BadLine]:
    """Yield each record with its line number, or a :class:`BadLine` for a malformed one."""
    if not isinstance(reading, Reading):
        reading = Reading(format=reading)
    if reading.format == "csv":
        yield from _read_csv(stream, header or Header(), reading)
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


def _read_csv(stream: IO[str], header: Header, reading: Reading) -> Iterator[Record | BadLine]:
    # The limit is process-wide in the csv module; a CLI process reads one file at a time.
    csv.field_size_limit(max(reading.field_limit, _CSV_DEFAULT_FIELD_LIMIT))
    reader = csv.reader(stream, strict=True, delimiter=reading.delimiter)
    strip = reading.strip
    try:
        for columns in reader:
            if columns:
                break
        else:
            return  # an empty file: no records
        if strip:
            columns = [c.strip() for c in columns]
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
            if strip:
                row = [value.strip() for value in row]
            elif any(value != value.strip() for value in row):
                header.spaced += 1
                if header.first_spaced is None:
                    header.first_spaced = reader.line_num
            yield Record(reader.line_num, dict(zip(columns, row, strict=True)))
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            yield BadLine(
                reader.line_num,
                f"a field is longer than {reading.field_limit} characters, the message size "
                "limit of the entity: the record cannot fit in a message",
            )
            return
        yield BadLine(reader.line_num, f"malformed CSV: {exc}")
