"""``sendonce ledger``: see what a send ledger holds, and take keys in doubt to zero.

A key in doubt is a send the ledger saw start and never saw confirmed, on an entity
whose rule (see :mod:`._doubt_rule`) lets no re-run settle it: nothing automatic can
tell whether it arrived. ``in-doubt`` lists them (with totals, a page at a time);
``reconcile`` compares them with what the broker shows and records what it proves;
``confirm`` (it arrived) and ``release`` (it did not: the next ``publish --ledger``
sends it) record a person's answer for the rest, from ``--id`` or a file. None of
them resolves a key whose producer may still be sending it, unless ``--force``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import click

from .._names import name_key
from ..errors import ValidationError, redact
from ..ledger import DEFAULT_RETENTION, Key, Ledger, Verdict
from ..ledger._inspect import (
    EntityCounts,
    Unconfirmed,
    ago,
    check_resolvable,
    count_unconfirmed,
    entity_counts,
    entity_names,
    resolve,
    unconfirmed,
)
from ..ledger._ledger import IN_FLIGHT_HORIZON
from ._doubt_rule import Rule, no_dedup_option
from ._ledger_broker import entity_rule, entity_rules, reconcile_broker
from ._ledger_keys import FROM_FORMATS, read_keys
from ._ledger_open import Mode, open_ledger
from ._rerun import utc_text
from ._words import (
    EXIT_USAGE,
    InputError,
    cli_text,
    duration_option,
    format_duration,
    json_errors,
)

__all__ = ["LEDGER_EXIT_HELP", "ledger"]

LEDGER_EXIT_HELP = (
    "Exit status: 0 done; 1 the ledger or the broker could not be reached, read or written "
    "(a server down, a file locked): try again; 2 invalid command line, ledger, entity or "
    "key, or a key refused: nothing was changed; 130 interrupted."
)
_CREATE_HINT = "sendonce ledger create makes one, publish --create-ledger too"
_MAX_SHOWN = 20

Resolution = Literal["sent", "release"]


def _open(text: str, mode: Mode) -> Any:
    return open_ledger(
        text, "LEDGER", mode=mode, create_hint=f"These commands never create one ({_CREATE_HINT})"
    )


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _shown(key: Key) -> str:
    return repr(key.message_id) + (
        f" (partition key {key.partition_key!r})" if key.partition_key else ""
    )


def _key_json(key: Key) -> dict[str, Any]:
    return {"message_id": key.message_id, "partition_key": key.partition_key or None}


def _echo_json(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, ensure_ascii=False))


def _check_entity(opened: Ledger, entity: str, *, empty_ok: bool = False) -> bool:
    """True when the ledger holds ``entity``. A ledger without any entity yet (a publish
    killed before it sent anything) is "nothing to do" with ``empty_ok`` (False returned);
    any other unknown name is refused (exit 2): a typo must not read as "nothing in doubt"."""
    known = entity_names(opened.store)
    if name_key(entity) in {name_key(name) for name in known}:
        return True
    if empty_ok and not known:
        return False
    listed = ", ".join(repr(n) for n in known) or "none"
    raise InputError(f"--entity: the ledger has no entity {entity!r} (it has {listed})")


@click.group(epilog=LEDGER_EXIT_HELP)
def ledger() -> None:
    """See what a send ledger holds; take its keys in doubt to zero.

    LEDGER is the ledger given to publish --ledger: a url (sqlite:///path/ledger.db,
    postgresql://...) or the path of a SQLite ledger file. --broker is the url given to
    publish --to.
    """


# -- create --------------------------------------------------------------------------------


@ledger.command(epilog=LEDGER_EXIT_HELP)
@click.argument("ledger_url", metavar="LEDGER")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
@json_errors
def create(ledger_url: str, as_json: bool) -> None:
    """Create an empty ledger: the decision to start one (publish --create-ledger takes it too)."""
    with open_ledger(
        ledger_url, "LEDGER", mode="create", create_hint="", created_by="sendonce ledger create"
    ) as opened:
        created, url = opened.created, opened.url
    where = url[len("sqlite://") :] if url.startswith("sqlite://") else None
    if as_json:
        _echo_json({"status": "ok", "created": created, "path": where, "exit_status": 0})
    elif not created:
        click.echo(f"the ledger exists already: {where or 'the database holds one'}")


# -- stats ---------------------------------------------------------------------------------


def _counts_json(
    counts: EntityCounts, retention: timedelta | None, rule: Rule | None
) -> dict[str, Any]:
    prunes = None if retention is None or counts.oldest is None else counts.oldest + retention
    data: dict[str, Any] = {
        "keys": counts.keys,
        "confirmed": counts.confirmed,
        "unconfirmed": counts.unconfirmed,
        "oldest_first_attempt": _iso(counts.oldest),
        "newest_first_attempt": _iso(counts.newest),
        "oldest_unconfirmed": _iso(counts.oldest_unconfirmed),
        "oldest_pruned_after": _iso(prunes),
    }
    if rule is not None:
        data["rule"] = rule.as_json()
    return data


@ledger.command(epilog=LEDGER_EXIT_HELP)
@click.argument("ledger_url", metavar="LEDGER")
@click.option("--entity", help="Only this entity (default: all).")
@click.option(
    "--broker",
    "broker_url",
    help="The broker (publish --to's url): says each entity's duplicate-detection rule.",
)
@click.option(
    "--retention",
    callback=duration_option,
    default=format_duration(DEFAULT_RETENTION),
    show_default=True,
    help="The retention the producers use: says when pruning removes the oldest keys.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
@json_errors
def stats(
    ledger_url: str,
    entity: str | None,
    broker_url: str | None,
    retention: timedelta | None,
    as_json: bool,
) -> None:
    """Keys per entity: confirmed, unconfirmed, their ages, and when pruning starts."""
    with _open(ledger_url, "read") as opened:
        counts = entity_counts(opened.store)
    if entity is not None:
        known = [c.entity for c in counts]
        counts = [c for c in counts if name_key(c.entity) == name_key(entity)]
        if not counts:
            listed = ", ".join(repr(n) for n in known) or "none"
            raise InputError(f"--entity: the ledger has no entity {entity!r} (it has {listed})")
    rules: dict[str, Rule] = {}
    if broker_url is not None:
        rules = entity_rules(broker_url, [c.entity for c in counts])
    if as_json:
        data = {c.entity: _counts_json(c, retention, rules.get(c.entity)) for c in counts}
        _echo_json({"status": "ok", "entities": data, "exit_status": 0})
        return
    if not counts:
        click.echo("no entities")
    for count in counts:
        rule = rules.get(count.entity, Rule(None))
        said = f" ({rule.words()})" if rule.kind is not None else ""
        click.echo(f"{count.entity}{said}")
        click.echo(
            f"  keys: {count.keys} (confirmed {count.confirmed}, unconfirmed {count.unconfirmed})"
        )
        if count.oldest is not None and count.newest is not None:
            click.echo(f"  first attempts: {utc_text(count.oldest)} to {utc_text(count.newest)}")
        if count.oldest_unconfirmed is not None:
            click.echo(
                f"  oldest unconfirmed: {utc_text(count.oldest_unconfirmed)}; an unconfirmed "
                f"key is {_meaning(rule)}: see `sendonce ledger in-doubt`"
            )
        if count.oldest is not None and retention is not None:
            click.echo(
                f"  pruning: keys are kept {format_duration(retention)}; the oldest may be "
                f"pruned after {utc_text(count.oldest + retention)}"
            )


def _meaning(rule: Rule) -> str:
    if rule.kind == "window" and rule.window is not None:
        return f"in doubt once {format_duration(rule.window)} have passed since its first attempt"
    if rule.kind in ("none", "id_cache"):
        return "in doubt at once (a re-run does not resend it)"
    return (
        "in doubt once the entity's duplicate-detection window has passed, at once if it has "
        "none or an id cache (--broker says which)"
    )


# -- in-doubt ------------------------------------------------------------------------------


def _rule_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "--broker",
                "broker_url",
                help="The broker (publish --to's url): its rule for the entity says which "
                "unconfirmed keys are in doubt.",
            ),
            click.option(
                "--window",
                callback=duration_option,
                help="Declare the entity's duplicate-detection window instead of --broker: "
                "only keys past it are in doubt.",
            ),
            no_dedup_option(
                "Declare that the entity has no duplicate detection (every unconfirmed key "
                "is in doubt) instead of --broker."
            ),
        ]
    ):
        command = option(command)
    return command


@ledger.command("in-doubt", epilog=LEDGER_EXIT_HELP)
@click.argument("ledger_url", metavar="LEDGER")
@click.option("--entity", required=True, help="Queue or topic name.")
@_rule_options
@click.option(
    "--limit",
    "--max",
    "limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Show at most this many keys, the oldest first.",
)
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Skip this many first.")
@click.option("--all", "show_all", is_flag=True, help="Show every key in doubt (no --limit).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (also for an error).")
@json_errors
def in_doubt(
    ledger_url: str,
    entity: str,
    broker_url: str | None,
    window: timedelta | None,
    no_dedup: bool,
    limit: int,
    offset: int,
    show_all: bool,
    as_json: bool,
) -> None:
    """Keys whose send was never confirmed and that no re-run settles: the total, a page of
    them (the oldest first), and what to do next."""
    rule = entity_rule(broker_url, entity, window, no_dedup)
    now = datetime.now(UTC)
    cutoff = rule.cutoff(now)
    with _open(ledger_url, "read") as opened:
        _check_entity(opened, entity, empty_ok=True)  # an empty ledger: nothing in doubt
        total = count_unconfirmed(opened.store, entity, before=cutoff)
        everything = total if cutoff is None else count_unconfirmed(opened.store, entity)
        rows = unconfirmed(
            opened.store, entity, limit=None if show_all else limit, offset=offset, before=cutoff
        )
    shown_to = offset + len(rows)
    more = max(0, total - shown_to)
    inside = everything - total  # unconfirmed, still inside the window: a re-run resends them
    if as_json:
        _echo_json(
            {
                "status": "ok",
                "entity": entity,
                "rule": rule.as_json(),
                "in_doubt": total,
                "inside_window": inside,
                "offset": offset,
                "shown": len(rows),
                "more": more,
                "keys": [_doubt_json(row, now) for row in rows],
                "exit_status": 0,
            }
        )
        return
    if rule.kind is None:
        what, said = "unconfirmed", "give --broker to leave out those a re-run settles"
    else:
        what, said = "in doubt", rule.words()
    if not total:
        click.echo(f"no keys {what} for {entity!r}")
    else:
        where = f"; showing {offset + 1} to {shown_to}" if rows else f"; none from {offset + 1}"
        click.echo(f"{total} key(s) {what} for {entity!r} ({said}){where}:")
    for row in rows:
        click.echo(_doubt_line(row, now))
    if more:
        click.echo(f"... and {more} more (--offset {shown_to} shows the next, --all every one)")
    if inside:
        click.echo(
            f"{inside} more unconfirmed key(s) are still inside the window: running the same "
            "publish again resends them (the broker drops a copy)"
        )
    if total:
        click.echo(f"Rule: {rule.meaning()}.", err=True)
        artemis = (broker_url or "").strip().lower().startswith(("amqp://", "amqps://"))
        compare = (
            "browse the address's queues for their ids (reconcile cannot read an Artemis broker "
            "yet), then"
            if artemis
            else f"`sendonce ledger reconcile {shlex.quote(redact(ledger_url))} --entity "
            f"{shlex.quote(entity)} --broker {_broker_shown(broker_url)}` compares them with the "
            "broker and records what it shows;"
        )
        click.echo(
            f"Next: {compare} `sendonce ledger confirm` (the broker has it) or `release` (it "
            "has not: the next publish --ledger sends it) the rest.",
            err=True,
        )


def _broker_shown(broker_url: str | None) -> str:
    """The --broker url as the user gave it, quoted; redacted (then it needs the user's
    own secret) or ``URL`` (publish --to's url) when none was given."""
    return shlex.quote(redact(broker_url)) if broker_url else "URL"


def _in_flight(row: Unconfirmed, now: datetime) -> bool:
    return now - row.first_attempt < IN_FLIGHT_HORIZON


def _doubt_json(row: Unconfirmed, now: datetime) -> dict[str, Any]:
    return {
        **_key_json(row.key),
        "first_attempt": row.first_attempt.isoformat(),
        "may_be_in_flight": _in_flight(row, now),
    }


def _doubt_line(row: Unconfirmed, now: datetime) -> str:
    line = (
        f"{_shown(row.key)}: first attempted {utc_text(row.first_attempt)} "
        f"({ago(now - row.first_attempt)} ago)"
    )
    if _in_flight(row, now):
        line += ", so recently that its producer may still be sending it"
    return line


# -- confirm and release -------------------------------------------------------------------


def _guard_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "--min-age",
                callback=duration_option,
                default=format_duration(IN_FLIGHT_HORIZON),
                show_default=True,
                help="Refuse a key written, or whose producer wrote to the ledger, less than "
                "this long ago: that producer may still be sending it. The default is the "
                "longest a send with the default retry policy takes.",
            ),
            click.option(
                "--force",
                is_flag=True,
                help="Resolve keys the --min-age guard refuses (you know their producer stopped).",
            ),
        ]
    ):
        command = option(command)
    return command


def _refuse(problems: list[str], advice: list[str], as_json: bool) -> None:
    """Every refused key named (the first few on stderr), what to do, nothing changed: exit 2.

    In JSON, ``errors`` lists exactly the refused keys and ``advice`` what to do about them,
    so a script can count and match them."""
    for problem in problems[:_MAX_SHOWN]:
        click.echo(f"Error: {problem}", err=True)
    if len(problems) > _MAX_SHOWN:
        click.echo(f"Error: ... and {len(problems) - _MAX_SHOWN} more refused key(s)", err=True)
    for line in advice:
        click.echo(line[:1].upper() + line[1:] + ".", err=True)
    click.echo("Nothing was changed.", err=True)
    if as_json:
        summary = f"{len(problems)} key(s) refused: {problems[0]}" + (
            f" (and {len(problems) - 1} more, listed in errors)" if len(problems) > 1 else ""
        )
        _echo_json(
            {
                "status": "error",
                "error": summary + "; nothing was changed",
                "errors": problems,
                "advice": advice,
                "exit_status": EXIT_USAGE,
            }
        )
    raise click.exceptions.Exit(EXIT_USAGE)


def _resolve_command(resolution: Resolution, help_text: str) -> click.Command:
    @click.command(
        "confirm" if resolution == "sent" else "release", help=help_text, epilog=LEDGER_EXIT_HELP
    )
    @click.argument("ledger_url", metavar="LEDGER")
    @click.option("--entity", required=True, help="Queue or topic name.")
    @click.option("--id", "message_ids", multiple=True, help="Message id (repeat).")
    @click.option(
        "--from",
        "source",
        metavar="FILE",
        help="Read the keys from FILE (- for stdin): one message id per line (a tab, then "
        "its partition key, if any), or JSON (what in-doubt --json prints; see --from-format).",
    )
    @click.option(
        "--from-format",
        type=click.Choice(FROM_FORMATS),
        default="auto",
        show_default=True,
        help="How --from is read: text (ids, one a line), json (in-doubt --json's object, a "
        'JSON array or JSON Lines), or auto: JSON when it starts with {, [ or ", else text.',
    )
    @click.option(
        "--partition-key",
        default="",
        help="The partition key of every key given without one, on a partitioned entity.",
    )
    @_guard_options
    @click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
    @json_errors
    def command(
        ledger_url: str,
        entity: str,
        message_ids: tuple[str, ...],
        source: str | None,
        from_format: str,
        partition_key: str,
        min_age: timedelta,
        force: bool,
        as_json: bool,
    ) -> None:
        keys = read_keys(message_ids, source, partition_key, from_format=from_format)
        with _open(ledger_url, "write") as opened:
            _check_entity(opened, entity)
            bound = timedelta(0) if force else min_age
            rows, refusals = check_resolvable(
                opened, entity, keys, min_age=bound, now=datetime.now(UTC)
            )
            if refusals:  # one pass: every refused key named, nothing changed
                problems = [f"key {_shown(r.key)} of {entity!r}: {r.text}" for r in refusals]
                advice = []
                if any(r.reason == "unknown" for r in refusals):
                    advice.append(
                        "check the ids (a key of a partitioned entity includes its partition "
                        "key: --partition-key, or a tab and the key in --from)"
                    )
                if any(r.reason in ("young", "live") for r in refusals):
                    advice.append(
                        f"wait until its producer is done (--min-age {format_duration(min_age)}),"
                        " or give --force if you know it stopped"
                    )
                _refuse(problems, advice, as_json)
            resolve(opened, entity, rows, keys, resolution)
        verb = "confirmed as sent" if resolution == "sent" else "released (the next run sends them)"
        if as_json:
            _echo_json(
                {
                    "status": "ok",
                    "entity": entity,
                    "resolution": resolution,
                    "count": len(keys),
                    "keys": [_key_json(k) for k in keys],
                    "exit_status": 0,
                }
            )
            return
        click.echo(f"{len(keys)} key(s) of {entity!r} {verb}: {_listed(keys)}")

    return command


def _listed(keys: Sequence[Key], most: int = _MAX_SHOWN) -> str:
    shown = ", ".join(_shown(k) for k in keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


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


# -- reconcile -----------------------------------------------------------------------------

_FINDING_TEXT = {
    "held": "held by the broker (it stores them: they were sent)",
    "remembered": "remembered by the broker (it remembers their ids: they were stored, and a "
    "consumer may have taken them since)",
    "not_stored": "never stored (the broker would remember them had they been)",
    "absent": "not in the broker (neither stored nor remembered: never sent, or taken by a "
    "consumer since; the broker cannot tell which)",
}


@ledger.command(epilog=LEDGER_EXIT_HELP)
@click.argument("ledger_url", metavar="LEDGER")
@click.option("--entity", required=True, help="Queue or topic name.")
@click.option("--broker", "broker_url", required=True, help="The broker: publish --to's url.")
@click.option(
    "--subscription",
    "subscriptions",
    multiple=True,
    help="Over AMQP, a topic's subscription to peek (repeat); a local broker reads them all.",
)
@click.option(
    "--apply",
    is_flag=True,
    help="Record what the broker proves: confirm the keys it holds or remembers, release "
    "those it never stored.",
)
@click.option(
    "--release-absent",
    is_flag=True,
    help="With --apply, also release the keys not in the broker (you know no consumer "
    "received them): the next publish --ledger sends them.",
)
@_guard_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (also for an error).")
@json_errors
def reconcile(
    ledger_url: str,
    entity: str,
    broker_url: str,
    subscriptions: tuple[str, ...],
    apply: bool,
    release_absent: bool,
    min_age: timedelta,
    force: bool,
    as_json: bool,
) -> None:
    """Compare the keys in doubt with what the broker shows, and (--apply) record it."""
    if release_absent and not apply:
        raise click.UsageError("--release-absent releases keys: give --apply too")
    with _open(ledger_url, "write" if apply else "read") as opened:
        _check_entity(opened, entity, empty_ok=True)  # an empty ledger: no keys to compare
        with _broker_refusals(), reconcile_broker(broker_url, entity, subscriptions) as broker:
            found = opened.reconcile(
                broker,
                entity,
                subscriptions=subscriptions,
                apply=apply,
                release_absent=release_absent,
                min_age=timedelta(0) if force else min_age,
            )
    rule = Rule(found.rule.kind, found.rule.window, found.rule.id_cache_size)
    verdicts = found.verdicts
    by: dict[str, list[Verdict]] = {f: [] for f in _FINDING_TEXT}
    for verdict in verdicts:
        by[verdict.finding].append(verdict)
    confirm, release, young = found.to_confirm, found.to_release, found.too_young
    left = found.left
    if as_json:
        data: dict[str, Any] = {
            "status": "ok",
            "entity": entity,
            "rule": rule.as_json(),
            "unconfirmed": len(verdicts),
            **{f: [_key_json(v.item.key) for v in by[f]] for f in _FINDING_TEXT},
            "too_young": [_key_json(key) for key in young],
            "cannot_tell": list(found.cannot_tell),
            "applied": apply,
            "confirmed": len(confirm) if apply else 0,
            "released": len(release) if apply else 0,
            "left": left,
            "exit_status": 0,
        }
        _echo_json(data)
        return
    if not verdicts:
        click.echo(f"no unconfirmed keys of {entity!r} ({rule.words()}): nothing to do")
        return
    click.echo(
        f"{len(verdicts)} unconfirmed key(s) of {entity!r} ({rule.words()}), compared with "
        "the broker:"
    )
    for finding, text in _FINDING_TEXT.items():
        if by[finding]:
            keys = [v.item.key for v in by[finding]]
            click.echo(f"  {len(keys)} {text}: {_listed(keys, 3)}")
    if young:
        click.echo(
            f"  {len(young)} too young to release: written less than "
            f"{format_duration(min_age)} ago, their producer may still be sending them "
            "(--force releases them anyway)"
        )
    for limit in found.cannot_tell:
        click.echo(f"note: {limit}", err=True)
    if apply:
        released = f"released {len(release)}" + (
            " (the next publish --ledger sends them)" if release else ""
        )
        click.echo(f"confirmed {len(confirm)} key(s), {released}; {left} left unconfirmed")
        return
    todo = []
    if confirm or by["not_stored"]:
        todo.append(
            "--apply confirms the keys the broker holds or remembers and releases those it "
            "never stored"
        )
    if by["absent"]:
        todo.append(
            "--apply --release-absent also releases those not in the broker, if you know no "
            "consumer received them (the next publish --ledger sends them)"
        )
    if todo:
        click.echo("Nothing was recorded: " + "; ".join(todo) + ".")


@contextmanager
def _broker_refusals() -> Iterator[None]:
    """The library's refusal of the broker or its subscriptions, said as ``--broker``'s."""
    try:
        yield
    except ValidationError as exc:
        if exc.field in ("broker", "subscriptions"):
            raise InputError(f"--{exc.field.rstrip('s')}: {cli_text(exc)}") from None
        raise
