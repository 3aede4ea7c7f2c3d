"""``sendonce relay`` and ``sendonce outbox``: run a relay on a transactional outbox, and
read what the outbox holds (pending, leased, published, dead rows; the lag).

The relay runs until SIGTERM or Ctrl-C: it stops claiming, lets the transfers in flight
finish (after ``--stop-timeout`` it interrupts them: their rows stay resendable), releases
its leases, prints what it did, and exits (0 after SIGTERM, 130 after Ctrl-C).
"""

from __future__ import annotations

import json
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import FrameType
from typing import Any

import click
import psycopg

from .._entity import EntityProfile
from ..errors import SendOnceError, ValidationError, redact
from ..ledger import Ledger
from ._doubt_rule import no_dedup_option
from ._ledger_open import open_ledger
from ._publish import _open_backend, _target, check_rule_options, declared_only
from ._words import (
    EXIT_INTERRUPTED,
    CommandError,
    InputError,
    cli_text,
    command_error,
    duration_option,
    format_duration,
    json_errors,
)

__all__ = ["outbox", "relay"]

OUTBOX_EXIT_HELP = (
    "Exit status: 0 done; 1 the outbox or the broker could not be reached; 2 invalid "
    "command line, outbox url, schema or entity, nothing was changed; 130 interrupted."
)


@contextmanager
def _outbox_errors(where: str) -> Iterator[None]:
    """Library and database errors as CLI errors naming ``where`` (no traceback)."""
    try:
        yield
    except ValidationError as exc:
        raise InputError(f"{where}: {cli_text(exc)}") from None
    except SendOnceError as exc:
        raise command_error(exc) from None
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if _MALFORMED.search(first):  # the url itself is wrong: trying again cannot help
            raise InputError(f"{where}: {redact(first)}") from None
        raise CommandError(f"{where}: {redact(first)}") from None


# libpq's words for a url it cannot parse (an unknown option, a bad port or sslmode value).
_MALFORMED = re.compile(r"invalid (URI|connection option|integer value|\w+ value|dsn)")


_LEDGER_HINT = (
    "sendonce relay creates one only with --create-ledger (or create it first with "
    "`sendonce ledger create`)"
)


@contextmanager
def _ledger(url: str | None, create: bool) -> Iterator[Ledger | None]:
    """The ledger ``--ledger`` names (a url or a ledger file's path, as everywhere), or None.

    A missing ledger is refused unless ``--create-ledger``: a typo must not start an empty
    ledger, through which an entity without duplicate detection would get copies."""
    if url is None:
        if create:
            raise click.UsageError("--create-ledger needs --ledger: the ledger to create")
        yield None
        return
    with open_ledger(
        url, "--ledger", mode="create" if create else "write", create_hint=_LEDGER_HINT
    ) as opened:
        yield opened


# Where a refusal raised while the relay starts points: the outbox's own errors name it,
# entity and ledger problems the entity, and everything else comes from the broker (--to).
_FIELD_OPTIONS = {
    "outbox": "--outbox",
    "entity": "--entity",
    "entities": "--entity",
    "ledger": "--entity",
    "duplicate_detection": "--entity",
}


@click.command(epilog=OUTBOX_EXIT_HELP)
@click.option("--outbox", "outbox_url", required=True, help="The outbox: postgresql://...")
@click.option(
    "--to",
    "to",
    required=True,
    help="Broker url: local:///path.db, Endpoint=sb://... or amqp://user:password@host:port",
)
@click.option(
    "--entity", "entities", required=True, multiple=True, help="Queue or topic (repeatable)."
)
@click.option(
    "--ledger",
    "ledger_url",
    help="A send ledger, its url or file path (needed without duplicate detection). It must "
    "exist, unless --create-ledger.",
)
@click.option(
    "--create-ledger",
    is_flag=True,
    help="Create the --ledger if it does not exist (said on stderr).",
)
@click.option(
    "--window",
    callback=duration_option,
    help="Declare each entity's duplicate-detection window (e.g. 10m) instead of reading it "
    "from the broker (the Service Bus emulator cannot describe entities); with "
    "--partitioned / --sessions. Where the broker cannot check it, the --ledger does not "
    "rely on it after a crash, as for publish.",
)
@no_dedup_option(
    "Declare that the entities have no duplicate detection (they store every copy) instead "
    "of reading it from the broker; needs --ledger."
)
@click.option(
    "--partitioned", is_flag=True, help="With --window or --no-dedup: the entities are partitioned."
)
@click.option(
    "--sessions", is_flag=True, help="With --window or --no-dedup: the entities require sessions."
)
@click.option(
    "--id-cache-size",
    type=click.IntRange(min=1),
    help="Declare each entity's Artemis id cache (the last N ids per address) instead of "
    "reading it: for an amqp:// address that does not exist yet or whose management the "
    "user may not read.",
)
@click.option(
    "--lease", callback=duration_option, default="30s", show_default=True, help="Claim lease."
)
@click.option(
    "--poll",
    callback=duration_option,
    default="5s",
    show_default=True,
    help="Longest wait between claims when no NOTIFY comes.",
)
@click.option(
    "--retention",
    callback=duration_option,
    default="1h",
    show_default=True,
    help="Keep published rows this long (0s: delete them at once).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="Keys (and rows without a key) claimed per round; up to 100 rows of each key.",
)
@click.option(
    "--stop-timeout",
    callback=duration_option,
    default="10s",
    show_default=True,
    help="After SIGTERM/Ctrl-C, interrupt transfers still running after this long.",
)
@click.option("--drain", is_flag=True, help="Publish what is there, then exit (no waiting).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@json_errors
def relay(
    outbox_url: str,
    to: str,
    entities: tuple[str, ...],
    ledger_url: str | None,
    create_ledger: bool,
    window: timedelta | None,
    no_dedup: bool,
    partitioned: bool,
    sessions: bool,
    id_cache_size: int | None,
    lease: timedelta,
    poll: timedelta,
    retention: timedelta,
    batch_size: int,
    stop_timeout: timedelta,
    drain: bool,
    as_json: bool,
) -> None:
    """Publish a transactional outbox's rows to a broker, exactly once, in commit order per
    key. Run as many relays on one outbox as you like."""
    from ..outbox import Relay

    if lease.total_seconds() <= 0 or poll.total_seconds() <= 0:
        raise click.BadParameter("must be above 0", param_hint="--lease/--poll")
    check_rule_options(to, window, no_dedup, id_cache_size, partitioned, sessions)
    backend = _open_backend(to)
    try:
        with _ledger(ledger_url, create_ledger) as ledger, _outbox_errors("--outbox"):
            targets: list[EntityProfile | str] = [
                _target(backend, name, window, partitioned, sessions, id_cache_size, no_dedup)
                for name in entities
            ]
            if ledger is not None and any(declared_only(backend, t) for t in targets):
                ledger.trust_window = False  # a declared window is the user's word alone
            try:
                worker = Relay(
                    outbox_url,
                    backend,
                    targets,
                    ledger=ledger,
                    lease=lease,
                    poll_interval=poll.total_seconds(),
                    retention=retention,
                    batch_size=batch_size,
                )
            except ValidationError as exc:
                where = _FIELD_OPTIONS.get(exc.field or "", "--to")
                raise InputError(f"{where}: {cli_text(exc)}") from None
            with worker:
                interrupted = _run(worker, drain, stop_timeout)
    finally:
        backend.close()
    totals = worker.totals
    summary = {
        "status": "interrupted" if interrupted else "ok",
        "published": totals.published,
        "dead": totals.dead,
        "dead_reasons": totals.dead_reasons,
        "rounds": totals.rounds,
        "exit_status": EXIT_INTERRUPTED if interrupted else 0,
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(totals.dead_reasons.items()))
        click.echo(
            f"published {totals.published}, moved aside {totals.dead}"
            + (f" ({reasons}; see `sendonce outbox dead`)" if reasons else "")
        )
    if interrupted:
        raise click.exceptions.Exit(EXIT_INTERRUPTED)


def _run(worker: Any, drain: bool, stop_timeout: timedelta) -> bool:
    """Run until done or signalled; True when stopped by Ctrl-C (exit 130)."""
    signalled: list[int] = []

    def interrupt_later() -> None:
        if not finished.wait(stop_timeout.total_seconds()):
            # Transfers still running: interrupt them (their rows stay resendable). A real
            # signal, not _thread.interrupt_main(): that one only sets a flag, which a main
            # thread blocked waiting for a broker's answer (Artemis) sees after its timeout.
            signal.pthread_kill(main, signal.SIGINT)

    finished = threading.Event()
    main = threading.main_thread().ident or 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signalled:  # a second signal: stop now
            raise KeyboardInterrupt
        signalled.append(signum)
        worker.stop()
        threading.Thread(target=interrupt_later, daemon=True).start()

    previous = {
        sig: signal.signal(sig, on_signal)
        for sig in (signal.SIGTERM, signal.SIGINT)
        if threading.current_thread() is threading.main_thread()
    }
    try:
        if drain:
            worker.drain()
        else:
            worker.run()
    except KeyboardInterrupt:
        signalled.append(signal.SIGINT)
    finally:
        finished.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return bool(signalled) and signalled[0] == signal.SIGINT


@click.group(epilog=OUTBOX_EXIT_HELP)
def outbox() -> None:
    """Read what a transactional outbox holds; put rows moved aside back.

    OUTBOX is the outbox's url, postgresql://user@host/db.
    """


def _entity_json(row: Any) -> dict[str, Any]:
    return {
        "pending": row.pending,
        "leased": row.leased,
        "published": row.published,
        "dead": row.dead,
        "lag_seconds": row.lag,
        "last_published": None if row.last_published is None else row.last_published.isoformat(),
    }


@outbox.command()
@click.argument("outbox_url", metavar="OUTBOX")
@click.option("--entity", help="Only this entity (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
@json_errors
def stats(outbox_url: str, entity: str | None, as_json: bool) -> None:
    """Rows per entity: pending, leased, published (within the retention), dead; the lag."""
    from .. import outbox as api
    from .._names import name_key

    with _outbox_errors("OUTBOX"):
        rows = api.stats(outbox_url)
    if entity is not None:
        known = [r.entity for r in rows]
        rows = [r for r in rows if r.entity == name_key(entity)]
        if not rows:  # a typo must not read as "nothing pending" (as `ledger stats`: exit 2)
            listed = ", ".join(repr(n) for n in known) or "none"
            raise InputError(f"--entity: the outbox has no rows of {entity!r} (it has {listed})")
    if as_json:
        entities = {r.entity: _entity_json(r) for r in rows}
        click.echo(json.dumps({"status": "ok", "entities": entities, "exit_status": 0}))
        return
    if not rows:
        click.echo("no rows")
    for row in rows:
        lag = "none pending" if row.lag is None else f"{format_duration(_whole(row.lag))} behind"
        click.echo(
            f"{row.entity}: {row.pending} pending, {row.leased} leased, {row.published} "
            f"published, {row.dead} dead; {lag}"
        )


def _whole(seconds: float) -> timedelta:
    return timedelta(seconds=round(seconds, 1))


@outbox.command()
@click.argument("outbox_url", metavar="OUTBOX")
@click.option("--entity", help="Only this entity (default: all).")
@click.option(
    "--max",
    "limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="List at most this many rows, the oldest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
@json_errors
def dead(outbox_url: str, entity: str | None, limit: int, as_json: bool) -> None:
    """Rows moved aside because they can never be sent, with their reason."""
    from .. import outbox as api

    with _outbox_errors("OUTBOX"):
        rows = api.dead_rows(outbox_url, entity=entity, limit=limit)
    if as_json:
        listed = [
            {
                "entity": row.entity,
                "message_id": row.message_id,
                "partition_key": row.partition_key,
                "session_id": row.session_id,
                "reason": row.reason,
                "error": row.error,
                "dead_at": row.dead_at.isoformat(),
                "attempts": row.attempts,
            }
            for row in rows
        ]
        report = {"status": "ok", "count": len(listed), "rows": listed, "exit_status": 0}
        click.echo(json.dumps(report, ensure_ascii=False))
        return
    for row in rows:
        click.echo(f"{row.entity} {row.message_id!r}: {row.reason}: {row.error}")
    if not rows:
        click.echo("no dead rows")


@outbox.command()
@click.argument("outbox_url", metavar="OUTBOX")
@click.option("--entity", required=True, help="Queue or topic name.")
@click.option("--id", "message_ids", multiple=True, help="Message id (repeatable).")
@click.option("--all", "everything", is_flag=True, help="Every dead row of the entity.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
@json_errors
def requeue(
    outbox_url: str, entity: str, message_ids: tuple[str, ...], everything: bool, as_json: bool
) -> None:
    """Put dead rows back at the end of their keys' queues (once their cause is fixed)."""
    from .. import outbox as api

    if bool(message_ids) == everything:
        raise click.UsageError("give --id (repeatable) or --all")
    with _outbox_errors("OUTBOX"):
        done = api.requeue(outbox_url, entity, None if everything else list(message_ids))
    missing = sorted(set(message_ids) - set(done))
    if as_json:
        report = {
            "status": "ok",
            "entity": entity,
            "requeued": done,
            "not_dead": missing,
            "exit_status": 0,
        }
        click.echo(json.dumps(report, ensure_ascii=False))
    else:
        click.echo(f"requeued {len(done)} row(s) of {entity!r}")
        for mid in missing:
            click.echo(f"note: {mid!r} is not a dead row of {entity!r}", err=True)


@outbox.command()
@click.argument("outbox_url", metavar="OUTBOX")
def install(outbox_url: str) -> None:
    """Create the outbox tables (or migrate them to this sendonce's schema)."""
    from .. import outbox as api

    with _outbox_errors("OUTBOX"):
        found = api.install(outbox_url)
    if found == api.SCHEMA_VERSION:
        click.echo(f"outbox schema version {found}: up to date")
    else:
        click.echo(f"outbox schema version {api.SCHEMA_VERSION} installed (was {found or 'none'})")
