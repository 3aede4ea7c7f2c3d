"""``sendonce publish``: publish a JSON Lines or CSV file, each record exactly once.

The whole file is read and every record turned into a message before anything
is sent: a malformed line, a missing template field or a message the entity
would refuse is reported with its line number and nothing is published. So a
run either sends nothing (exit 2) or sends every line and accounts for each one
(sent, duplicate, or failed with its error; exit 1 if any failed). Running the
same file again is safe: the broker drops the copies as duplicates.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, Any, Literal

import click

from .._entity import EntityProfile
from .._message import Message, MessageSpec
from .._sender import IdempotentSender, SendReport
from ..errors import SendOnceError, ValidationError, redact
from ._broker import parse_duration

__all__ = ["Record", "publish", "read_records"]

Format = Literal["jsonl", "csv"]
_MAX_SHOWN = 20
EXIT_INVALID = 2
EXIT_FAILED = 1
_OPTION_OF = {
    "message_id": "--id",
    "partition_key": "--partition-key",
    "session_id": "--session-id",
    "body": "--body-field",
}


@dataclass(frozen=True, slots=True)
class Record:
    line: int
    fields: dict[str, Any]


class BadLine(Exception):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line


def read_records(stream: IO[str], fmt: Format) -> Iterator[Record | BadLine]:
    """Yield each record with its line number, or a :class:`BadLine` for a malformed one."""
    if fmt == "csv":
        reader = csv.DictReader(stream, strict=True)
        try:
            for row in reader:
                line = reader.line_num
                if None in row or any(v is None for v in row.values()):
                    yield BadLine(line, f"expected {len(reader.fieldnames or [])} columns")
                    continue
                yield Record(line, dict(row))
        except csv.Error as exc:
            yield BadLine(reader.line_num, f"malformed CSV: {exc}")
        return
    for number, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            yield BadLine(number, f"malformed JSON: {exc.msg} (column {exc.colno})")
            continue
        if not isinstance(value, dict):
            yield BadLine(number, f"expected a JSON object, got {type(value).__name__}")
            continue
        yield Record(number, value)


@contextmanager
def _open_input(path: str) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdin
        return
    with open(path, encoding="utf-8", newline="") as stream:
        yield stream


def _window(ctx: click.Context, param: click.Parameter, value: str | None) -> timedelta | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _format_of(path: str, fmt: str | None) -> Format:
    if fmt is not None:
        return "csv" if fmt == "csv" else "jsonl"
    return "csv" if path.lower().endswith(".csv") else "jsonl"


def _fail_invalid(problems: list[str], total_bad: int) -> None:
    for problem in problems[:_MAX_SHOWN]:
        click.echo(f"error: {problem}", err=True)
    if total_bad > _MAX_SHOWN:
        click.echo(f"error: ... and {total_bad - _MAX_SHOWN} more", err=True)
    click.echo(f"{total_bad} bad line(s): nothing was published", err=True)
    click.get_current_context().exit(EXIT_INVALID)


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option(
    "--to",
    "url",
    required=True,
    help="Backend url: local:///path/broker.db or a Service Bus connection string.",
)
@click.option("--entity", required=True, help="Queue or topic to publish to.")
@click.option(
    "--id",
    "id_template",
    required=True,
    help="Message id template over record fields, e.g. '{order_id}.{year}/payment'.",
)
@click.option("--partition-key", help="Partition key template.")
@click.option("--session-id", help="Session id template.")
@click.option("--body-field", help="Field holding the body (default: the whole record as JSON).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "csv"]),
    help="Input format (default: from the file extension, else jsonl).",
)
@click.option(
    "--chunk-size",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Messages handed to the sender per call.",
)
@click.option("--progress/--no-progress", default=True, help="Progress bar on stderr.")
@click.option(
    "--window",
    callback=_window,
    help="Declare the entity's duplicate-detection window (e.g. 10m) instead of reading it "
    "from the backend; with --partitioned / --sessions. For backends that cannot describe "
    "entities (the Service Bus emulator). A local broker creates a missing entity with it "
    "and refuses a differing one.",
)
@click.option("--partitioned", is_flag=True, help="With --window: the entity is partitioned.")
@click.option("--sessions", is_flag=True, help="With --window: the entity requires sessions.")
def publish(
    file: str,
    url: str,
    entity: str,
    id_template: str,
    partition_key: str | None,
    session_id: str | None,
    body_field: str | None,
    fmt: str | None,
    chunk_size: int,
    progress: bool,
    window: timedelta | None,
    partitioned: bool,
    sessions: bool,
) -> None:
    """Publish each record of FILE (JSON Lines or CSV) exactly once.

    The file is validated completely first; if any line is bad, nothing is sent.
    """
    try:
        spec = MessageSpec(
            id_template, body=body_field, partition_key=partition_key, session_id=session_id
        )
    except ValidationError as exc:
        option = _OPTION_OF.get(exc.field or "", "--id")
        raise click.BadParameter(str(exc), param_hint=option) from None
    fmt_ = _format_of(file, fmt)
    messages: list[Message] = []
    lines: list[int] = []
    problems: list[str] = []
    bad = 0
    first_seen: dict[object, tuple[int, bytes]] = {}
    try:
        with _open_input(file) as stream:
            for item in read_records(stream, fmt_):
                if isinstance(item, BadLine):
                    bad += 1
                    problems.append(str(item))
                    continue
                try:
                    message = spec.to_message(item.fields)
                except ValidationError as exc:
                    bad += 1
                    problems.append(f"line {item.line}: {exc}")
                    continue
                messages.append(message)
                lines.append(item.line)
    except UnicodeDecodeError as exc:
        bad += 1
        problems.append(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    if bad:
        _fail_invalid(problems, bad)

    try:
        target: EntityProfile | str = entity
        if window is not None:
            target = EntityProfile(
                entity,
                duplicate_detection_window=window,
                partitioned=partitioned,
                sessions=sessions,
            )
        elif partitioned or sessions:
            raise click.UsageError("--partitioned and --sessions declare a profile: add --window")
        sender = IdempotentSender(url, target)
    except SendOnceError as exc:
        raise click.ClickException(redact(str(exc))) from None
    with sender:
        # Check every message against the entity's rules before sending any.
        for message, line in zip(messages, lines, strict=True):
            try:
                sender.profile.check(message)
            except ValidationError as exc:
                bad += 1
                problems.append(f"line {line}: {exc}")
                continue
            key = sender.profile.dedup_key(message)
            earlier = first_seen.setdefault(key, (line, message.body_bytes))
            if earlier[1] != message.body_bytes:
                bad += 1
                problems.append(
                    f"line {line}: message id {message.message_id!r} was built on line "
                    f"{earlier[0]} too, with a different body"
                )
        if bad:
            _fail_invalid(problems, bad)
        report = _send(sender, messages, chunk_size=chunk_size, progress=progress)

    click.echo(
        f"{len(messages)} record(s) to {entity!r}: sent {report.sent}, "
        f"duplicates {report.duplicates}, failed {report.failed}"
    )
    if report.failures:
        line_of: dict[tuple[str, str | None], int] = {}
        for message, line in zip(messages, lines, strict=True):
            line_of.setdefault((message.message_id, message.partition_key), line)
        for failure in report.failures[:_MAX_SHOWN]:
            line = line_of.get((failure.message_id, failure.partition_key), 0)
            click.echo(
                f"failed: line {line}: {failure.message_id!r}: {redact(str(failure.error))}",
                err=True,
            )
        if report.failed > _MAX_SHOWN:
            click.echo(f"failed: ... and {report.failed - _MAX_SHOWN} more", err=True)
        if report.in_doubt:
            click.echo(
                f"{len(report.in_doubt)} message(s) are in doubt: run the same command again "
                "within the entity's duplicate-detection window to settle them",
                err=True,
            )
        click.get_current_context().exit(EXIT_FAILED)


def _send(
    sender: IdempotentSender, messages: list[Message], *, chunk_size: int, progress: bool
) -> SendReport:
    total = SendReport()
    with click.progressbar(
        length=len(messages),
        label="publishing",
        file=sys.stderr if progress else io.StringIO(),
    ) as bar:
        for start in range(0, len(messages), chunk_size):
            chunk = messages[start : start + chunk_size]
            try:
                report = sender.send_many(chunk)
            except SendOnceError as exc:
                # Not expected after validation; still, say exactly what was sent before it.
                click.echo(
                    f"\nstopped after {start} record(s) (sent {total.sent}, duplicates "
                    f"{total.duplicates}, failed {total.failed}): {redact(str(exc))}",
                    err=True,
                )
                click.get_current_context().exit(EXIT_FAILED)
            total.results.extend(report.results)
            total.failures.extend(report.failures)
            bar.update(len(chunk))
    return total
