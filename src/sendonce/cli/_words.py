"""What the command line says: durations, exit codes, and API errors in CLI terms.

The library's errors name Python parameters (``allow_empty=True``,
``profiles=...``); a shell user needs the option that does the same thing. The
translation lives here, in one place, so every command speaks the same way.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import click

from .._entity import EntityProfile
from ..errors import SendOnceError, ValidationError, redact

__all__ = [
    "CommandError",
    "InputError",
    "BROKER_EXIT_HELP",
    "EXIT_CODES_HELP",
    "PUBLISH_EXIT_HELP",
    "RERUN_HELP",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "cli_text",
    "command_error",
    "duration_option",
    "echo_json_error",
    "mark_reported",
    "reported_as_json",
    "format_duration",
    "parse_duration",
    "profile_difference",
    "json_errors",
    "window_error",
]

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

RERUN_HELP = (
    "A re-run of publish is exactly once until the duplicate-detection window of its first "
    "send ends (the time is printed), or for good with --ledger; without a ledger, records "
    "the broker has forgotten cannot be detected and are sent again."
)
PUBLISH_EXIT_HELP = (
    "Exit status: 0 done; 1 some records failed or the backend could not be reached "
    "(each reported); 2 invalid command line or input, nothing was sent; 130 interrupted "
    "(what was stored is printed). " + RERUN_HELP
)
EXIT_CODES_HELP = PUBLISH_EXIT_HELP
BROKER_EXIT_HELP = (
    "Exit status: 0 done; 1 the broker file could not be read or written; 2 invalid command "
    "line, file or entity, nothing was changed; 130 interrupted."
)

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(text: str) -> timedelta:
    """``"10m"``, ``"1h30m"``, ``"45s"``, ``"7d"``, or a plain number of seconds.

    Strict on purpose: each unit at most once, largest first, lowercase, no
    exponents (``10m10m``, ``1e3`` and ``10M`` are refused, not guessed at).
    """
    text = text.strip()
    if _SECONDS.fullmatch(text):
        return timedelta(seconds=float(text))
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(
            f"{text!r} is not a duration: use e.g. 45s, 10m, 1h30m, 7d or a number of seconds "
            "(units d, h, m, s, lowercase, each once, largest first)"
        )
    days, hours, minutes, seconds = match.groups()
    return timedelta(
        days=int(days or 0),
        hours=int(hours or 0),
        minutes=int(minutes or 0),
        seconds=float(seconds or 0),
    )


def format_duration(value: timedelta) -> str:
    """``timedelta(seconds=300)`` as ``5m``: the form the options take."""
    total = value.total_seconds()
    if total != int(total):
        return f"{total:g}s"
    rest = int(total)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


def duration_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> timedelta | None:
    """A click callback turning a duration option into a ``timedelta``."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


# Python spellings in library errors, and what the command line calls them.
_REPLACEMENTS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"pass an explicit profile, e\.g\. AzureServiceBusBackend\(.*?the entity was "
            r"created with"
        ),
        "declare its profile with --window (and --partitioned / --sessions), with the values "
        "the entity was created with, or with --no-dedup if it has no duplicate detection",
    ),
    (
        re.compile(
            r"recreate it with requires_duplicate_detection=True, or pass "
            r"require_duplicate_detection=False to accept at-least-once delivery\."
        ),
        "recreate it with duplicate detection (sendonce broker create without --no-dedup), or "
        "give --ledger: a ledger remembers every send, so a re-run sends only what is missing "
        "(see docs/ledger.md).",
    ),
    (
        re.compile(
            r"resolve it by hand \(Ledger\.confirm or Ledger\.release, see docs/ledger\.md\)"
        ),
        "resolve it (check the broker, then sendonce ledger confirm or release: see "
        "docs/ledger.md)",
    ),
    (re.compile(r"\(allow_empty=True accepts it\)"), "(--allow-empty accepts it)"),
    (
        re.compile(r"; shorten the fields or use overflow='hash'"),
        ": give --id a template that builds a shorter id (fewer or shorter fields)",
    ),
    (
        re.compile(r"body field ('[^']*') must hold bytes or str, got (\w+)"),
        r"--body-field \1 holds \2 values, not text: name a text field, or leave "
        "--body-field out to send the whole record as JSON",
    ),
    (
        re.compile(
            r"\(EntityProfile\(name, id_cache_size=(\d+)\); sendonce publish --id-cache-size \d+\)"
        ),
        r"(--id-cache-size \1)",
    ),
    (
        re.compile(
            r"pass an explicit profile, e\.g\. ArtemisBackend\(.*?with the address's id-cache-size"
        ),
        "declare it with --id-cache-size (the address's id-cache-size)",
    ),
    (re.compile(r"duplicate_detection_window"), "--window"),
    (re.compile(r"\bconnection_string\b"), "the connection string"),
    (
        re.compile(r"partition_key ('[^']*') must equal session_id ('[^']*')"),
        r"--partition-key gives \1 but --session-id gives \2: Service Bus requires them "
        "equal (leave --partition-key out: the session id is used)",
    ),
    (re.compile(r"use Ledger\(in_doubt='resend'\) to"), "give --in-doubt resend to"),
]
_TIMEDELTA = re.compile(r"datetime\.timedelta\(([^)]*)\)")
_CLOCK = re.compile(r"\b(?:(\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)\b")


def _timedelta_text(match: re.Match[str]) -> str:
    kwargs: dict[str, float] = {}
    for part in match.group(1).split(","):
        key, _, value = part.strip().partition("=")
        if key and value:
            try:
                kwargs[key] = float(value)
            except ValueError:
                return match.group(0)
    try:
        return format_duration(timedelta(**kwargs))
    except TypeError:
        return match.group(0)


def _clock_text(match: re.Match[str]) -> str:
    days, hours, minutes, seconds = match.groups()
    return format_duration(
        timedelta(
            days=int(days or 0), hours=int(hours), minutes=int(minutes), seconds=float(seconds)
        )
    )


def window_error(window: timedelta) -> str:
    """A window the broker cannot have, in the options' own units."""
    return f"{format_duration(window)} is outside the broker's range 20s to 7d"


def cli_text(error: BaseException | str) -> str:
    """An error's text in command-line terms, with every secret masked."""
    text = redact(str(error))
    text = _TIMEDELTA.sub(_timedelta_text, text)
    text = _CLOCK.sub(_clock_text, text)
    for pattern, replacement in _REPLACEMENTS:
        text = pattern.sub(replacement, text)
    return text


def _has(field: str, value: object) -> str:
    """What an existing entity has, in words: ``has no sessions``, ``has a 10m window``."""
    if field == "kind":
        return f"is a {value}"
    if field == "duplicate_detection":
        return "has duplicate detection on" if value else "has duplicate detection off"
    if field == "duplicate_detection_window":
        assert isinstance(value, timedelta)
        return f"has a {format_duration(value)} duplicate-detection window"
    if field == "partitioned":
        return "is partitioned" if value else "is not partitioned"
    if field == "sessions":
        return "requires sessions" if value else "has no sessions"
    if field == "id_cache_size":
        return f"remembers the last {value} ids" if value else "has a time window, no id cache"
    return "keeps its id cache across restarts" if value else "forgets its id cache on restart"


def _asked(field: str, value: object) -> str:
    """What the options ask for, as the options are written: ``--sessions``, ``no --topic``."""
    if field == "kind":
        return "--topic" if value == "topic" else "a queue (no --topic)"
    if field == "duplicate_detection":
        return "duplicate detection (no --no-dedup)" if value else "--no-dedup"
    if field == "duplicate_detection_window":
        assert isinstance(value, timedelta)
        return f"--window {format_duration(value)}"
    if field in ("partitioned", "sessions"):
        return f"--{field}" if value else f"no --{field}"
    if field == "id_cache_size":
        return f"--id-cache-size {value}" if value else "a time window (no --id-cache-size)"
    return "a persisted id cache (no --no-persist-id-cache)" if value else "--no-persist-id-cache"


_PROFILE_FIELDS = (
    "kind",
    "duplicate_detection",
    "duplicate_detection_window",
    "partitioned",
    "sessions",
    "id_cache_size",
    "persist_id_cache",
)


def profile_difference(existing: EntityProfile, wanted: EntityProfile) -> str | None:
    """How an existing entity differs from the one the options describe, in option terms."""
    for field in _PROFILE_FIELDS:
        have, want = getattr(existing, field), getattr(wanted, field)
        if field == "duplicate_detection_window" and (
            existing.count_bounded or not existing.duplicate_detection
        ):
            continue  # no time window to compare (duplicate_detection compared first)
        if have != want:
            return (
                f"entity {existing.name!r} {_has(field, have)}, but the options ask for "
                f"{_asked(field, want)}; the settings of an existing entity cannot change"
            )
    return None


class CommandError(click.ClickException):
    """A failure while working: exit status 1."""

    exit_code = EXIT_FAILED


class InputError(CommandError):
    """A refusal before anything was attempted (bad option, file or setup): exit status 2."""

    exit_code = EXIT_USAGE


def command_error(exc: SendOnceError) -> CommandError:
    """A library error as a CLI error: bad input or setup exits 2, the rest 1."""
    if isinstance(exc, ValidationError):
        return InputError(cli_text(exc))
    return CommandError(cli_text(exc))


def json_errors(command: F) -> F:
    """With ``--json``, a refusal or a Ctrl-C is reported as one JSON object too, so a
    script reading stdout always gets a report (the text still goes to stderr)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return command(*args, **kwargs)
        except click.ClickException as exc:
            if as_json and not reported_as_json(exc):
                echo_json_error("error", exc.exit_code, exc.format_message())
                mark_reported(exc)
            raise
        except KeyboardInterrupt:
            if as_json:
                echo_json_error("interrupted", EXIT_INTERRUPTED, "interrupted")
            click.echo("\ninterrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)

    return wrapper  # type: ignore[return-value]


def echo_json_error(status: str, code: int, error: str) -> None:
    """A refusal as the one JSON object every command prints with ``--json``."""
    report = {"status": status, "error": error, "exit_status": code}
    click.echo(json.dumps(report, ensure_ascii=False))


def mark_reported(exc: click.ClickException) -> None:
    """Note that ``exc`` was already printed as JSON (by the command): not again."""
    exc.sendonce_json_reported = True  # type: ignore[attr-defined]


def reported_as_json(exc: click.ClickException) -> bool:
    return bool(getattr(exc, "sendonce_json_reported", False))
