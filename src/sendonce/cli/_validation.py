"""The validation pass of ``sendonce publish``: every problem of the input, found at once.

The file is read once before anything is sent: every record is parsed and built into
its message and checked against the entity's rules, keeping a few numbers per
record (line, size, hashes of its id and body), so memory stays bounded whatever the
file's size; two records that build one id with different bodies are refused. A
problem of a line is reported with its line; a problem of the command that every
line shares is reported once with the count of lines it affects. Any problem:
nothing is published (exit 2).
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import os
import re
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any, NoReturn

import click

from .._entity import EntityProfile
from .._message import Message, MessageSpec
from ..errors import KeyRuleError, ValidationError
from ._records import BadLine, Header, Reading, format_of, open_input, read_records
from ._words import EXIT_USAGE, cli_text

__all__ = [
    "MAX_SHOWN",
    "Facts",
    "Source",
    "fail_invalid",
    "progress_bar",
    "source_options",
    "validate",
]

MAX_SHOWN = 20
"""Problems (and failures) listed one by one; the rest are counted."""
_SHARED_LINES_SHOWN = 5
_PROGRESS_EVERY = 1000
_LOW = (1 << 32) - 1


def _hash64(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


@dataclass
class Shared:
    """A problem of the command rather than of one line (a field the template names and no
    record has, sessions the options do not give): reported once, with the lines it affects."""

    text: str
    count: int = 0
    lines: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        shown = ", ".join(map(str, self.lines))
        if self.count == 1:
            return f"line {shown}: {self.text}"
        more = self.count - len(self.lines)
        tail = f" and {more} more: {self.count} lines" if more else ""
        return f"{self.text} (lines {shown}{tail})"


@dataclass
class Facts:
    """What the validation pass keeps per record: a few numbers, never the record."""

    lines: array[int] = field(default_factory=lambda: array("q"))
    ids: array[int] = field(default_factory=lambda: array("q"))
    keyed_ids: array[int] = field(default_factory=lambda: array("q"))
    bodies: array[int] = field(default_factory=lambda: array("q"))
    sizes: array[int] = field(default_factory=lambda: array("q"))
    without_session: list[int] = field(default_factory=list)
    without_session_count: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    first_line_not_json: bool = False
    shared: dict[str, Shared] = field(default_factory=dict)
    bad: int = 0
    missing_fields: bool = False

    def add(self, line: int, message: Message) -> None:
        self.lines.append(line)
        self.ids.append(_hash64(message.message_id))
        key = message.partition_key or message.session_id or message.message_id
        self.keyed_ids.append(_hash64(message.message_id + "\0" + key))
        self.bodies.append(message._body_hash)
        self.sizes.append(message.size)
        if message.session_id is None:
            self.without_session_count += 1
            if len(self.without_session) < MAX_SHOWN:
                self.without_session.append(line)

    def problem(self, text: str) -> None:
        self.bad += 1
        if len(self.problems) < MAX_SHOWN:
            self.problems.append(text)

    def shared_problem(self, group: str, line: int, text: str, count: int = 1) -> None:
        """A problem many lines share: kept once, with its count and first lines."""
        self.bad += count
        entry = self.shared.setdefault(group, Shared(text))
        entry.count += count
        if len(entry.lines) < _SHARED_LINES_SHOWN:
            entry.lines.append(line)

    def errors(self) -> list[str]:
        """Every problem to show: the command's own first, then those of single lines."""
        return [str(s) for s in self.shared.values()] + self.problems

    def unshown(self) -> int:
        """Problems counted but not listed (past the first few)."""
        return self.bad - sum(s.count for s in self.shared.values()) - len(self.problems)

    def check(self, profile: EntityProfile) -> None:
        """The entity's rules and the one-body-per-id rule, for every record at once."""
        if profile.sessions and self.without_session_count:
            text = f"entity {profile.name!r} requires sessions: give --session-id"
            lines = self.without_session[:_SHARED_LINES_SHOWN]
            self.shared["sessions"] = Shared(text, self.without_session_count, lines)
            self.bad += self.without_session_count
        limit = profile.max_message_size
        for line, size in zip(self.lines, self.sizes, strict=True):
            if size > limit:
                self.problem(
                    f"line {line}: the message is {size} bytes, over the {limit}-byte limit of "
                    f"entity {profile.name!r}"
                )
        keys = self.keyed_ids if profile.partitioned else self.ids
        # One int per record, id hash above the record's index: sorting groups equal ids in
        # file order without a separate key list.
        order = [(key << 32) | index for index, key in enumerate(keys)]
        order.sort()
        first = order[0] & _LOW if order else 0
        for previous, packed in pairwise(order):
            index = packed & _LOW
            if packed >> 32 != previous >> 32:
                first = index
                continue
            if self.bodies[index] != self.bodies[first]:
                self.problem(
                    f"line {self.lines[index]}: builds the same message id as line "
                    f"{self.lines[first]}, with a different body; the broker would keep only "
                    "the first (give distinct records distinct ids)"
                )


def progress_bar(label: str, length: int, shown: bool) -> Any:
    return click.progressbar(
        length=length, label=label, file=sys.stderr if shown else io.StringIO()
    )


def validate(
    path: str, source: Source, spec: MessageSpec, progress: bool, profile: EntityProfile
) -> Facts:
    """Pass 1: every record parsed, built and checked against the entity's rules, every
    problem found in this one pass; nothing kept but :class:`Facts`."""
    facts = Facts()
    header = Header()
    reading = source.reading
    with (
        open(path, "rb") as raw,
        progress_bar("validating", os.path.getsize(path), progress) as bar,
    ):
        done = 0
        try:
            with open_input(raw, reading.encoding) as stream:
                for count, item in enumerate(read_records(stream, reading, header), start=1):
                    if count % _PROGRESS_EVERY == 0:
                        bar.update(raw.tell() - done)
                        done = raw.tell()
                    if isinstance(item, BadLine):
                        facts.problem(str(item))
                        if item.line == 1 and item.reason.startswith("malformed JSON"):
                            facts.first_line_not_json = True
                        continue
                    try:
                        message = spec.to_message(item.fields)
                    except ValidationError as exc:
                        group = _shared_group(exc, item.fields)
                        if group is None:
                            facts.problem(f"line {item.line}: {cli_text(exc)}")
                            continue
                        facts.missing_fields |= group.startswith("missing:")
                        text = _MESSAGE_PREFIX.sub("", cli_text(exc))
                        facts.shared_problem(group, item.line, text)
                        continue
                    facts.add(item.line, message)
        except UnicodeError as exc:  # UnicodeDecodeError, or UTF-16 without its BOM
            facts.problem(_decode_problem(path, source, exc))
        bar.update(max(os.path.getsize(path) - done, 0))
    facts.check(profile)
    facts.notes.extend(_notes(facts, header, source))
    return facts


def _decode_problem(path: str, source: Source, exc: UnicodeError) -> str:
    """Text in another encoding: say which option reads it."""
    with open(path, "rb") as raw:
        head = raw.read(2)
    encoding = source.reading.encoding.removesuffix("-sig")
    if head in (b"\xff\xfe", b"\xfe\xff") and not encoding.startswith("utf-16"):
        hint = "it starts with a UTF-16 byte-order mark: give --encoding utf-16"
    else:
        hint = (
            "give its encoding with --encoding, e.g. --encoding cp1252 for a Windows "
            "spreadsheet export or --encoding utf-16"
        )
    if isinstance(exc, UnicodeDecodeError):
        detail = f"{exc.reason} at byte {exc.start}"
    else:
        detail = str(exc)
        if encoding == "utf-16":
            hint = "give --encoding utf-16-le or utf-16-be (the file has no byte-order mark)"
    return f"{source.name}: not {encoding} text ({detail}); {hint}"


def _notes(facts: Facts, header: Header, source: Source) -> Iterator[str]:
    """What the user should know about how the file was read, each said once."""
    reading = source.reading
    columns = header.columns
    if facts.missing_fields and columns is not None:
        yield "the CSV header has the columns " + ", ".join(repr(c) for c in columns)
    if facts.bad and columns is not None and len(columns) == 1:
        for other in (";", "\t", "|"):
            if other != reading.delimiter and other in columns[0]:
                shown = "tab" if other == "\t" else repr(other)
                yield f"the header looks separated by {shown}: give --delimiter {shown}"
                break
    if facts.first_line_not_json and source.format_guessed:
        why = (
            "standard input has no file name"
            if source.name == "standard input"
            else "its name does not end in .csv"
        )
        yield f"{source.name} was read as JSON Lines ({why}); if it is CSV, give --format csv"
    if header.spaced:
        yield (
            f"{header.spaced} record(s) have values with surrounding spaces (the first at line "
            f"{header.first_spaced}), kept as they are: ' 77 ' and '77' build different ids. "
            "--strip removes them"
        )


_MESSAGE_PREFIX = re.compile(r"^message '(?:[^'\\]|\\.)*': ")


def _shared_group(exc: ValidationError, fields: dict[str, Any]) -> str | None:
    """The group of a problem that comes from the command, not the line; ``None`` otherwise.

    A field the templates name and the record lacks, and a partition key template
    that builds something other than the session id template, are the options' doing:
    every line says the same, so they are shown once with the count of lines.
    """
    if exc.field is not None and exc.field not in fields:
        return f"missing:{exc.field}"
    if isinstance(exc, KeyRuleError) and exc.field == "partition_key":
        return "partition-key-vs-session-id"
    return None


def fail_invalid(facts: Facts, as_json: bool) -> NoReturn:
    errors = facts.errors()
    for error in errors:
        click.echo(f"Error: {error}", err=True)
    for note in facts.notes:
        click.echo(f"note: {note}", err=True)
    if facts.unshown() > 0:
        click.echo(f"Error: ... and {facts.unshown()} more", err=True)
    click.echo(f"{facts.bad} bad line(s): nothing was published", err=True)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "status": "invalid",
                    "error": f"{facts.bad} bad line(s): nothing was published",
                    "bad_lines": facts.bad,
                    "errors": errors,
                    "sent": 0,
                    "exit_status": EXIT_USAGE,
                }
            )
        )
    sys.exit(EXIT_USAGE)


@dataclass(frozen=True)
class Source:
    """The input as the options describe it: its name for messages, and how to read it."""

    name: str
    reading: Reading
    format_guessed: bool

    def fitted(self, profile: EntityProfile) -> Source:
        """The same, with CSV fields allowed as long as the entity's largest message."""
        reading = replace(self.reading, field_limit=profile.max_message_size)
        return replace(self, reading=reading)


def source_options(
    file: str, fmt: str | None, encoding: str, delimiter: str | None, strip: bool
) -> Source:
    """The reading options checked before anything is opened."""
    try:
        codec = codecs.lookup(encoding).name
    except LookupError:
        raise click.BadParameter(
            f"{encoding!r} is not a text encoding Python knows (e.g. utf-8, cp1252, utf-16, "
            "latin-1)",
            param_hint="--encoding",
        ) from None
    if codec == "utf-8":
        codec = "utf-8-sig"  # a byte-order mark (Excel's default) is skipped
    format_ = format_of(file, fmt)
    if format_ != "csv" and (delimiter is not None or strip):
        given = "--delimiter" if delimiter is not None else "--strip"
        raise click.UsageError(f"{given} applies to CSV input: add --format csv")
    if delimiter is not None:
        delimiter = {"tab": "\t", "\\t": "\t"}.get(delimiter, delimiter)
        if len(delimiter) != 1 or delimiter in '"\r\n':
            raise click.BadParameter(
                f"{delimiter!r} must be one character other than a quote or a line break "
                "(write tab for a tab)",
                param_hint="--delimiter",
            )
    name = "standard input" if file == "-" else file
    reading = Reading(format_, codec, delimiter or ",", strip)
    return Source(name, reading, format_guessed=fmt is None)
