"""The broker a ``sendonce ledger`` command asks (``--broker URL``): the entity's rule, and
what it shows of keys in doubt.

The url is the one ``publish --to`` takes. A local broker file is opened as it is (never
created: a typo must not start an empty broker, whose emptiness would look like "never
stored"), read-only when the user may not write it; a Service Bus connection string (the
emulator's too) is peeked through the azure-servicebus client.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from .._entity import EntityProfile
from .._names import name_key
from ..backends._url import LOCAL_SCHEME, local_path
from ..backends.local import LocalBackend
from ..errors import LedgerError, SendOnceError, ValidationError, redact
from ._doubt_rule import Rule, check_declared
from ._files import os_errors, writable_problem
from ._words import CommandError, InputError, cli_text

__all__ = ["entity_rule", "entity_rules", "reconcile_broker"]


@contextmanager
def _local(url: str) -> Iterator[LocalBackend]:
    try:
        path, _ = local_path(url)
    except ValidationError as exc:
        raise InputError(f"--broker: {cli_text(exc)}") from None
    if not os.path.exists(path):
        raise InputError(
            f"--broker: there is no broker file {path!r} (these commands never create one)"
        )
    read_only = writable_problem(path, "--broker: broker file", reading_only=True) is not None
    try:
        with os_errors("--broker: broker file"):
            backend = LocalBackend(path, create=False, read_only=read_only)
    except ValidationError as exc:
        raise InputError(f"--broker: {cli_text(exc)}") from None
    with backend:
        try:
            yield backend
        except LedgerError:
            raise  # the ledger's (reconcile records in it), not the broker's
        except ValidationError as exc:
            raise InputError(f"--broker: {cli_text(exc)}") from None
        except SendOnceError as exc:
            raise CommandError(f"--broker: {cli_text(exc)}") from None


def _is_local(url: str) -> bool:
    return url.strip().startswith(LOCAL_SCHEME)


def _is_artemis(url: str) -> bool:
    return url.strip().lower().startswith(("amqp://", "amqps://"))


def entity_rule(url: str | None, entity: str, window: timedelta | None, no_dedup: bool) -> Rule:
    """The entity's rule: read from ``--broker``, declared by ``--window`` / ``--no-dedup``,
    or unknown."""
    check_declared(window, no_dedup, None)
    if url is not None and (window is not None or no_dedup):
        raise InputError("--broker reads the entity's rule: leave --window / --no-dedup out")
    if no_dedup:
        return Rule("none")
    if window is not None:
        return Rule("window", window=window)
    if url is None:
        return Rule(None)
    return Rule.of(_profile(url, entity))


def _profile(url: str, entity: str) -> EntityProfile:
    found = _profiles(url, [entity], missing_ok=False)[entity]
    assert found is not None
    return found


def entity_rules(url: str, entities: Sequence[str]) -> dict[str, Rule]:
    """Each entity's rule from the broker at ``url`` (opened once); unknown where the broker
    has no such entity (a ledger keeps the keys of entities deleted since)."""
    found = _profiles(url, entities, missing_ok=True, advice=_WITHOUT_RULE)
    return {name: Rule(None) if p is None else Rule.of(p) for name, p in found.items()}


_DECLARE = "declare the rule with --window (or --no-dedup) instead of --broker"
"""What a command that takes a declared rule (``ledger in-doubt``) advises."""
_WITHOUT_RULE = (
    "leave --broker out (the keys are then shown without the entity's rule); `sendonce "
    "ledger in-doubt` takes the rule declared with --window or --no-dedup"
)
"""What a command without those options (``ledger stats``) advises."""


def _profiles(
    url: str, entities: Sequence[str], *, missing_ok: bool, advice: str = _DECLARE
) -> dict[str, EntityProfile | None]:
    """Each entity's profile from the broker at ``url``; ``advice``: what to do where the
    broker cannot describe entities, in the words of the calling command's own options."""
    if _is_local(url):
        with _local(url) as backend:
            return {name: _described(backend, name, missing_ok) for name in entities}
    from ..backends import connect

    try:
        remote = connect(url)
    except ModuleNotFoundError as exc:
        raise InputError(_hint(exc)) from None
    except ValidationError as exc:
        raise InputError(f"--broker: {cli_text(exc)}") from None
    try:
        return {name: _described(remote, name, missing_ok) for name in entities}
    except ValidationError as exc:
        if exc.field != "entity":  # the url, the credentials: nothing about entities
            raise InputError(f"--broker: {cli_text(exc)}") from None
        if _is_artemis(url):
            said = cli_text(exc).split("; ")[0]  # what follows is advice for senders
            raise InputError(
                f"--broker: {said}. An Artemis address remembers ids by count, so every "
                "unconfirmed key is in doubt at once: leave --broker out to list them all"
            ) from None
        said = cli_text(exc).split("; ")[0]  # what follows is advice for senders
        raise InputError(
            f"--broker: {said}; this broker cannot describe its entities: {advice}"
        ) from None
    except SendOnceError as exc:
        raise CommandError(f"--broker {redact(url)}: {cli_text(exc)}") from None
    finally:
        remote.close()


def _described(backend: Any, entity: str, missing_ok: bool) -> EntityProfile | None:
    entities = getattr(backend, "entities", None)
    known = None if entities is None or not missing_ok else {name_key(p.name) for p in entities()}
    if known is not None and name_key(entity) not in known:
        return None
    profile: EntityProfile = backend.describe(entity)
    return profile


@contextmanager
def reconcile_broker(
    url: str, entity: str, subscriptions: Sequence[str]
) -> Iterator[LocalBackend | str]:
    """The broker at ``url`` as ``Ledger.reconcile`` takes it (a local broker opened as these
    commands open it, or the connection string to peek), its failures said as ``--broker``'s.

    A ``LedgerError`` inside passes through: it is the ledger's, not the broker's.
    """
    if _is_local(url):
        if subscriptions:
            raise InputError(
                "--subscription: a local broker shows every subscription of a topic by itself"
            )
        with _local(url) as backend:
            yield backend
        return
    if _is_artemis(url):
        raise InputError(
            "--broker: reconcile reads a local broker (local:FILE) or peeks the emulator or "
            "Service Bus (a connection string); it cannot read an Artemis broker's queues yet: "
            "browse them, then record what you find with `sendonce ledger confirm` / `release`"
        )
    try:
        yield url.strip()
    except SendOnceError:
        raise  # the ledger's, or the library's refusal of the broker (mapped by the caller)
    except ModuleNotFoundError as exc:
        raise InputError(_hint(exc)) from None
    except ValueError as exc:  # the client's own refusal of a malformed connection string
        raise InputError(f"--broker: {cli_text(str(exc))}") from None
    except Exception as exc:  # the client's errors: unreachable, no such entity, no rights
        raise CommandError(
            f"--broker {redact(url)}: peeking {entity!r} failed: {cli_text(str(exc))}"
        ) from None


def _hint(exc: ModuleNotFoundError) -> str:
    name = (exc.name or "").split(".")[0] or "azure"
    return f"--broker: this broker needs the {name} package: pip install 'sendonce[azure]'"
