"""``sendonce publish``: publish a JSON Lines or CSV file, each record exactly once.

Two passes over the file, so memory stays bounded whatever its size. The
validation pass reads every record, builds its message and keeps a few numbers
per record (line, size, hashes of its id and body); then every message is
checked against the entity's rules and two records that build one id with
different bodies are refused. Any problem is reported with its line number and
nothing is published (exit 2). The sending pass reads the file again and sends
it in chunks, accounting for every record (sent, duplicate, or failed with its
error; exit 1 if any failed). Running the same file again is safe while the
broker remembers the first run's ids (its duplicate-detection window), or for
good with ``--ledger`` (see :mod:`._rerun`). Standard input is spooled to a
temporary file so it can be read twice.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from itertools import pairwise
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

import click

from .._entity import EntityProfile
from .._message import Message, MessageSpec
from .._retry import RetryPolicy
from .._sender import IdempotentSender, SendReport
from ..backends import Backend, connect
from ..backends._url import LOCAL_SCHEME, local_path
from ..errors import InDoubtError, KeyRuleError, SendOnceError, ValidationError, redact
from ..ledger import Ledger
from ._files import check_writable, os_errors
from ._records import BadLine, Header, Reading, Record, format_of, open_input, read_records
from ._rerun import RerunPromise
from ._words import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PUBLISH_EXIT_HELP,
    CommandError,
    InputError,
    cli_text,
    command_error,
    duration_option,
    format_duration,
    profile_difference,
    window_error,
)

__all__ = ["Record", "publish", "read_records"]

_MAX_SHOWN = 20
_SHARED_LINES_SHOWN = 5
_PROGRESS_EVERY = 1000
_LOW = (1 << 32) - 1
_OPTION_OF = {
    "message_id": "--id",
    "partition_key": "--partition-key",
    "session_id": "--session-id",
    "body": "--body-field",
    "template": "--id",
}

retry_logger = logging.getLogger("sendonce.retry")


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
            if len(self.without_session) < _MAX_SHOWN:
                self.without_session.append(line)

    def problem(self, text: str) -> None:
        self.bad += 1
        if len(self.problems) < _MAX_SHOWN:
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


@dataclass
class Outcome:
    """What the sending pass accounted for."""

    records: int = 0
    sent: int = 0
    duplicates: int = 0
    from_ledger: int = 0
    """Records not sent because the ledger says an earlier run sent them (in ``duplicates``)."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    in_doubt: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return len(self.failures)

    @property
    def stored(self) -> int:
        return self.sent + self.duplicates

    def add(self, report: SendReport, chunk: list[tuple[Message, int]]) -> None:
        self.records += len(chunk)
        self.sent += report.sent
        self.duplicates += report.duplicates
        self.from_ledger += len(report.from_ledger)
        if not report.failures:
            return
        line_of: dict[tuple[str, str | None], int] = {}
        for message, line in chunk:
            line_of.setdefault((message.message_id, message.partition_key), line)
        for failure in report.failures:
            in_doubt = isinstance(failure.error, InDoubtError)
            self.failures.append(
                {
                    "line": line_of.get((failure.message_id, failure.partition_key)),
                    "message_id": failure.message_id,
                    "error": cli_text(failure.error),
                    "in_doubt": in_doubt,
                }
            )
            if in_doubt:
                self.in_doubt.append(failure.message_id)


@contextmanager
def _source(path: str) -> Iterator[str]:
    """A path that can be read twice: the file itself, or standard input spooled to disk."""
    if path != "-":
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="sendonce-stdin-") as tmp:
        spooled = os.path.join(tmp, "stdin")
        with open(spooled, "wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out)
        yield spooled


def _progress(label: str, length: int, shown: bool) -> Any:
    return click.progressbar(
        length=length, label=label, file=sys.stderr if shown else io.StringIO()
    )


def _validate(
    path: str, source: Source, spec: MessageSpec, progress: bool, profile: EntityProfile
) -> Facts:
    """Pass 1: every record parsed, built and checked against the entity's rules, every
    problem found in this one pass; nothing kept but :class:`Facts`."""
    facts = Facts()
    header = Header()
    reading = source.reading
    with open(path, "rb") as raw, _progress("validating", os.path.getsize(path), progress) as bar:
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


def _chunks(
    path: str, source: Source, spec: MessageSpec, size: int
) -> Iterator[list[tuple[Message, int]]]:
    """Pass 2: the messages again, ``size`` at a time, each with its line."""
    chunk: list[tuple[Message, int]] = []
    reading = source.reading
    with open(path, "rb") as raw, open_input(raw, reading.encoding) as stream:
        for item in read_records(stream, reading):
            if isinstance(item, BadLine):
                raise CommandError(f"{path} changed while publishing: {item}")
            try:
                chunk.append((spec.to_message(item.fields), item.line))
            except ValidationError as exc:
                raise CommandError(
                    f"{path} changed while publishing: line {item.line}: {cli_text(exc)}"
                ) from None
            if len(chunk) >= size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _without_create(url: str) -> str:
    """A local url that opens an existing broker only: a typo must not start a new one."""
    if not url.strip().startswith(LOCAL_SCHEME):
        return url
    _, query = local_path(url.strip())
    if "create" in query:
        return url
    return url.strip() + ("&" if "?" in url else "?") + "create=false"


def _open_backend(url: str) -> Backend:
    if url.strip().startswith(LOCAL_SCHEME):
        try:
            path, _ = local_path(url.strip())
        except ValidationError as exc:
            raise InputError(f"--to: {cli_text(exc)}") from None
        if not os.path.exists(path):
            raise InputError(
                f"--to: there is no broker file {path!r}. sendonce publish never creates one (a "
                "typo must not start an empty broker): create it with `sendonce broker create "
                f"{path} --entity NAME`"
            )
        check_writable(path, "--to: broker file")
    try:
        with os_errors("--to: broker file"):
            return connect(_without_create(url))
    except ModuleNotFoundError as exc:
        raise InputError(_install_hint(exc)) from None
    except ValidationError as exc:
        raise InputError(f"--to: {cli_text(exc)}") from None
    except SendOnceError as exc:
        raise command_error(exc) from None


def _install_hint(exc: ModuleNotFoundError) -> str:
    name = (exc.name or "").split(".")[0]
    extra = {"azure": "azure", "pyspark": "spark", "uamqp": "azure"}.get(name, "azure")
    return f"this backend needs the {name or 'missing'!s} package: pip install 'sendonce[{extra}]'"


def _target(
    backend: Backend,
    entity: str,
    window: timedelta | None,
    partitioned: bool,
    sessions: bool,
) -> EntityProfile | str:
    """The entity to send to: its name, or the profile ``--window`` declares.

    On a local broker a missing entity is named with the existing ones (a typo is plain
    to see), or, with ``--window``, created; the creation is said on stderr.
    """
    entities = getattr(backend, "entities", None)
    known = None if entities is None else {p.name: p for p in entities()}
    if window is None:
        if partitioned or sessions:
            raise click.UsageError("--partitioned and --sessions declare a profile: add --window")
        if known is not None and entity not in known:
            listed = ", ".join(repr(n) for n in known) or "none yet"
            raise InputError(
                f"--entity: entity {entity!r} does not exist in the broker (it has {listed}); "
                "create it with `sendonce broker create`, or give --window to create it here"
            )
        return entity
    try:
        profile = EntityProfile(
            entity, duplicate_detection_window=window, partitioned=partitioned, sessions=sessions
        )
    except ValidationError as exc:
        text = window_error(window) if exc.field == "duplicate_detection_window" else None
        raise click.BadParameter(text or cli_text(exc), param_hint="--window") from None
    if known is not None:
        existing = known.get(entity)
        if existing is not None:
            difference = profile_difference(existing, profile)
            if difference is not None:
                raise InputError(difference + "; nothing was sent")
        else:
            shape = ", partitioned" * partitioned + ", sessions" * sessions
            click.echo(
                f"note: entity {entity!r} does not exist: creating it as a queue with a "
                f"{format_duration(window)} window{shape} (--window)",
                err=True,
            )
    return profile


def _warn_without_subscriptions(backend: Backend, profile: EntityProfile) -> None:
    subscriptions = getattr(backend, "subscriptions", None)
    if profile.kind != "topic" or subscriptions is None:
        return
    if not subscriptions(profile.name):
        click.echo(
            f"warning: topic {profile.name!r} has no subscriptions: its messages are kept "
            "nowhere, yet their ids are remembered, so publishing them again after adding a "
            "subscription would drop them as duplicates (within the window). Add subscriptions "
            "first: sendonce broker create FILE --entity "
            f"{profile.name} --topic --subscription NAME --exist-ok",
            err=True,
        )


class _RetryEcho(logging.Handler):
    """Prints each retry on stderr, so a slow or unreachable broker is never silent."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"\n{record.getMessage()}", err=True)


@contextmanager
def _retry_progress() -> Iterator[None]:
    handler = _RetryEcho(logging.INFO)
    level, propagate = retry_logger.level, retry_logger.propagate
    retry_logger.addHandler(handler)
    retry_logger.setLevel(logging.INFO)
    retry_logger.propagate = False  # shown once, here, whatever --log-level says
    try:
        yield
    finally:
        retry_logger.removeHandler(handler)
        retry_logger.setLevel(level)
        retry_logger.propagate = propagate


def _send(
    sender: IdempotentSender,
    path: str,
    source: Source,
    spec: MessageSpec,
    *,
    total: int,
    chunk_size: int,
    progress: bool,
    promise: RerunPromise,
    report: _Report,
) -> Outcome:
    """Pass 2; on Ctrl-C, say what is stored and how long a re-run stays safe."""
    outcome = Outcome()
    with _progress("publishing", total, progress) as bar, _retry_progress():
        try:
            for chunk in _chunks(path, source, spec, chunk_size):
                promise.started()
                sent = sender.send_many([m for m, _ in chunk])
                outcome.add(sent, chunk)
                bar.update(len(chunk))
        except KeyboardInterrupt:
            click.echo(
                f"\ninterrupted: {outcome.stored} of {total} record(s) are stored (sent "
                f"{outcome.sent}, duplicates {outcome.duplicates}, failed {outcome.failed}); "
                "records being sent at that moment may or may not be. " + promise.text(),
                err=True,
            )
            report.finish(outcome, total, status="interrupted", code=EXIT_INTERRUPTED)
        except CommandError as exc:  # the file changed between the two passes
            click.echo(
                f"\nstopped after {outcome.records} record(s) (sent {outcome.sent}, duplicates "
                f"{outcome.duplicates}, failed {outcome.failed}): {exc.message}. " + promise.text(),
                err=True,
            )
            report.finish(outcome, total, status="stopped", code=EXIT_FAILED, error=exc.message)
        except SendOnceError as exc:
            # Not expected after validation; still, say exactly what was sent before it.
            click.echo(
                f"\nstopped after {outcome.records} record(s) (sent {outcome.sent}, duplicates "
                f"{outcome.duplicates}, failed {outcome.failed}): {cli_text(exc)}. "
                + promise.text(),
                err=True,
            )
            report.finish(outcome, total, status="stopped", code=EXIT_FAILED, error=cli_text(exc))
    return outcome


def _fail_invalid(facts: Facts, as_json: bool) -> NoReturn:
    errors = facts.errors()
    for error in errors:
        click.echo(f"error: {error}", err=True)
    for note in facts.notes:
        click.echo(f"note: {note}", err=True)
    if facts.unshown() > 0:
        click.echo(f"error: ... and {facts.unshown()} more", err=True)
    click.echo(f"{facts.bad} bad line(s): nothing was published", err=True)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "status": "invalid",
                    "bad_lines": facts.bad,
                    "errors": errors,
                    "sent": 0,
                    "exit_status": EXIT_USAGE,
                }
            )
        )
    sys.exit(EXIT_USAGE)


def _retry_policy(timeout: timedelta | None, attempts: int | None) -> RetryPolicy:
    options: dict[str, Any] = {}
    if timeout is not None:
        options["attempt_timeout"] = timeout.total_seconds()
    if attempts is not None:
        options["max_attempts"] = attempts
    try:
        return RetryPolicy(**options)
    except ValidationError as exc:
        if exc.field == "attempt_timeout":
            raise click.BadParameter(
                "the time limit of an attempt must be more than 0s, e.g. 30s",
                param_hint="--timeout",
            ) from None
        option = "--attempts" if exc.field == "max_attempts" else "--timeout"
        raise click.BadParameter(cli_text(exc), param_hint=option) from None


def _spec(
    id_template: str,
    body_field: str | None,
    partition_key: str | None,
    session_id: str | None,
    allow_empty: bool,
) -> MessageSpec:
    try:
        return MessageSpec(
            id_template,
            body=body_field,
            partition_key=partition_key,
            session_id=session_id,
            allow_empty=allow_empty,
        )
    except ValidationError as exc:
        option = _OPTION_OF.get(exc.field or "", "--id")
        text = cli_text(exc)
        if exc.field and text.startswith(f"{exc.field}: "):  # the Python name: the option says it
            text = text[len(exc.field) + 2 :]
        raise click.BadParameter(text, param_hint=option) from None


@click.command(epilog=PUBLISH_EXIT_HELP)
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
    "--allow-empty",
    is_flag=True,
    help="Accept empty values in id fields (by default an empty cell is missing data).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "csv"]),
    help="Input format (default: from the file extension, else jsonl).",
)
@click.option(
    "--encoding",
    default="utf-8",
    show_default=True,
    help="Text encoding of FILE, e.g. cp1252 (a Windows spreadsheet export) or utf-16. A "
    "UTF-8 byte-order mark is skipped.",
)
@click.option(
    "--delimiter",
    help="CSV: the character between values, e.g. ';' or tab (default ',').",
)
@click.option(
    "--strip",
    is_flag=True,
    help="CSV: remove spaces around values and column names (by default ' 77 ' is kept as "
    "it is, so it builds another id than '77').",
)
@click.option(
    "--chunk-size",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Records read, built and handed to the sender at a time.",
)
@click.option("--progress/--no-progress", default=True, help="Progress bars on stderr.")
@click.option(
    "--window",
    callback=duration_option,
    help="Declare the entity's duplicate-detection window (e.g. 10m) instead of reading it "
    "from the backend; with --partitioned / --sessions. For backends that cannot describe "
    "entities (the Service Bus emulator). A local broker creates a missing entity with it "
    "and refuses a differing one.",
)
@click.option("--partitioned", is_flag=True, help="With --window: the entity is partitioned.")
@click.option("--sessions", is_flag=True, help="With --window: the entity requires sessions.")
@click.option(
    "--timeout",
    callback=duration_option,
    help="Time limit of each send attempt, e.g. 30s (default 30s).",
)
@click.option(
    "--attempts",
    type=click.IntRange(min=1),
    help="Attempts per transfer before giving up (default 5).",
)
@click.option(
    "--ledger",
    "ledger_url",
    help="Record every send in this ledger (sqlite:///path/ledger.db or postgresql://...) "
    "so that a re-run sends only what is missing even after the broker's window; the file "
    "is created if missing.",
)
@click.option(
    "--in-doubt",
    type=click.Choice(["error", "resend"]),
    help="With --ledger: what to do with a record whose earlier send was never confirmed "
    "and whose window has passed: report it and send nothing (error, the default) or send "
    "it again (resend: at-least-once, it may be delivered twice).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the report as one JSON object, on every exit (also Ctrl-C).",
)
def publish(
    file: str,
    url: str,
    entity: str,
    id_template: str,
    partition_key: str | None,
    session_id: str | None,
    body_field: str | None,
    allow_empty: bool,
    fmt: str | None,
    encoding: str,
    delimiter: str | None,
    strip: bool,
    chunk_size: int,
    progress: bool,
    window: timedelta | None,
    partitioned: bool,
    sessions: bool,
    timeout: timedelta | None,
    attempts: int | None,
    ledger_url: str | None,
    in_doubt: str | None,
    as_json: bool,
) -> None:
    """Publish each record of FILE (JSON Lines or CSV) exactly once.

    The file is validated completely first; if any line is bad, nothing is sent.
    A re-run of the same command sends only what is missing: until the broker's
    duplicate-detection window of the first send ends (the time is printed), or
    for good with --ledger. Without a ledger, records the broker has forgotten
    cannot be detected and would be sent again.
    """
    ending = _Ending()
    with _json_on_error(entity, as_json, ending):
        if in_doubt is not None and ledger_url is None:
            raise click.UsageError(
                "--in-doubt needs --ledger: only a ledger knows what is in doubt"
            )
        spec = _spec(id_template, body_field, partition_key, session_id, allow_empty)
        retry = _retry_policy(timeout, attempts)
        source = _source_options(file, fmt, encoding, delimiter, strip)
        with (
            _source(file) as path,
            _open_ledger(ledger_url, in_doubt) as ledger,
            _opened(url) as backend,
        ):
            # One validation pass needs the entity's rules: the backend is opened first.
            target = _target(backend, entity, window, partitioned, sessions)
            try:
                # The validation pass already refused one id with two bodies across the whole
                # file; the sender's own memory of ids then only needs to span a few chunks.
                sender = IdempotentSender(
                    backend,
                    target,
                    retry=retry,
                    memory_size=max(4 * chunk_size, 10_000),
                    ledger=ledger,
                )
            except SendOnceError as exc:
                raise command_error(exc) from None
            with sender:
                _check_options(sender.profile, session_id)
                source = source.fitted(sender.profile)
                try:
                    facts = _validate(path, source, spec, progress, sender.profile)
                except KeyboardInterrupt:
                    _interrupted_before_sending("validating", entity, as_json)
                if facts.bad:
                    _fail_invalid(facts, as_json)
                for note in facts.notes:
                    click.echo(f"note: {note}", err=True)
                _warn_without_subscriptions(backend, sender.profile)
                promise = RerunPromise(sender.profile, ledger_url, retry.safety_margin)
                report = _Report(entity, as_json, promise)
                outcome = _send(
                    sender,
                    path,
                    source,
                    spec,
                    total=len(facts.lines),
                    chunk_size=chunk_size,
                    progress=progress and not as_json,
                    promise=promise,
                    report=report,
                )
                # Every record is accounted for: an interruption from here on (closing
                # the connection) still ends with this report.
                ending.report = lambda: report.finish(outcome, len(facts.lines))
        report.finish(outcome, len(facts.lines))


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


def _source_options(
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


@dataclass
class _Ending:
    """How a Ctrl-C outside the sending pass ends: before sending, nothing was sent; once
    every record is accounted for, with the run's report."""

    report: Callable[[], NoReturn] | None = None


@contextmanager
def _json_on_error(entity: str, as_json: bool, ending: _Ending) -> Iterator[None]:
    """With ``--json``, a refusal is a report too: scripts get one object on every exit."""
    try:
        yield
    except KeyboardInterrupt:
        if ending.report is not None:
            ending.report()
        _interrupted_before_sending("connecting", entity, as_json)
    except click.ClickException as exc:
        if as_json:
            report = {
                "status": "error",
                "entity": entity,
                "error": exc.format_message(),
                "sent": 0,
                "exit_status": exc.exit_code,
            }
            click.echo(json.dumps(report, ensure_ascii=False))
        raise


def _check_options(profile: EntityProfile, session_id: str | None) -> None:
    """What the options ask that the entity cannot honour, refused before reading the file."""
    if session_id is not None and not profile.sessions:
        raise InputError(
            f"--session-id: entity {profile.name!r} has no sessions, so the broker would "
            "ignore the session ids; leave --session-id out (or create the entity with "
            "--sessions)"
        )


def _interrupted_before_sending(stage: str, entity: str, as_json: bool) -> NoReturn:
    click.echo(f"\ninterrupted while {stage}: nothing was sent", err=True)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "status": "interrupted",
                    "entity": entity,
                    "sent": 0,
                    "stage": stage,
                    "exit_status": EXIT_INTERRUPTED,
                },
                ensure_ascii=False,
            )
        )
    sys.exit(EXIT_INTERRUPTED)


@contextmanager
def _opened(url: str) -> Iterator[Backend]:
    backend = _open_backend(url)
    try:
        yield backend
    finally:
        backend.close()


@contextmanager
def _open_ledger(url: str | None, in_doubt: str | None) -> Iterator[Ledger | None]:
    """The ledger ``--ledger`` names, or ``None``; a bad url or file is a CLI error naming it."""
    if url is None:
        yield None
        return
    if url.strip().startswith("sqlite:"):
        path = unquote(urlsplit(url.strip()).path)
        if path:
            check_writable(path, "--ledger: ledger file")
    try:
        ledger = Ledger(url, in_doubt="resend" if in_doubt == "resend" else "error")
    except ModuleNotFoundError as exc:
        raise InputError(f"--ledger: {_install_hint(exc)}") from None
    except ValidationError as exc:
        raise InputError(f"--ledger: {cli_text(exc)}") from None
    except SendOnceError as exc:
        raise InputError(f"--ledger {redact(url)}: {cli_text(exc)}") from None
    except OSError as exc:
        where = exc.filename if exc.filename else redact(url)
        raise InputError(
            f"--ledger: cannot open {where}: {exc.strerror or exc}. Check that its directory "
            "exists and that you may write there"
        ) from None
    with ledger:
        yield ledger


class _Report:
    """The end of every run that got as far as sending: the summary, then the exit status.

    Printed on every exit (done, failed, stopped, Ctrl-C), as text or with ``--json``
    as one object, so a script always gets a report.
    """

    def __init__(self, entity: str, as_json: bool, promise: RerunPromise) -> None:
        self.entity = entity
        self.as_json = as_json
        self.promise = promise

    def finish(
        self,
        outcome: Outcome,
        total: int,
        *,
        status: str | None = None,
        code: int | None = None,
        error: str | None = None,
    ) -> NoReturn:
        if code is None:
            code = EXIT_FAILED if outcome.failures else 0
        if status is None:
            status = "failed" if code else "ok"
        if self.as_json:
            data: dict[str, Any] = {
                "status": status,
                "entity": self.entity,
                "records": total,
                "sent": outcome.sent,
                "duplicates": outcome.duplicates,
                "from_ledger": outcome.from_ledger,
                "failed": outcome.failed,
                "in_doubt": outcome.in_doubt,
                "failures": outcome.failures,
            }
            if error is not None:
                data["error"] = error
            if status == "interrupted":
                data["unaccounted"] = total - outcome.records
            data.update(self.promise.as_json())
            data["exit_status"] = code
            click.echo(json.dumps(data, ensure_ascii=False))
        elif status in ("ok", "failed"):
            from_ledger = (
                f" ({outcome.from_ledger} skipped: the ledger says an earlier run sent them)"
                if outcome.from_ledger
                else ""
            )
            click.echo(
                f"{total} record(s) to {self.entity!r}: sent {outcome.sent}, "
                f"duplicates {outcome.duplicates}{from_ledger}, failed {outcome.failed}"
            )
        self._failures(outcome)
        sys.exit(code)

    def _failures(self, outcome: Outcome) -> None:
        for failure in outcome.failures[:_MAX_SHOWN]:
            click.echo(
                f"failed: line {failure['line']}: {failure['message_id']!r}: {failure['error']}",
                err=True,
            )
        if outcome.failed > _MAX_SHOWN:
            click.echo(f"failed: ... and {outcome.failed - _MAX_SHOWN} more", err=True)
        if outcome.in_doubt:
            click.echo(self._in_doubt_advice(len(outcome.in_doubt)), err=True)
        elif outcome.failures and not outcome.stored:
            click.echo("Nothing was stored: running the same command again is safe.", err=True)
        elif outcome.failures:
            click.echo("The failed records were not stored. " + self.promise.text(), err=True)

    def _in_doubt_advice(self, count: int) -> str:
        promise = self.promise
        if promise.ledger is None:
            return f"{count} message(s) are in doubt. " + promise.text()
        return (
            f"{count} message(s) are in doubt: the ledger holds a send of each that was never "
            "confirmed. Inside the duplicate-detection window of that send, running the same "
            "command again settles them; after it, check whether the broker has them, then "
            f"`sendonce ledger confirm {redact(promise.ledger)} --entity {self.entity} --id ID` "
            "(it has) or `sendonce ledger release ...` (it has not: the next run sends it), or "
            "give --in-doubt resend (at-least-once: it may be delivered twice). "
            f"`sendonce ledger in-doubt {redact(promise.ledger)} --entity {self.entity}` lists "
            "them."
        )
