"""``sendonce broker``: create and inspect a local broker file from the shell."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any

import click

from .._entity import DEFAULT_LOCK_DURATION, EntityProfile
from .._subscription import SubscriptionProfile
from ..backends.local import LocalBackend, ReceivedMessage
from ..errors import SendOnceError, ValidationError
from ._files import os_errors, writable_problem
from ._snapshot import snapshot
from ._words import (
    BROKER_EXIT_HELP,
    CommandError,
    InputError,
    cli_text,
    duration_option,
    format_duration,
    json_errors,
    parse_duration,
    profile_difference,
    window_error,
)

__all__ = ["broker", "parse_duration"]


_EXISTING_FILE = click.Path(exists=True, dir_okay=False)


@contextmanager
def _open(path: str, *, create: bool = False, reading_only: bool = False) -> Iterator[LocalBackend]:
    """Open the broker; a sendonce or file error inside the block becomes a clean CLI error.

    Only ``create`` makes a new file: every other command opens an existing broker.
    """
    where = os.path.abspath(path)
    problem = writable_problem(path, "broker file", reading_only=reading_only)
    if problem is not None and not (reading_only and os.access(where, os.R_OK)):
        raise InputError(problem)
    with ExitStack() as stack:
        opened = where
        if problem is not None:  # a read-only broker: look at a snapshot, write nothing
            opened = stack.enter_context(snapshot(where, "broker file"))
            click.echo(
                f"note: you may not write {where} or beside it: showing a snapshot of it taken now",
                err=True,
            )
        try:
            with os_errors("broker file"), LocalBackend(opened, create=create) as backend:
                yield backend
        except SendOnceError as exc:
            text = cli_text(exc).replace(opened, where)
            if isinstance(exc, ValidationError):
                raise InputError(text) from None
            raise CommandError(text) from None


_DEFAULT_MAX_DELIVERY_COUNT = 10
# The receive settings of queues and subscriptions: field -> the option that sets it.
_RECEIVE_OPTION_OF = {
    "sessions": "--sessions",
    "lock_duration": "--lock-duration",
    "max_delivery_count": "--max-delivery-count",
    "default_message_time_to_live": "--default-ttl",
    "dead_lettering_on_message_expiration": "--dead-letter-on-expiry",
}


def _receive_options(function: Any) -> Any:
    """The options of a queue's or subscription's receive settings."""
    for option in reversed(
        [
            click.option(
                "--lock-duration",
                callback=duration_option,
                help="How long a peek-lock lasts unless renewed, 1s to 5m (default 1m).",
            ),
            click.option(
                "--max-delivery-count",
                type=click.IntRange(min=1),
                help="Dead-letter a message after this many deliveries (default 10).",
            ),
            click.option(
                "--default-ttl",
                callback=duration_option,
                help="Messages expire after this long unless they say sooner (default: never).",
            ),
            click.option(
                "--dead-letter-on-expiry",
                is_flag=True,
                default=None,
                help="Move expired messages to the dead-letter subqueue instead of dropping them.",
            ),
        ]
    ):
        function = option(function)
    return function


@click.group(epilog=BROKER_EXIT_HELP)
def broker() -> None:
    """Create and inspect a local broker file (the embedded broker)."""


@broker.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--entity", "name", required=True, help="Queue or topic name.")
@click.option("--topic", is_flag=True, help="Create a topic (default: a queue).")
@click.option("--partitioned", is_flag=True, help="Dedup on message id + partition key.")
@click.option("--sessions", is_flag=True, help="Require a session id on every message.")
@click.option(
    "--window",
    callback=duration_option,
    help="Duplicate-detection window, 20s to 7d (default 10m).",
)
@click.option("--no-dedup", is_flag=True, help="Turn duplicate detection off (at-least-once).")
@click.option(
    "--id-cache-size", type=click.IntRange(min=1), help="Artemis mode: remember this many ids."
)
@click.option(
    "--no-persist-id-cache", is_flag=True, help="Artemis mode: forget the ids when restarted."
)
@click.option("--subscription", "subscriptions", multiple=True, help="Topic subscription to add.")
@_receive_options
@click.option("--exist-ok", is_flag=True, help="Succeed if an identical entity exists.")
def create(
    file: str,
    name: str,
    topic: bool,
    partitioned: bool,
    sessions: bool,
    window: timedelta | None,
    no_dedup: bool,
    id_cache_size: int | None,
    no_persist_id_cache: bool,
    subscriptions: tuple[str, ...],
    lock_duration: timedelta | None,
    max_delivery_count: int | None,
    default_ttl: timedelta | None,
    dead_letter_on_expiry: bool,
    exist_ok: bool,
) -> None:
    """Create a queue or topic in FILE (the file is created if needed).

    On a topic, --sessions, --lock-duration, --max-delivery-count and
    --dead-letter-on-expiry are what its subscriptions get unless created with
    their own (see create-subscription); its --default-ttl applies to them all.
    """
    if subscriptions and not topic:
        raise click.UsageError("--subscription needs --topic: queues have no subscriptions")
    _refuse_conflicts(window, no_dedup, id_cache_size, no_persist_id_cache)
    window = window if window is not None else _DEFAULT_WINDOW
    try:  # checked before the file is opened: a refused option leaves no file behind
        profile = EntityProfile(
            name,
            kind="topic" if topic else "queue",
            duplicate_detection=not no_dedup,
            duplicate_detection_window=window,
            partitioned=partitioned,
            sessions=sessions,
            id_cache_size=id_cache_size,
            persist_id_cache=not no_persist_id_cache,
            **_chosen_receive_settings(
                lock_duration, max_delivery_count, default_ttl, dead_letter_on_expiry
            ),
        )
    except ValidationError as exc:
        if exc.field == "duplicate_detection_window":
            raise click.BadParameter(window_error(window), param_hint="--window") from None
        if exc.field in _RECEIVE_OPTION_OF:
            raise click.BadParameter(
                _receive_error(exc.field, locals()), param_hint=_RECEIVE_OPTION_OF[exc.field]
            ) from None
        raise click.BadParameter(cli_text(exc), param_hint="--entity") from None
    with _open(file, create=True) as backend:
        existing = {p.name.lower(): p for p in backend.entities()}.get(name.lower())
        if existing is not None:
            if not exist_ok:
                raise InputError(
                    f"entity {name!r} already exists in {os.path.abspath(file)} "
                    "(--exist-ok accepts an identical one)"
                )
            difference = profile_difference(existing, profile) or _receive_difference(
                f"entity {existing.name!r}", existing, profile
            )
            if difference is not None:
                raise InputError(difference)
        else:
            backend.create_entity(profile, exist_ok=exist_ok)
        had = {n.lower() for n in backend.subscriptions(name)} if topic else set()
        for subscription in subscriptions:
            backend.create_subscription(name, subscription, exist_ok=exist_ok)
    where = os.path.abspath(file)
    if existing is None:
        click.echo(f"created {profile.kind} {name!r} in {where}")
    else:
        click.echo(
            f"{profile.kind} {existing.name!r} already exists in {where} with these settings"
        )
    for subscription in subscriptions:
        verb = "already exists" if subscription.lower() in had else "created"
        click.echo(f"subscription {subscription!r} {verb}")


_DEFAULT_WINDOW = timedelta(minutes=10)


def _chosen_receive_settings(
    lock_duration: timedelta | None,
    max_delivery_count: int | None,
    default_ttl: timedelta | None,
    dead_letter_on_expiry: bool | None,
) -> dict[str, Any]:
    """The receive settings an entity or subscription is created with: the options given,
    the broker's defaults for the rest."""
    return {
        "lock_duration": DEFAULT_LOCK_DURATION if lock_duration is None else lock_duration,
        "max_delivery_count": _DEFAULT_MAX_DELIVERY_COUNT
        if max_delivery_count is None
        else max_delivery_count,
        "default_message_time_to_live": default_ttl,
        "dead_lettering_on_message_expiration": bool(dead_letter_on_expiry),
    }


def _receive_error(field: str, given: dict[str, Any]) -> str:
    """A refused receive setting, in the options' own units."""
    if field == "lock_duration":
        value = given["lock_duration"]
        return f"{format_duration(value)} is outside the broker's range 1s to 5m"
    if field == "default_message_time_to_live":
        return f"{format_duration(given['default_ttl'])} is not a positive duration"
    return f"{_RECEIVE_OPTION_OF[field]} is not valid"


def _receive_difference(
    what: str, existing: EntityProfile | SubscriptionProfile, wanted: object
) -> str | None:
    """How existing receive settings differ from what the options ask for, in option terms."""
    for field, option in _RECEIVE_OPTION_OF.items():
        have, want = getattr(existing, field), getattr(wanted, field)
        if have == want:
            continue
        shown = {
            None: "none",
            True: "on",
            False: "off",
        }
        have_text = format_duration(have) if isinstance(have, timedelta) else shown.get(have, have)
        want_text = format_duration(want) if isinstance(want, timedelta) else shown.get(want, want)
        return (
            f"{what} has {option.lstrip('-')} {have_text}, but the options ask for "
            f"{want_text}; the settings of an existing {what.split()[0]} cannot change"
        )
    return None


@broker.command("create-subscription")
@click.argument("file", type=_EXISTING_FILE)
@click.option("--entity", "name", required=True, help="The topic.")
@click.option("--subscription", required=True, help="Subscription name (at most 50 characters).")
@click.option(
    "--sessions/--no-sessions",
    default=None,
    help="Whether its receivers take sessions (default: as the topic).",
)
@_receive_options
@click.option("--exist-ok", is_flag=True, help="Succeed if an identical subscription exists.")
def create_subscription(
    file: str,
    name: str,
    subscription: str,
    sessions: bool | None,
    lock_duration: timedelta | None,
    max_delivery_count: int | None,
    default_ttl: timedelta | None,
    dead_letter_on_expiry: bool | None,
    exist_ok: bool,
) -> None:
    """Add a subscription with its own receive settings to a topic in FILE.

    A setting not given is the topic's (its --default-ttl: none of its own; the
    topic's applies anyway, and the shorter wins).
    """
    try:  # checked before the file is opened
        wanted = SubscriptionProfile(
            subscription,
            sessions=bool(sessions),
            **_chosen_receive_settings(
                lock_duration, max_delivery_count, default_ttl, dead_letter_on_expiry
            ),
        )
    except ValidationError as exc:
        if exc.field in _RECEIVE_OPTION_OF:
            raise click.BadParameter(
                _receive_error(exc.field, locals()), param_hint=_RECEIVE_OPTION_OF[exc.field]
            ) from None
        raise click.BadParameter(cli_text(exc), param_hint="--subscription") from None
    given: dict[str, Any] = {
        "sessions": sessions,
        "lock_duration": lock_duration,
        "max_delivery_count": max_delivery_count,
        "default_message_time_to_live": default_ttl,
        "dead_lettering_on_message_expiration": dead_letter_on_expiry,
    }
    with _open(file) as backend:
        _require_entity(backend, name)
        topic = backend.describe(name)
        if topic.kind != "topic":
            raise InputError(f"--entity: {topic.name!r} is a queue; only topics have subscriptions")
        existing = {p.name.lower(): p for p in backend.subscription_profiles(name)}.get(
            subscription.lower()
        )
        if existing is not None:
            if not exist_ok:
                raise InputError(
                    f"topic {topic.name!r} already has subscription {existing.name!r} "
                    "(--exist-ok accepts an identical one)"
                )
            asked = dataclasses.replace(
                existing, **{k: v for k, v in given.items() if v is not None}
            )
            difference = _receive_difference(f"subscription {existing.name!r}", existing, asked)
            if difference is not None:
                raise InputError(difference)
            created = existing
        else:
            created = backend.create_subscription(
                name,
                subscription,
                **given,
            )
    verb = "created" if existing is None else "already exists with these settings:"
    click.echo(f"subscription {created.name!r} of topic {topic.name!r} {verb}")
    click.echo(f"  {_describe_receiving(created)}")


def _refuse_conflicts(
    window: timedelta | None, no_dedup: bool, id_cache_size: int | None, no_persist: bool
) -> None:
    """Options that cannot all hold are refused, never silently dropped."""
    if no_dedup and (window is not None or id_cache_size is not None or no_persist):
        given = (
            "--window"
            if window is not None
            else ("--id-cache-size" if id_cache_size is not None else "--no-persist-id-cache")
        )
        raise click.UsageError(
            f"--no-dedup and {given} conflict: without duplicate detection there is no "
            "window and no id cache"
        )
    if id_cache_size is not None and window is not None:
        raise click.UsageError(
            "--id-cache-size and --window conflict: an entity remembers either the last N "
            "ids (Artemis) or the ids of a time window (Service Bus), not both"
        )
    if no_persist and id_cache_size is None:
        raise click.UsageError(
            "--no-persist-id-cache needs --id-cache-size: only an id cache can be forgotten "
            "on restart"
        )


def _require_entity(backend: LocalBackend, name: str) -> None:
    """A missing entity is named along with those that exist, so a typo is plain to see."""
    names = [p.name for p in backend.entities()]
    if name.lower() in {n.lower() for n in names}:  # names ignore case, as on Service Bus
        return
    where = os.path.abspath(backend.path)
    if names:
        listed = ", ".join(repr(n) for n in names)
        raise InputError(f"--entity: entity {name!r} does not exist in {where}; it has {listed}")
    raise InputError(
        f"--entity: entity {name!r} does not exist in {where}, which has no entities yet: "
        f"create it with `sendonce broker create {where} --entity {name}`"
    )


def _check_session_id(
    backend: LocalBackend, name: str, subscription: str | None, session_id: str | None
) -> None:
    """A session id only means something on a queue or subscription with sessions (a
    subscription has its own setting), and is never empty."""
    if session_id is None:
        return
    if not session_id:
        raise InputError("--session-id: give a session id (it is empty)")
    profile = backend.describe(name)
    if profile.kind == "topic" and subscription is not None:
        if not backend.describe_subscription(name, subscription).sessions:
            raise InputError(
                f"--session-id: subscription {subscription!r} of {name!r} has no sessions, so "
                "no message has a session to select by; leave --session-id out"
            )
    elif not profile.sessions:
        raise InputError(
            f"--session-id: entity {name!r} has no sessions, so no message has a session to "
            "select by; leave --session-id out"
        )


def _settings(profile: EntityProfile) -> dict[str, Any]:
    """The profile as JSON fields, for scripts (``stats --json``)."""
    return {
        "kind": profile.kind,
        "duplicate_detection": profile.duplicate_detection,
        # A time window only where the broker keeps one: not without duplicate detection,
        # not with an id cache.
        "window_seconds": (
            profile.window.total_seconds()
            if profile.window is not None and profile.duplicate_detection
            else None
        ),
        "partitioned": profile.partitioned,
        "sessions": profile.sessions,
        "id_cache_size": profile.id_cache_size,
        "persist_id_cache": profile.persist_id_cache,
        "max_message_size": profile.max_message_size,
        **_receive_settings(profile),
    }


def _receive_settings(profile: EntityProfile | SubscriptionProfile) -> dict[str, Any]:
    """A queue's, topic's or subscription's receive settings as JSON fields."""
    ttl = profile.default_message_time_to_live
    return {
        "sessions": profile.sessions,
        "lock_duration_seconds": profile.lock_duration.total_seconds(),
        "max_delivery_count": profile.max_delivery_count,
        "default_ttl_seconds": None if ttl is None else ttl.total_seconds(),
        "dead_letter_on_expiry": profile.dead_lettering_on_message_expiration,
    }


def _describe_receiving(profile: EntityProfile | SubscriptionProfile) -> str:
    """``lock 1m, max deliveries 10, no ttl``: the receive settings in option units."""
    ttl = profile.default_message_time_to_live
    words = [
        f"lock {format_duration(profile.lock_duration)}",
        f"max deliveries {profile.max_delivery_count}",
        "no ttl" if ttl is None else f"ttl {format_duration(ttl)}",
    ]
    if profile.dead_lettering_on_message_expiration:
        words.append("dead-letter on expiry")
    if isinstance(profile, SubscriptionProfile) and profile.sessions:
        words.insert(0, "sessions")
    return ", ".join(words)


def _describe(profile: EntityProfile) -> str:
    if not profile.duplicate_detection:
        dedup = "dedup off"
    elif profile.id_cache_size is not None:
        persisted = "persisted" if profile.persist_id_cache else "not persisted"
        dedup = f"id cache {profile.id_cache_size} ({persisted})"
    else:
        dedup = f"window {format_duration(profile.duplicate_detection_window)}"
    flags = [f for f in ("partitioned", "sessions") if getattr(profile, f)]
    return ", ".join([profile.kind, dedup, *flags, _describe_receiving(profile)])


@broker.command()
@click.argument("file", type=_EXISTING_FILE)
@click.option("--entity", "name", help="Only this entity (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (also for an error).")
@json_errors
def stats(file: str, name: str | None, as_json: bool) -> None:
    """Counts per entity: available, scheduled, locked, remembered ids."""
    with _open(file, reading_only=True) as backend:
        if name:
            _require_entity(backend, name)
        profiles = [backend.describe(name)] if name else backend.entities()
        result = {p.name: {"profile": _describe(p), **backend.stats(p.name)} for p in profiles}
        subscriptions = {
            p.name: backend.subscription_profiles(p.name) for p in profiles if p.kind == "topic"
        }
    if as_json:
        by_name = {p.name: p for p in profiles}
        for entity_name, counts in result.items():
            counts["settings"] = _settings(by_name[entity_name])
            if entity_name in subscriptions:
                counts["subscriptions"] = {
                    s.name: _receive_settings(s) for s in subscriptions[entity_name]
                }
        entities = {n: dict(sorted(c.items())) for n, c in sorted(result.items())}
        report = {"status": "ok", "entities": entities, "exit_status": 0}
        click.echo(json.dumps(report, ensure_ascii=False))
        return
    if not result:
        click.echo("no entities")
    for entity, counts in result.items():
        click.echo(f"{entity} ({counts.pop('profile')})")
        for key, value in counts.items():
            click.echo(f"  {key}: {value}")
        for sub in subscriptions.get(entity, []):
            click.echo(f"  subscription {sub.name} ({_describe_receiving(sub)})")


def _as_json(message: ReceivedMessage) -> str:
    try:
        body: dict[str, str] = {"body": message.body.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"body_base64": base64.b64encode(message.body).decode("ascii")}
    data: dict[str, Any] = {
        "message_id": message.message_id,
        "sequence_number": message.sequence_number,
        "partition_key": message.partition_key,
        "session_id": message.session_id,
        "enqueued_time": message.enqueued_time.isoformat(),
        "delivery_count": message.delivery_count,
        **body,
    }
    if message.scheduled_enqueue_time is not None:
        data["scheduled_enqueue_time"] = message.scheduled_enqueue_time.isoformat()
    if message.dead_letter_reason is not None:
        data["dead_letter_reason"] = message.dead_letter_reason
    if message.dead_letter_error_description is not None:
        data["dead_letter_error_description"] = message.dead_letter_error_description
    return json.dumps(data, ensure_ascii=False)


def _read_options(function: Any) -> Any:
    for option in reversed(
        [
            click.argument("file", type=_EXISTING_FILE),
            click.option("--entity", "name", required=True, help="Queue or topic name."),
            click.option("--subscription", help="Topic subscription to read."),
            click.option("--session-id", help="Only this session's messages."),
            click.option(
                "--dead-letter",
                is_flag=True,
                help="Read the dead-letter subqueue (of the queue, or of --subscription).",
            ),
            click.option(
                "--max",
                "max_messages",
                type=click.IntRange(min=1),
                default=10,
                show_default=True,
                help="At most this many messages.",
            ),
        ]
    ):
        function = option(function)
    return function


@broker.command()
@_read_options
def peek(
    file: str,
    name: str,
    subscription: str | None,
    session_id: str | None,
    dead_letter: bool,
    max_messages: int,
) -> None:
    """Print stored messages as JSON lines without removing them."""
    with _open(file, reading_only=True) as backend:
        _require_entity(backend, name)
        _check_session_id(backend, name, subscription, session_id)
        messages = backend.peek(
            name,
            max_messages=max_messages,
            subscription=subscription,
            session_id=session_id,
            sub_queue="dead_letter" if dead_letter else None,
        )
    for message in messages:
        click.echo(_as_json(message))


@broker.command()
@_read_options
def receive(
    file: str,
    name: str,
    subscription: str | None,
    session_id: str | None,
    dead_letter: bool,
    max_messages: int,
) -> None:
    """Take available messages (receive-and-delete) and print them as JSON lines."""
    with _open(file) as backend:
        _require_entity(backend, name)
        _check_session_id(backend, name, subscription, session_id)
        messages = backend.receive(
            name,
            max_messages=max_messages,
            subscription=subscription,
            session_id=session_id,
            sub_queue="dead_letter" if dead_letter else None,
        )
    for message in messages:
        click.echo(_as_json(message))


@broker.command()
@click.argument("file", type=_EXISTING_FILE)
@click.option("--entity", "name", required=True, help="Queue or topic name.")
@click.option("--subscription", help="Only this subscription (default: every copy).")
def purge(file: str, name: str, subscription: str | None) -> None:
    """Delete stored messages. Remembered ids stay, so the window is not reopened."""
    with _open(file) as backend:
        _require_entity(backend, name)
        removed = backend.purge(name, subscription=subscription)
    click.echo(f"purged {removed} message(s) from {name!r}")


@broker.command()
@click.argument("file", type=_EXISTING_FILE)
@click.option("--entity", "name", required=True, help="Queue or topic name.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(file: str, name: str, yes: bool) -> None:
    """Delete an entity with its messages, subscriptions and remembered ids.

    Its remembered ids go too: an entity created again under the same name accepts
    the same messages again, as a new Service Bus entity would.
    """
    with _open(file) as backend:
        _require_entity(backend, name)
        if not yes:
            click.confirm(
                f"Delete {name!r} with its messages and remembered ids from "
                f"{os.path.abspath(file)}?",
                abort=True,
                err=True,
            )
        backend.delete_entity(name)
    click.echo(f"deleted {name!r} from {os.path.abspath(file)}")


@broker.command()
@click.argument("file", type=_EXISTING_FILE)
@click.argument("target", type=click.Path(dir_okay=False))
def backup(file: str, target: str) -> None:
    """Copy a broker, even while producers write to it, into a new file TARGET.

    A `cp` of a live broker can catch it between a write and a checkpoint and
    produce a damaged copy; this takes one consistent snapshot (SQLite's online
    backup) and never overwrites an existing file.
    """
    with _open(file, reading_only=True) as backend:
        backend.backup(target)
    click.echo(f"backed up {file} to {target}")
