"""``sendonce publish``: publish a JSON Lines or CSV file, each record exactly once.

Two passes over the file, so memory stays bounded whatever its size: the
validation pass (:mod:`._validation`) finds every problem before anything is
sent; the sending pass here reads the file again and sends it in chunks,
accounting for every record (sent, duplicate, or failed with its error; exit 1
if any failed), and ends with the report (:mod:`._report`). Running the same
file again is safe while the broker remembers the first run's ids (its
duplicate-detection window), or for good with ``--ledger`` (see :mod:`._rerun`).
Standard input is spooled to a temporary file so it can be read twice.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import click

from .._entity import EntityProfile
from .._message import Message, MessageSpec
from .._names import name_key
from .._retry import RetryPolicy
from .._sender import IdempotentSender
from ..backends import Backend, connect
from ..backends._base import reports_duplicates
from ..backends._url import LOCAL_SCHEME, is_connection_string, local_path
from ..errors import SendOnceError, ValidationError, redact
from ..ledger import InDoubtPolicy, Ledger
from ._doubt_rule import check_declared, no_dedup_option
from ._files import check_writable, os_errors
from ._ledger_open import Mode, ledger_url, open_ledger, sqlite_path
from ._records import BadLine, Record, open_input, read_records
from ._report import Outcome, Report, unreachable_broker
from ._rerun import RerunPromise
from ._validation import Source, fail_invalid, progress_bar, source_options, validate
from ._words import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    PUBLISH_EXIT_HELP,
    CommandError,
    InputError,
    cli_text,
    command_error,
    duration_option,
    format_duration,
    mark_reported,
    profile_difference,
    window_error,
)

__all__ = ["Record", "publish", "read_records"]

_OPTION_OF = {
    "message_id": "--id",
    "partition_key": "--partition-key",
    "session_id": "--session-id",
    "body": "--body-field",
    "template": "--id",
}

retry_logger = logging.getLogger("sendonce.retry")


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
    extra = {
        "azure": "azure",
        "pyspark": "spark",
        "uamqp": "azure",
        "proton": "artemis",
        "cproton": "artemis",
    }.get(name, "azure")
    return f"this backend needs the {name or 'missing'!s} package: pip install 'sendonce[{extra}]'"


def check_rule_options(
    url: str,
    window: timedelta | None,
    no_dedup: bool,
    id_cache_size: int | None,
    partitioned: bool,
    sessions: bool,
) -> None:
    """The declared rule's options, checked before anything is opened (exit 2)."""
    check_declared(window, no_dedup, id_cache_size)
    if id_cache_size is not None:
        if window is not None or partitioned or sessions:
            raise click.UsageError(
                "--id-cache-size declares an Artemis-style id cache: it does not go with "
                "--window, --partitioned or --sessions"
            )
        if is_connection_string(url.strip()):
            raise click.BadParameter(
                "an Artemis address's id cache; a Service Bus entity remembers ids for a time "
                "window: declare it with --window (or --no-dedup if it has no duplicate "
                "detection)",
                param_hint="--id-cache-size",
            )
    if window is None and not no_dedup and (partitioned or sessions):
        raise click.UsageError(
            "--partitioned and --sessions declare a profile: add --window (or --no-dedup)"
        )


def _target(
    backend: Backend,
    entity: str,
    window: timedelta | None,
    partitioned: bool,
    sessions: bool,
    id_cache_size: int | None = None,
    no_dedup: bool = False,
) -> EntityProfile | str:
    """The entity to send to: its name, or the profile ``--window`` / ``--no-dedup`` (or,
    for an Artemis style id cache, ``--id-cache-size``) declares.

    On a local broker a missing entity is named with the existing ones (a typo is plain
    to see), or, with a declared rule, created; the creation is said on stderr. Names
    compare as the broker does, ignoring case: ``ORDERS`` is the existing ``orders``.
    """
    entities = getattr(backend, "entities", None)
    known = None if entities is None else {name_key(p.name): p for p in entities()}
    existing = None if known is None else known.get(name_key(entity))
    name = entity if existing is None else existing.name
    if id_cache_size is not None:
        declared = EntityProfile(name, id_cache_size=id_cache_size)
        if existing is not None:
            difference = profile_difference(existing, declared)
            if difference is not None:
                raise InputError(difference + "; nothing was sent")
        return declared
    if window is None and not no_dedup:
        if known is not None and existing is None:
            listed = ", ".join(repr(p.name) for p in known.values()) or "none yet"
            raise InputError(
                f"--entity: entity {entity!r} does not exist in the broker (it has {listed}); "
                "create it with `sendonce broker create`, or give --window (or --no-dedup) to "
                "create it here"
            )
        return name
    try:
        profile = EntityProfile(
            name,
            duplicate_detection=not no_dedup,
            duplicate_detection_window=timedelta(minutes=10) if window is None else window,
            partitioned=partitioned,
            sessions=sessions,
        )
    except ValidationError as exc:
        in_window = exc.field == "duplicate_detection_window" and window is not None
        text = window_error(window) if in_window and window is not None else None
        raise click.BadParameter(text or cli_text(exc), param_hint="--window") from None
    if existing is not None:
        difference = profile_difference(existing, profile)
        if difference is not None:
            raise InputError(difference + "; nothing was sent")
    elif known is not None:
        shape = ", partitioned" * partitioned + ", sessions" * sessions
        rule, option = (
            ("no duplicate detection", "--no-dedup")
            if window is None
            else (f"a {format_duration(window)} window", "--window")
        )
        click.echo(
            f"note: entity {entity!r} does not exist: creating it as a queue with {rule}"
            f"{shape} ({option})",
            err=True,
        )
    return profile


def declared_only(backend: Backend, target: EntityProfile | str) -> bool:
    """Whether ``target``'s rule is the user's word alone: declared, and the broker cannot
    check it (a local broker compares a declared rule with the entity it has, or creates
    the entity with it). A ledger then trusts no declared window (see docs/ledger.md)."""
    return isinstance(target, EntityProfile) and getattr(backend, "entities", None) is None


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
    report: Report,
) -> Outcome:
    """Pass 2; on Ctrl-C, say what is stored and how long a re-run stays safe."""
    outcome = Outcome()
    with progress_bar("publishing", total, progress) as bar, _retry_progress():
        try:
            for chunk in _chunks(path, source, spec, chunk_size):
                promise.started()
                sent = sender.send_many([m for m, _ in chunk])
                unreachable = unreachable_broker(sent)
                if unreachable is not None:  # said once, not once per record; no more tries
                    click.echo(
                        f"\nstopped after {outcome.records} record(s) (sent {outcome.sent}, "
                        f"duplicates {outcome.duplicates}): {unreachable}; the remaining "
                        f"{total - outcome.records} record(s) were not sent. " + promise.text(),
                        err=True,
                    )
                    report.finish(
                        outcome, total, status="stopped", code=EXIT_FAILED, error=unreachable
                    )
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
    help="Backend url: local:///path/broker.db, a Service Bus connection string or an "
    "Artemis url amqp://user:password@host:5672.",
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
    "and refuses a differing one; elsewhere nothing checks it, so a --ledger does not rely "
    "on it after a crash (an unconfirmed record is in doubt, not resent).",
)
@no_dedup_option(
    "Declare that the entity has no duplicate detection (it stores every copy) instead of "
    "reading it from the backend; needs --ledger. With --partitioned / --sessions."
)
@click.option(
    "--partitioned", is_flag=True, help="With --window or --no-dedup: the entity is partitioned."
)
@click.option(
    "--sessions", is_flag=True, help="With --window or --no-dedup: the entity requires sessions."
)
@click.option(
    "--id-cache-size",
    type=click.IntRange(min=1),
    help="Declare the entity's Artemis-style id cache (the last N ids per address) instead "
    "of reading it from the broker: for an amqp:// broker whose address does not exist yet "
    "(the first send creates it) or whose management the user may not read. Not for "
    "Service Bus (a time window: --window).",
)
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
    help="Record every send in this ledger (sqlite:///path/ledger.db, the path of a ledger "
    "file, or postgresql://...) so that a re-run sends only what is missing even after the "
    "broker's window. It must exist, unless --create-ledger.",
)
@click.option(
    "--create-ledger",
    is_flag=True,
    help="Create the --ledger if it does not exist (said on stderr); refused where the entity "
    "already holds messages (the new ledger would know none of them), unless --accept-held.",
)
@click.option(
    "--accept-held",
    is_flag=True,
    help="With --create-ledger: create the ledger even though the entity already holds "
    "messages; records among them may be stored again (at once without duplicate "
    "detection, once the broker has forgotten their ids otherwise).",
)
@click.option(
    "--in-doubt",
    type=click.Choice(["error", "resend"]),
    help="With --ledger: what to do with a record whose earlier send was never confirmed "
    "and that a re-run cannot settle (past the entity's window; at once without one): "
    "report it and send nothing (error, the default) or send it again (resend: "
    "at-least-once, it may be delivered twice).",
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
    no_dedup: bool,
    partitioned: bool,
    sessions: bool,
    id_cache_size: int | None,
    timeout: timedelta | None,
    attempts: int | None,
    ledger_url: str | None,
    create_ledger: bool,
    accept_held: bool,
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
        if create_ledger and ledger_url is None:
            raise click.UsageError("--create-ledger needs --ledger: the ledger to create")
        if accept_held and not create_ledger:
            raise click.UsageError(
                "--accept-held goes with --create-ledger: it accepts a new ledger for an entity "
                "that already holds messages"
            )
        check_rule_options(url, window, no_dedup, id_cache_size, partitioned, sessions)
        spec = _spec(id_template, body_field, partition_key, session_id, allow_empty)
        retry = _retry_policy(timeout, attempts)
        source = source_options(file, fmt, encoding, delimiter, strip)
        with _source(file) as path, _opened(url) as backend, ExitStack() as stack:
            # One validation pass needs the entity's rules: the backend is opened first.
            target = _target(
                backend, entity, window, partitioned, sessions, id_cache_size, no_dedup
            )
            ledger = None
            if ledger_url is not None:
                ledger = stack.enter_context(
                    _open_ledger(ledger_url, in_doubt, create_ledger, accept_held, backend, target)
                )
                ledger.trust_window = not declared_only(backend, target)
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
                    facts = validate(path, source, spec, progress, sender.profile)
                except KeyboardInterrupt:
                    _interrupted_before_sending("validating", entity, as_json)
                if facts.bad:
                    fail_invalid(facts, as_json)
                for note in facts.notes:
                    click.echo(f"note: {note}", err=True)
                _warn_without_subscriptions(backend, sender.profile)
                promise = RerunPromise(sender.profile, ledger_url, retry.safety_margin)
                promise.window_trusted = ledger is None or ledger.trust_window
                report = Report(entity, as_json, promise, url, reports_duplicates(backend))
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
            mark_reported(exc)
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


_LEDGER_HINT = "sendonce publish creates one only with --create-ledger"


@contextmanager
def _open_ledger(
    url: str,
    in_doubt: str | None,
    create: bool,
    accept_held: bool,
    backend: Backend,
    target: EntityProfile | str,
) -> Iterator[Ledger]:
    """The ledger ``--ledger`` names; a missing one only with ``--create-ledger``, and not for
    an entity that already holds messages unless ``--accept-held``."""
    policy: InDoubtPolicy = "resend" if in_doubt == "resend" else "error"
    mode: Mode = "write"
    if create:
        try:
            with open_ledger(url, "--ledger", mode="write", create_hint=_LEDGER_HINT):
                pass
        except InputError as exc:
            if "there is no ledger" not in exc.message:
                raise
            if not accept_held:
                _check_new_ledger(url, backend, target)
            mode = "create"
    with open_ledger(url, "--ledger", mode=mode, create_hint=_LEDGER_HINT, in_doubt=policy) as led:
        yield led


def _check_new_ledger(url: str, backend: Backend, target: EntityProfile | str) -> None:
    """A new, empty ledger knows nothing of what the entity holds: whatever the entity's
    rule, refuse to start one for an entity that already holds messages (where the backend
    can count them) unless the user says it knows (``--accept-held``)."""
    stats = getattr(backend, "stats", None)
    if stats is None:
        return
    profile = target if isinstance(target, EntityProfile) else backend.describe(target)
    entities = getattr(backend, "entities", None)
    if entities is not None and name_key(profile.name) not in {
        name_key(p.name) for p in entities()
    }:
        return  # declared, to be created: it holds nothing yet
    held = int(stats(profile.name)["messages"])
    if not held:
        return
    if not profile.duplicate_detection:
        cost = "it has no duplicate detection, so every record among them would be stored again"
    elif profile.id_cache_size is not None:
        cost = (
            "a record among them would be stored again once the broker's id cache (the last "
            f"{profile.id_cache_size} ids) has dropped its id"
        )
    else:
        cost = (
            "a record among them would be stored again once the broker has forgotten its id "
            f"(its {format_duration(profile.duplicate_detection_window)} duplicate-detection "
            "window after its send)"
        )
    full = ledger_url(url, "--ledger")
    where = sqlite_path(full) or redact(full)
    raise InputError(
        f"--create-ledger: there is no ledger {where}, and a new one would know nothing of "
        f"the {held} message(s) entity {profile.name!r} already holds: {cost}. Check the "
        "--ledger path; if a new ledger is what you mean, give --accept-held too (or create "
        f"it first with `sendonce ledger create {shlex.quote(where)}`). Nothing was sent"
    )
