"""``sendonce ledger``: see what a send ledger holds, and resolve a key in doubt by hand.

A key in doubt is a send the ledger saw start and never saw confirmed, after the
broker's window: nothing automatic can tell whether it arrived. The operator
looks at the broker, then says so here (``confirm``: it arrived; ``release``: it
did not, the next ``publish --ledger`` sends it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import click

from ..errors import SendOnceError, ValidationError, redact
from ..ledger import DEFAULT_RETENTION, Key, Ledger
from ..ledger._inspect import EntityCounts, entity_counts, resolve, unconfirmed
from ._files import os_errors, writable_problem
from ._rerun import utc_text
from ._snapshot import snapshot
from ._words import (
    EXIT_USAGE,
    InputError,
    cli_text,
    command_error,
    duration_option,
    format_duration,
    json_errors,
)

__all__ = ["ledger"]

LEDGER_EXIT_HELP = (
    "Exit status: 0 done; 1 the ledger could not be read or written; 2 invalid command "
    "line, ledger or key, nothing was changed; 130 interrupted."
)
_MARGIN = timedelta(seconds=5)  # RetryPolicy's default safety margin: the ledger's cut-off


def _ledger_url(text: str) -> str:
    """A ledger url, or the path of a SQLite ledger file; an existing ledger only."""
    text = text.strip()
    if text.startswith(("postgresql://", "postgres://")):
        return text
    if text.startswith("sqlite:"):
        path = unquote(urlsplit(text).path)
        url = text
    else:
        path, url = text, "sqlite://" + os.path.abspath(text)
    if path and not os.path.exists(path):
        raise InputError(
            f"LEDGER: there is no ledger file {os.path.abspath(path)!r} (these commands never "
            "create one; publish --ledger does)"
        )
    if os.path.isdir(path):
        raise InputError(f"LEDGER: {os.path.abspath(path)!r} is a directory, not a ledger file")
    return url


@contextmanager
def _open(text: str, *, reading_only: bool = False) -> Iterator[Ledger]:
    """Open the ledger LEDGER names; one the user may not write is read from a snapshot."""
    url = _ledger_url(text)
    with ExitStack() as stack:
        if url.startswith("sqlite:"):
            path = os.path.abspath(unquote(urlsplit(url).path))
            problem = writable_problem(path, "LEDGER: ledger file", reading_only=reading_only)
            if problem is not None and not (reading_only and os.access(path, os.R_OK)):
                raise InputError(problem)
            if problem is not None:
                url = "sqlite://" + stack.enter_context(snapshot(path, "LEDGER: ledger file"))
                click.echo(
                    f"note: you may not write {path} or beside it: showing a snapshot of it "
                    "taken now",
                    err=True,
                )
        with _opened(url) as ledger:
            yield ledger


@contextmanager
def _opened(url: str) -> Iterator[Ledger]:
    try:
        with os_errors("LEDGER: ledger file"), Ledger(url) as ledger:
            yield ledger
    except ModuleNotFoundError as exc:
        name = (exc.name or "").split(".")[0]
        raise InputError(
            f"LEDGER: this store needs the {name} package: pip install 'sendonce[postgres]'"
        ) from None
    except ValidationError as exc:
        raise InputError(f"LEDGER {redact(url)}: {cli_text(exc)}") from None
    except SendOnceError as exc:
        raise command_error(exc) from None


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


@click.group(epilog=LEDGER_EXIT_HELP)
def ledger() -> None:
    """See what a send ledger holds; resolve keys in doubt by hand.

    LEDGER is the url given to publish --ledger (sqlite:///path/ledger.db,
    postgresql://...) or the path of a SQLite ledger file.
    """


def _counts_json(counts: EntityCounts, retention: timedelta | None) -> dict[str, Any]:
    prunes = None if retention is None or counts.oldest is None else counts.oldest + retention
    return {
        "keys": counts.keys,
        "confirmed": counts.confirmed,
        "unconfirmed": counts.unconfirmed,
        "oldest_first_attempt": _iso(counts.oldest),
        "newest_first_attempt": _iso(counts.newest),
        "oldest_unconfirmed": _iso(counts.oldest_unconfirmed),
        "oldest_pruned_after": _iso(prunes),
    }


@ledger.command()
@click.argument("ledger_url", metavar="LEDGER")
@click.option("--entity", help="Only this entity (default: all).")
@click.option(
    "--retention",
    callback=duration_option,
    default=format_duration(DEFAULT_RETENTION),
    show_default=True,
    help="The retention the producers use: says when pruning removes the oldest keys.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
@json_errors
def stats(ledger_url: str, entity: str | None, retention: timedelta | None, as_json: bool) -> None:
    """Keys per entity: confirmed, unconfirmed, their ages, and when pruning starts."""
    with _open(ledger_url, reading_only=True) as opened:
        counts = entity_counts(opened.store)
    if entity is not None:
        known = [c.entity for c in counts]
        counts = [c for c in counts if c.entity == entity]
        if not counts:
            listed = ", ".join(repr(n) for n in known) or "none"
            raise InputError(f"--entity: the ledger has no entity {entity!r} (it has {listed})")
    if as_json:
        click.echo(json.dumps({c.entity: _counts_json(c, retention) for c in counts}, indent=2))
        return
    if not counts:
        click.echo("no entities")
    for count in counts:
        click.echo(f"{count.entity}")
        click.echo(
            f"  keys: {count.keys} (confirmed {count.confirmed}, unconfirmed {count.unconfirmed})"
        )
        if count.oldest is not None and count.newest is not None:
            click.echo(f"  first attempts: {utc_text(count.oldest)} to {utc_text(count.newest)}")
        if count.oldest_unconfirmed is not None:
            click.echo(
                f"  oldest unconfirmed: {utc_text(count.oldest_unconfirmed)} (in doubt once the "
                "entity's window has passed since then: see `sendonce ledger in-doubt`)"
            )
        if count.oldest is not None and retention is not None:
            click.echo(
                f"  pruning: keys are kept {format_duration(retention)}; the oldest may be "
                f"pruned after {utc_text(count.oldest + retention)}"
            )


@ledger.command("in-doubt")
@click.argument("ledger_url", metavar="LEDGER")
@click.option("--entity", required=True, help="Queue or topic name.")
@click.option(
    "--window",
    callback=duration_option,
    help="The entity's duplicate-detection window: only keys past it are listed (default: "
    "every unconfirmed key, each with its first attempt).",
)
@click.option(
    "--max",
    "max_keys",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many keys, the oldest first.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object per key (or for an error)."
)
@json_errors
def in_doubt(
    ledger_url: str, entity: str, window: timedelta | None, max_keys: int, as_json: bool
) -> None:
    """Keys whose send was never confirmed: check the broker, then confirm or release each."""
    with _open(ledger_url, reading_only=True) as opened:
        rows = unconfirmed(opened.store, entity, limit=max_keys)
        known = [] if rows else [c.entity for c in entity_counts(opened.store)]
    if not rows and entity not in known:
        listed = ", ".join(repr(n) for n in known) or "none"
        raise InputError(f"--entity: the ledger has no entity {entity!r} (it has {listed})")
    now = datetime.now(UTC)
    shown = 0
    for row in rows:
        resendable_until = None if window is None else row.first_attempt + window - _MARGIN
        if resendable_until is not None and now < resendable_until:
            continue  # still inside the window: a re-run settles it by itself
        shown += 1
        if as_json:
            data = {
                "message_id": row.key.message_id,
                "partition_key": row.key.partition_key or None,
                "first_attempt": row.first_attempt.isoformat(),
            }
            click.echo(json.dumps(data, ensure_ascii=False))
        else:
            partition = f" (partition key {row.key.partition_key!r})" * bool(row.key.partition_key)
            click.echo(
                f"{row.key.message_id!r}{partition}: first attempted "
                f"{utc_text(row.first_attempt)}, never confirmed"
            )
    if not as_json and not shown:
        click.echo(f"no unconfirmed keys for {entity!r}" + (" past the window" if window else ""))
    if not as_json and shown:
        click.echo(
            "For each: if the broker has it, `sendonce ledger confirm`; if not, `sendonce "
            "ledger release` (the next publish --ledger sends it).",
            err=True,
        )


def _resolve_command(resolution: Literal["sent", "release"], help_text: str) -> click.Command:
    @click.command("confirm" if resolution == "sent" else "release", help=help_text)
    @click.argument("ledger_url", metavar="LEDGER")
    @click.option("--entity", required=True, help="Queue or topic name.")
    @click.option("--id", "message_ids", required=True, multiple=True, help="Message id (repeat).")
    @click.option(
        "--partition-key",
        default="",
        help="The partition key, on a partitioned entity (the ledger's key includes it).",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
    @json_errors
    def command(
        ledger_url: str,
        entity: str,
        message_ids: tuple[str, ...],
        partition_key: str,
        as_json: bool,
    ) -> None:
        keys = [Key(mid, partition_key) for mid in message_ids]
        with _open(ledger_url) as opened:
            problems = _unresolvable(opened, entity, keys)
            if problems:  # one pass: every bad id named, nothing changed
                for problem in problems:
                    click.echo(f"error: {problem}", err=True)
                if as_json:
                    click.echo(
                        json.dumps(
                            {"status": "invalid", "errors": problems, "exit_status": EXIT_USAGE}
                        )
                    )
                raise click.exceptions.Exit(EXIT_USAGE)
            for key in keys:
                resolve(opened, entity, key, resolution)
        verb = "confirmed as sent" if resolution == "sent" else "released (the next run sends it)"
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "status": "ok",
                        "entity": entity,
                        "resolution": resolution,
                        "message_ids": list(message_ids),
                        "exit_status": 0,
                    }
                )
            )
        else:
            for mid in message_ids:
                click.echo(f"{mid!r} of {entity!r}: {verb}")

    return command


def _unresolvable(opened: Ledger, entity: str, keys: list[Key]) -> list[str]:
    rows = opened.store.lookup(entity, keys)
    problems = []
    for key in keys:
        row = rows.get(key)
        shown = repr(key.message_id) + (
            f" (partition key {key.partition_key!r})" if key.partition_key else ""
        )
        if row is None:
            problems.append(
                f"--id {shown}: the ledger has no such key for {entity!r} (on a partitioned "
                "entity give --partition-key too)"
            )
        elif row.confirmed_at is not None:
            problems.append(
                f"--id {shown}: already confirmed ({row.outcome} at "
                f"{utc_text(row.confirmed_at)}): nothing to resolve"
            )
    return problems


ledger.add_command(
    _resolve_command(
        "sent",
        "Record that the broker has these messages: the ledger confirms them as sent, so "
        "no run sends them again.",
    )
)
ledger.add_command(
    _resolve_command(
        "release",
        "Record that the broker does not have these messages: their unconfirmed intents are "
        "dropped, so the next publish --ledger sends them.",
    )
)
