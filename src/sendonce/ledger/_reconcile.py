"""Reconciling keys in doubt with what the broker can show.

A key in doubt is an intent the ledger wrote and never saw confirmed: the send may
or may not have been stored. The broker is the only witness, and what it can show
differs:

- the local broker (its file) shows every message it stores (all subqueues, dead
  letters, scheduled and deferred ones, each topic subscription's copy) and the ids
  it remembers for duplicate detection (its window, or an Artemis-style id cache).
  A stored or remembered key was stored: confirming it is right. A key it neither
  stores nor remembers, where it would still remember it had it been stored (inside
  the window since the intent; an id cache, persisted, that never evicted), was
  never stored: releasing it is right;
- over AMQP (the emulator, Service Bus), a peek shows the messages stored now, and
  nothing else: a key a peek does not show may have been received and completed,
  expired or purged, and Service Bus shows no remembered ids.

A key neither seen nor proven absent is ``absent``: only a person who knows that no
consumer received from the entity since can say it was never stored.

:meth:`Ledger.reconcile <sendonce.ledger.Ledger.reconcile>` (what ``sendonce ledger
reconcile`` calls) asks the broker, compares, and with ``apply=True`` records what the
broker proves; :class:`Reconciliation` is its answer.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from .._entity import EntityProfile
from ..errors import ConfigurationError, redact
from ._doubt import InDoubtRule
from ._inspect import Unconfirmed, unconfirmed
from ._store import Key

if TYPE_CHECKING:
    from ..backends.local import LocalBackend
    from ._ledger import Ledger

__all__ = [
    "FINDINGS",
    "BrokerView",
    "Finding",
    "Reconciliation",
    "Verdict",
    "broker_view",
    "local_view",
    "peek_view",
    "reconcile",
    "reconcile_ledger",
]

Finding = Literal["held", "remembered", "not_stored", "absent"]
"""``held``: the broker stores a message with the key; ``remembered``: it remembers the
id (it was stored; a consumer may have taken it since); ``not_stored``: it would remember
the id had it been stored, and does not; ``absent``: not seen, and nothing proves why."""

FINDINGS: tuple[Finding, ...] = ("held", "remembered", "not_stored", "absent")

_PROOF_MARGIN = timedelta(seconds=5)
_CHUNK = 5000


@dataclass(frozen=True, slots=True)
class BrokerView:
    """What the broker showed for the keys asked about."""

    held: frozenset[Key]
    remembered: frozenset[Key]
    proves_absence: Callable[[datetime], bool]
    """Whether a key first attempted at that moment, neither held nor remembered, was
    never stored (the broker would remember it)."""
    profile: EntityProfile | None
    """The entity's profile where the broker describes it (the local broker)."""
    cannot_tell: tuple[str, ...] = ()
    """What this broker cannot show, in words (said with the result)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One key in doubt and what the broker showed of it."""

    item: Unconfirmed
    finding: Finding


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What :meth:`Ledger.reconcile <sendonce.ledger.Ledger.reconcile>` found, and did.

    ``verdicts``: every unconfirmed key of the entity with its finding, oldest first.
    ``to_confirm``: the keys the broker holds or remembers; ``to_release``: those it proves
    it never stored (and, with ``release_absent``, those it does not show) old enough to
    release; ``too_young``: keys that would be released but were written less than
    ``min_age`` ago (their producer may still be sending them). With ``applied`` the first
    two were recorded. ``cannot_tell``: what this broker cannot show, in words.
    """

    entity: str
    rule: InDoubtRule
    """The entity's rule where the broker describes it (the local broker), else unknown."""
    verdicts: tuple[Verdict, ...]
    to_confirm: tuple[Key, ...]
    to_release: tuple[Key, ...]
    too_young: tuple[Key, ...]
    cannot_tell: tuple[str, ...]
    applied: bool

    def keys(self, finding: Finding) -> list[Key]:
        """The keys with this finding, oldest first."""
        return [v.item.key for v in self.verdicts if v.finding == finding]

    @property
    def left(self) -> int:
        """Keys still unconfirmed after this call."""
        done = len(self.to_confirm) + len(self.to_release) if self.applied else 0
        return len(self.verdicts) - done


@dataclass(slots=True)
class _Seen:
    held: set[Key] = field(default_factory=set)
    remembered: set[Key] = field(default_factory=set)


def reconcile(items: Sequence[Unconfirmed], view: BrokerView) -> list[Verdict]:
    """Each key in doubt with its finding, in the order given."""
    verdicts = []
    for item in items:
        finding: Finding
        if item.key in view.held:
            finding = "held"
        elif item.key in view.remembered:
            finding = "remembered"
        elif view.proves_absence(item.first_attempt):
            finding = "not_stored"
        else:
            finding = "absent"
        verdicts.append(Verdict(item, finding))
    return verdicts


def reconcile_ledger(
    ledger: Ledger,
    broker: LocalBackend | str,
    entity: str,
    *,
    subscriptions: Sequence[str] = (),
    apply: bool = False,
    release_absent: bool = False,
    min_age: timedelta = timedelta(0),
) -> Reconciliation:
    """:meth:`Ledger.reconcile <sendonce.ledger.Ledger.reconcile>`: compare, then record."""
    if release_absent and not apply:
        raise ConfigurationError("release_absent releases keys: pass apply=True too", field="apply")
    rows = unconfirmed(ledger.store, entity)
    view = broker_view(broker, entity, [r.key for r in rows], subscriptions)
    verdicts = reconcile(rows, view)
    now = ledger.clock()
    confirm = [v for v in verdicts if v.finding in ("held", "remembered")]
    releasable = ("not_stored", "absent") if release_absent else ("not_stored",)
    wanted = [v for v in verdicts if v.finding in releasable]
    young = [v for v in wanted if now - v.item.first_attempt < min_age]
    release = [v for v in wanted if now - v.item.first_attempt >= min_age]
    if apply:
        ledger.confirm(entity, {v.item.key: "resolved" for v in confirm})
        by_owner: dict[str, list[Key]] = {}
        for verdict in release:  # a key is released for the owner that wrote its intent
            by_owner.setdefault(verdict.item.owner, []).append(verdict.item.key)
        for owner, keys in by_owner.items():
            ledger.release(entity, keys, owner)
    return Reconciliation(
        entity=entity,
        rule=InDoubtRule.of(view.profile) if view.profile is not None else InDoubtRule(None),
        verdicts=tuple(verdicts),
        to_confirm=tuple(v.item.key for v in confirm),
        to_release=tuple(v.item.key for v in release),
        too_young=tuple(v.item.key for v in young),
        cannot_tell=view.cannot_tell,
        applied=apply,
    )


def broker_view(
    broker: LocalBackend | str, entity: str, keys: Sequence[Key], subscriptions: Sequence[str] = ()
) -> BrokerView:
    """What ``broker`` shows of ``keys`` in ``entity``: a :class:`LocalBackend` (or its
    ``local:`` url, opened without creating it) read exactly, or a Service Bus connection
    string (the emulator's too) peeked."""
    from ..backends._url import LOCAL_SCHEME, local_path
    from ..backends.local import LocalBackend

    if isinstance(broker, str) and broker.strip().startswith(LOCAL_SCHEME):
        path, _ = local_path(broker.strip())
        if not os.path.exists(path):
            raise ConfigurationError(
                f"there is no broker file {path!r} (reconciling never creates one)", field="broker"
            )
        with LocalBackend(path, create=False, read_only=not os.access(path, os.W_OK)) as local:
            return broker_view(local, entity, keys, subscriptions)
    if isinstance(broker, LocalBackend):
        if subscriptions:
            raise ConfigurationError(
                "a local broker shows every subscription of a topic by itself: name none",
                field="subscriptions",
            )
        return local_view(broker, entity, keys)
    if not isinstance(broker, str):
        raise ConfigurationError(
            "reconcile reads a LocalBackend (or its local: url) or peeks Service Bus through "
            f"a connection string, not a {type(broker).__name__}",
            field="broker",
        )
    if broker.strip().lower().startswith(("amqp://", "amqps://")):
        raise ConfigurationError(
            f"reconcile cannot read an Artemis broker's queues yet ({redact(broker)!r}): browse "
            "them, then record what you find with Ledger.confirm / Ledger.release",
            field="broker",
        )
    return peek_view(broker.strip(), entity, subscriptions=subscriptions)


# -- the local broker: its file, exactly ------------------------------------------------


def local_view(backend: Any, entity: str, keys: Iterable[Key]) -> BrokerView:
    """What the local broker ``backend`` stores and remembers of ``keys`` in ``entity``."""
    from ..backends.local._entities import lookup
    from ..backends.local._store import US

    wanted = list(keys)
    mids = sorted({key.message_id for key in wanted})
    store = backend._store

    def work(conn: sqlite3.Connection) -> tuple[EntityProfile, int, _Seen, int]:
        eid, profile, _next_seq, id_count = lookup(conn, entity)
        seen = _Seen()
        wanted = set(mids)
        # Stored messages have no index by id: one pass over the entity's (every subqueue,
        # subscription copy, scheduled message), whatever the number of keys asked about.
        rows = conn.execute(
            "SELECT message_id, partition_key, session_id FROM messages WHERE eid = ?", (eid,)
        )
        for mid, pk, sid in rows:
            if mid in wanted:
                seen.held.add(_stored_key(profile, mid, pk, sid))
        if profile.duplicate_detection:  # remembered ids: probed by the ids' primary key
            sql = (
                "SELECT mid, pkey FROM ids WHERE eid = ? "
                "AND mid IN (SELECT value FROM json_each(?))"
            )
            extra: tuple[Any, ...] = ()
            window = profile.window
            if profile.id_cache_size is None and window is not None:
                sql += " AND stamp > ?"
                extra = (store.now() - window // US,)
            for start in range(0, len(mids), _CHUNK):
                chunk = _json(mids[start : start + _CHUNK])
                for mid, pkey in conn.execute(sql, (eid, chunk, *extra)).fetchall():
                    seen.remembered.add(Key(mid, pkey))
        return profile, id_count, seen, store.now()

    profile, id_count, seen, now_us = store.read(work)
    now = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=now_us)
    return BrokerView(
        frozenset(seen.held),
        frozenset(seen.remembered),
        _local_proof(profile, id_count, now),
        profile,
        _local_limits(profile),
    )


def _stored_key(profile: EntityProfile, mid: str, pk: str | None, sid: str | None) -> Key:
    """The ledger's key of a stored message: the broker's dedup key (EntityProfile.dedup_key)."""
    if not profile.partitioned:
        return Key(mid)
    return Key(mid, pk or sid or mid)


def _local_proof(
    profile: EntityProfile, id_count: int, now: datetime
) -> Callable[[datetime], bool]:
    if not profile.duplicate_detection:
        return lambda first_attempt: False
    size = profile.id_cache_size
    if size is not None:  # an id cache that never evicted (and survives restarts) forgets nothing
        never_evicted = profile.persist_id_cache and id_count < size
        return lambda first_attempt: never_evicted
    window = profile.window
    assert window is not None
    # An id stored at or after the intent's first attempt is remembered for the window.
    return lambda first_attempt: now < first_attempt + window - _PROOF_MARGIN


def _local_limits(profile: EntityProfile) -> tuple[str, ...]:
    if not profile.duplicate_detection:
        return (
            "the entity has no duplicate detection: the broker keeps no trace of a message "
            "once a consumer completed it (or it expired, or was purged), so a key it does not "
            "hold may still have been stored",
        )
    if profile.id_cache_size is not None:
        return (
            f"the broker remembers the last {profile.id_cache_size} ids; a key it neither "
            "holds nor remembers was never stored only if the cache never evicted an id "
            + (
                "(it survives restarts)"
                if profile.persist_id_cache
                else "nor was emptied by a restart"
            ),
        )
    return (
        "the broker remembers ids for its duplicate-detection window only: past it, a key it "
        "does not hold may have been stored and then completed by a consumer",
    )


# -- over AMQP: the emulator and Service Bus, by peeking ---------------------------------------


def peek_view(
    connection_string: str,
    entity: str,
    *,
    subscriptions: Sequence[str] = (),
    page: int = 250,
) -> BrokerView:
    """What a peek of ``entity`` (a queue, or the named ``subscriptions`` of a topic, and
    their dead-letter subqueues) shows, through the azure-servicebus client."""
    from azure.servicebus import ServiceBusClient, ServiceBusSubQueue

    seen = _Seen()
    client = ServiceBusClient.from_connection_string(connection_string, retry_total=2)
    with client:
        places: list[tuple[str | None, ServiceBusSubQueue | None]] = [
            (name, queue)
            for name in (list[str | None](subscriptions) or [None])
            for queue in (None, ServiceBusSubQueue.DEAD_LETTER)
        ]
        for subscription, sub_queue in places:
            if subscription is None:
                receiver = client.get_queue_receiver(entity, sub_queue=sub_queue)
            else:
                receiver = client.get_subscription_receiver(
                    entity, subscription, sub_queue=sub_queue
                )
            with receiver:
                start = 0
                while True:
                    messages = receiver.peek_messages(max_message_count=page, sequence_number=start)
                    if not messages:
                        break
                    for message in messages:
                        mid = str(message.message_id)
                        seen.held.add(Key(mid))
                        other = message.partition_key or message.session_id or mid
                        seen.held.add(Key(mid, other))
                    start = max(int(m.sequence_number or 0) for m in messages) + 1
    limits = [
        "a peek shows the messages stored now: a key it does not show may have been "
        "received and completed by a consumer, expired or purged",
        "Service Bus shows no remembered ids (its duplicate-detection history)",
    ]
    if subscriptions:
        limits.append("only the subscriptions named were looked at")
    return BrokerView(
        frozenset(seen.held), frozenset(), lambda first_attempt: False, None, tuple(limits)
    )


def _json(values: list[str]) -> str:
    import json

    return json.dumps(values, ensure_ascii=False)
