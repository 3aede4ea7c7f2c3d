"""The ledger's logic: what a sender may send, skip, resend or must report in doubt.

Per entity and broker key the ledger holds an *intent* (first-attempt time, body
digest) written before the first attempt, and a *confirmation* written after the
broker's ack. Decisions for a key that already has a row:

- a different body digest: ``PayloadConflictError``;
- confirmed: not sent again, reported ``duplicate`` (from the ledger);
- unconfirmed, first attempt + window - margin not yet passed: resent, keeping the
  original deadline (the broker still remembers the id);
- unconfirmed past that point (at once when the entity has no duplicate
  detection): in doubt. ``in_doubt="error"`` reports ``InDoubtError`` and sends
  nothing; ``in_doubt="resend"`` sends it again (at-least-once, logged loudly).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

import xxhash

from .._entity import EntityProfile
from .._message import Message
from ..errors import ConfigurationError
from ._store import Confirmation, Entry, Key, LedgerStore

if TYPE_CHECKING:
    from ..backends.local import LocalBackend
    from ._doubt import InDoubtRule
    from ._inspect import Unconfirmed
    from ._reconcile import Reconciliation

__all__ = [
    "DEFAULT_RETENTION",
    "IN_FLIGHT_HORIZON",
    "InDoubtPolicy",
    "Ledger",
    "LedgerOptions",
    "Prepared",
    "body_digest",
    "open_store",
]

logger = logging.getLogger("sendonce.ledger")

InDoubtPolicy = Literal["error", "resend"]
"""What a sender does with a key in doubt: ``error`` (report ``InDoubtError``) or ``resend``
(at-least-once)."""
DEFAULT_RETENTION = timedelta(days=30)
"""How long a ledger keeps its keys unless told otherwise (``Ledger(retention=...)``)."""
IN_FLIGHT_HORIZON = timedelta(seconds=160)
"""How long another producer's send may still be in flight after it wrote its intent: the
default ``RetryPolicy``'s whole budget (5 attempts of 30 s and their backoffs, ~158 s).
An unconfirmed intent younger than this may belong to a producer that is still sending."""
OUTCOMES = ("sent", "duplicate", "scheduled", "resolved")
"""What a confirmation records: the broker's ack (``sent``, ``duplicate``, ``scheduled``), or
``resolved``, a person's answer that the broker has the key (``sendonce ledger confirm``):
kept apart so that it never reads as a sign that the producer is alive."""
WallClock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


_DIGEST_FORMAT = b"\x01"
"""The first byte of a digest: 1 = xxh3-64 of the body. A digest of 8 bytes alone is the
blake2b-64 of the first ledger format, still recognised when a re-run meets one."""


def body_digest(message: Message) -> bytes:
    """A stable digest of the body (the same in every process, unlike ``hash``).

    xxh3-64 (the ``xxhash`` package): five times cheaper than blake2b per small body,
    which a ledger pays per message. It guards against distinct business messages
    sharing an id by mistake, not against an adversary forging collisions.
    """
    return body_digests([message])[0]


def body_digests(messages: Sequence[Message]) -> list[bytes]:
    """:func:`body_digest` of each message, in one pass (a ledger digests every transfer)."""
    xxh3, head = _xxh3, _DIGEST_FORMAT
    return [
        head + xxh3(body.encode() if isinstance(body, str) else body)
        for body in [m.body for m in messages]
    ]


def _legacy_digest(message: Message) -> bytes:
    body = message.body
    return hashlib.blake2b(body.encode() if isinstance(body, str) else body, digest_size=8).digest()


def same_body(row: Entry, digest: bytes, message: Message) -> bool:
    """Whether the body recorded in ``row`` is ``message``'s (``digest`` is its digest)."""
    if len(row.digest) == 8:  # written in the first ledger format
        return row.digest == _legacy_digest(message)
    return row.digest == digest


_xxh3 = xxhash.xxh3_64_digest


KeyLike = Key | tuple[str, str | None] | str
"""A key as a caller may write it by hand: ``Key(id, pk)``, ``(id, None)`` or a bare id."""


def as_key(key: KeyLike) -> Key:
    """``key`` as a :class:`Key`; None or a bare message id means "no partition key" ('')."""
    if isinstance(key, str):
        message_id, partition_key = key, None
    elif isinstance(key, tuple) and len(key) == 2:
        message_id, partition_key = key
    else:
        raise ConfigurationError(
            f"a ledger key is a message id or Key(message_id, partition_key), not {key!r}",
            field="key",
        )
    if not isinstance(message_id, str) or not message_id:
        raise ConfigurationError(
            f"a ledger key's message id must be a non-empty str, not {message_id!r}", field="key"
        )
    if partition_key is not None and not isinstance(partition_key, str):
        raise ConfigurationError(
            f"a ledger key's partition key must be a str or None, not {partition_key!r}",
            field="key",
        )
    return Key(message_id, partition_key or "")


def _confirmation(
    value: Confirmation | Mapping[KeyLike, str] | Mapping[Key, str] | None,
) -> Confirmation | None:
    """A confirmation; a plain mapping (key -> outcome) confirms those keys one by one.

    A mapping is what a person resolving keys by hand writes, so its keys are normalised
    (``Key(id, None)`` or a bare id for an unpartitioned key) and its outcomes checked.
    """
    if value is None or isinstance(value, Confirmation):
        return value or None
    keys: dict[Key, str] = {}
    for key, outcome in value.items():
        if outcome not in OUTCOMES:
            raise ConfigurationError(
                f"outcome {outcome!r} of ledger key {key!r} must be one of {', '.join(OUTCOMES)}",
                field="outcome",
            )
        keys[as_key(key)] = outcome
    return Confirmation((), keys) if keys else None


def open_store(url: str, *, create: bool = True, read_only: bool = False) -> LedgerStore:
    """The store a url names: ``sqlite:///abs/path.db`` or ``postgresql://...``.

    ``create=False`` refuses a ledger that does not exist (no SQLite file; a database
    without the ledger's tables) with a ``ConfigurationError`` naming it. ``read_only``
    (SQLite) opens a file this user may not write, writing nothing beside it; only the
    inspection queries of ``sendonce ledger`` can use such a store.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("ledger url must be a non-empty str", field="ledger")
    url = url.strip()
    if url.startswith("sqlite:"):
        from ._sqlite import SQLiteStore

        return SQLiteStore.from_url(url, create=create, read_only=read_only)
    if url.startswith(("postgresql://", "postgres://")):
        from ._postgres import PostgresStore

        return PostgresStore(url, create=create and not read_only)
    from ..errors import redact

    raise ConfigurationError(
        f"ledger url {redact(url)!r} names no known store: use sqlite:///path/ledger.db "
        "or postgresql://user@host/db",
        field="ledger",
    )


def shown_url(url: str) -> str:
    """A store url as a person reads it: a SQLite file's absolute path, else the url redacted."""
    from ..errors import redact

    if url.startswith("sqlite://"):
        return url[len("sqlite://") :].partition("?")[0]
    return redact(url)


@dataclass(slots=True, eq=False)
class Prepared:
    """The ledger's decision for one write of intents, those intents already durable.

    Messages are named by their index in the batch a run's intent write was given
    (never by object identity: a ``MessageColumns`` builds its messages on access).
    The sender reports each acknowledged or refused part of ``send`` back
    (:meth:`acknowledged`, :meth:`refused`); :meth:`confirmation` then says what
    to record, usually one row for the whole write.
    """

    owner: str = ""
    """The write's owner token (its intents are released under it)."""
    keys: Sequence[Key] = ()
    """The broker key of each message of the batch, by index."""
    send: list[int] = field(default_factory=list)
    """The indices of the messages to send, in batch order."""
    started: datetime | None = None
    """The earliest first attempt among resumed keys (their deadline is kept)."""
    confirmed: list[tuple[int, Entry]] = field(default_factory=list)
    conflicts: list[tuple[int, Entry]] = field(default_factory=list)
    in_doubt: list[tuple[int, Entry]] = field(default_factory=list)
    """(index, the row found) of the messages not sent: sent earlier, conflicting, in doubt."""
    resumed: set[Key] = field(default_factory=set)
    """Keys of ``send`` whose intent an earlier write wrote (confirmed one by one)."""
    _fresh: int = 0
    _acked: int = 0
    _released: int = 0
    _acked_parts: list[Sequence[int]] = field(default_factory=list)
    _keys: dict[Key, str] = field(default_factory=dict)

    def acknowledged(self, sent: Sequence[int], outcomes: Sequence[str]) -> None:
        """The broker acknowledged the messages at ``sent`` (part of ``send``), each with
        the ack's outcome: ``duplicate``, or anything else (recorded as ``sent``)."""
        if not self.resumed and "duplicate" not in outcomes:
            self._acked += len(sent)  # the usual case: nothing to record per key
            self._acked_parts.append(sent)
            return
        keys = self.keys
        mine: list[int] = []
        for index, acked in zip(sent, outcomes, strict=True):
            key = keys[index]
            outcome = "duplicate" if acked == "duplicate" else "sent"
            if key in self.resumed:
                self._keys[key] = outcome
                continue
            if outcome != "sent":
                self._keys[key] = outcome  # overrides the write's "sent"
            mine.append(index)
        self._acked += len(mine)
        self._acked_parts.append(mine)

    def refused(self, sent: Sequence[int]) -> list[Key]:
        """The messages at ``sent`` were refused, nothing stored: the keys whose intents
        are to be released."""
        keys = [self.keys[i] for i in sent]
        self._released += sum(1 for k in keys if k not in self.resumed)
        return keys

    def confirmation(self) -> Confirmation:
        """What to record: the whole write when every intent of it was acknowledged."""
        if self._fresh and self._acked + self._released == self._fresh:
            return Confirmation((self.owner,), self._keys)
        keys = dict(self._keys)
        all_keys = self.keys
        for part in self._acked_parts:
            for index in part:
                keys.setdefault(all_keys[index], "sent")
        return Confirmation((), keys)


@dataclass(frozen=True, slots=True)
class LedgerOptions:
    """A :class:`Ledger`'s choices, whole and picklable: what a Spark task reopens its url with.

    Everything but the clock (a callable, injected in tests, is not shipped: executors
    use the wall clock).
    """

    in_doubt: InDoubtPolicy = "error"
    retention: timedelta | None = DEFAULT_RETENTION
    prune_limit: int = 1000
    prune_interval: timedelta = timedelta(hours=1)
    trust_window: bool = True

    def open(self, store: LedgerStore | str) -> Ledger:
        """A :class:`Ledger` on ``store`` with these choices."""
        return Ledger(
            store,
            in_doubt=self.in_doubt,
            retention=self.retention,
            prune_limit=self.prune_limit,
            prune_interval=self.prune_interval,
            trust_window=self.trust_window,
        )


def _deprecated_protocol(name: str) -> None:
    """Warn a caller of the write-ahead protocol's old public spelling ``Ledger.name``."""
    warnings.warn(
        f"Ledger.{name} is deprecated and goes in 0.2: the write-ahead protocol is driven by "
        "a sender's run (IdempotentSender(..., ledger=...)), not called by hand; to settle "
        "keys use Ledger.keys_in_doubt, Ledger.reconcile, Ledger.confirm or Ledger.release",
        DeprecationWarning,
        stacklevel=3,
    )


class Ledger:
    """A durable record of what was sent, so exactly-once outlives the broker's window.

    ``store`` is a :class:`LedgerStore` or a url (``sqlite:///path`` or
    ``postgresql://...``). ``in_doubt`` says what to do with a key whose send was
    never confirmed and whose window has passed: ``"error"`` (report ``InDoubtError``,
    the default) or ``"resend"`` (at-least-once). ``retention`` (default 30 days, or
    None: forever) is how long keys are kept; pruning is bounded per call.
    ``clock`` (wall time, aware ``datetime``) is injectable for tests.

    A new ledger is a decision: ``create`` says what to do when the url names no ledger
    (no SQLite file, or a database without the ledger's tables). ``True`` (the default)
    creates it, logging a warning on ``sendonce.ledger`` with its absolute path, and
    :attr:`created` says so; ``False`` refuses it with a ``ConfigurationError`` naming it:
    what a service that must find its ledger (a missing volume, a typo'd path would
    otherwise start an empty one and send everything again) should pass.

    ``trust_window`` (default True) lets a key left unconfirmed by a crash be resent inside
    the entity's duplicate-detection window, the broker dropping the copy. Pass False where
    the window is declared by hand and the broker cannot confirm it (the emulator, a key
    without Manage rights): every unconfirmed key is then in doubt at once and the intents
    written ahead are bounded by the transfers in flight, as without duplicate detection,
    so a wrong declaration costs keys in doubt after a crash, never a copy stored twice.
    """

    def __init__(
        self,
        store: LedgerStore | str,
        *,
        in_doubt: InDoubtPolicy = "error",
        retention: timedelta | None = DEFAULT_RETENTION,
        clock: WallClock | None = None,
        prune_limit: int = 1000,
        prune_interval: timedelta = timedelta(hours=1),
        create: bool = True,
        trust_window: bool = True,
    ) -> None:
        if in_doubt not in ("error", "resend"):
            raise ConfigurationError('in_doubt must be "error" or "resend"', field="in_doubt")
        if retention is not None and (
            not isinstance(retention, timedelta) or retention <= timedelta(0)
        ):
            raise ConfigurationError(
                "retention must be a positive timedelta or None (forever)", field="retention"
            )
        if not isinstance(prune_limit, int) or isinstance(prune_limit, bool) or prune_limit < 1:
            raise ConfigurationError("prune_limit must be an int >= 1", field="prune_limit")
        if not isinstance(prune_interval, timedelta) or prune_interval < timedelta(0):
            raise ConfigurationError(
                "prune_interval must be a timedelta >= 0", field="prune_interval"
            )
        if clock is not None and not callable(clock):
            raise ConfigurationError("clock must be a callable", field="clock")
        if not isinstance(create, bool):
            raise ConfigurationError("create must be True or False", field="create")
        if not isinstance(trust_window, bool):
            raise ConfigurationError("trust_window must be True or False", field="trust_window")
        self._owns_store = isinstance(store, str)
        self.store: LedgerStore = (
            open_store(store, create=create) if isinstance(store, str) else store
        )
        self.created: bool = bool(getattr(self.store, "created", False))
        """Whether this open created the ledger (the url named none)."""
        if self.created and self._owns_store:  # a store handed in: its opener reports it
            logger.warning(
                "ledger: created a new, empty ledger at %s (it did not exist)",
                shown_url(self.store.url),
            )
        self.in_doubt: InDoubtPolicy = in_doubt
        self.retention = retention
        self.clock: WallClock = clock or _now
        self.prune_limit = prune_limit
        self.prune_interval = prune_interval
        self.trust_window = trust_window
        """Whether an unconfirmed key inside the entity's window may be resent after a crash
        (False: the window was declared, not read from the broker; see the class)."""
        self._last_prune: datetime | None = None

    @property
    def url(self) -> str:
        """The store's url: what Spark executors open (a SQLite path is always absolute)."""
        return self.store.url

    @property
    def options(self) -> LedgerOptions:
        """This ledger's choices, to open the same url elsewhere with them (Spark tasks)."""
        return LedgerOptions(
            self.in_doubt, self.retention, self.prune_limit, self.prune_interval, self.trust_window
        )

    def __repr__(self) -> str:
        return f"Ledger({type(self.store).__name__}, in_doubt={self.in_doubt!r})"

    def close(self) -> None:
        """Close the store if this ledger opened it from a url."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def check_window(self, window: timedelta | None, entity: str) -> None:
        """Keys must outlive the broker's memory of them, or the ledger would forget first.

        ``window`` is how long the broker remembers an id: None when it remembers by
        count or not at all (see :meth:`check_entity`, which knows which).
        """
        if self.retention is not None and window is not None and self.retention <= window:
            raise ConfigurationError(
                f"ledger retention {self.retention} is not longer than entity {entity!r}'s "
                f"duplicate-detection window {window}",
                field="retention",
            )

    def check_entity(self, profile: EntityProfile) -> None:
        """:meth:`check_window` against the window ``profile``'s broker actually keeps.

        An entity without duplicate detection remembers nothing: its configured (unused)
        window puts no bound on the retention.
        """
        window = profile.window if profile.duplicate_detection else None
        self.check_window(window, profile.name)

    def in_doubt_message(
        self,
        message_id: str,
        row: Entry,
        *,
        window: timedelta,
        profile: EntityProfile | None = None,
    ) -> str:
        """Why the unconfirmed key ``row`` is in doubt, and what to do: the InDoubtError text.

        Where the broker keeps no window (``window`` zero: no duplicate detection, or a
        count-bounded cache), an intent younger than :data:`IN_FLIGHT_HORIZON` may belong
        to a producer that is still sending it (another process sharing the ledger). Any
        other was left by a producer that stopped before it recorded the broker's ack: with
        a window, a key is in doubt only once its producer's own deadline (first attempt +
        window - margin) has passed, so that producer is no longer sending it. ``profile``
        (the entity's) names its rule: no duplicate detection, an id cache, or a window this
        ledger does not trust (``trust_window=False``: declared, not read from the broker).
        """
        written = row.first_attempt.isoformat()
        age = (self.clock() - row.first_attempt).total_seconds()
        if window > timedelta(0):
            why = f"its duplicate-detection window ({window}) has passed"
        elif profile is not None and profile.duplicate_detection and profile.id_cache_size:
            why = (
                f"the entity remembers ids by count (the last {profile.id_cache_size}), not "
                "by time, so nothing says it still remembers this one"
            )
        elif profile is not None and profile.duplicate_detection:
            why = (
                f"the entity's duplicate-detection window ({profile.window}) was declared, not "
                "read from the broker, so nothing proves the broker would drop a copy"
            )
        else:
            why = "the entity has no duplicate detection"
        if window <= timedelta(0) and 0 <= age < IN_FLIGHT_HORIZON.total_seconds():
            return (
                f"message {message_id!r} is in doubt: another producer wrote its intent "
                f"{age:.1f}s ago (at {written}) and has not confirmed it yet; it may still be "
                f"sending it, and {why}, so sending it here too could duplicate it. It was not "
                "sent. Run again once that producer is done: a key it confirmed is then "
                "skipped, and one it never confirms stays in doubt."
            )
        return (
            f"message {message_id!r} is in doubt: a send first attempted at {written} was "
            f"never confirmed (the producer that wrote its intent stopped before the ack was "
            f"recorded) and {why}, so resending could duplicate it. It was not sent. Compare "
            "it with the broker and resolve it by hand (Ledger.confirm or Ledger.release, see "
            "docs/ledger.md), or use Ledger(in_doubt='resend') to accept at-least-once."
        )

    # -- the per-transfer protocol (driven by a sender's run, ``ledger._run``) ----------

    def _new_owner(self) -> str:
        """A fresh owner token for one sender call's intents."""
        return secrets.token_hex(8)

    def _prepare(
        self,
        entity: str,
        batch: Sequence[Message],
        keys: Sequence[Key],
        *,
        window: timedelta,
        margin: timedelta,
        confirm: Confirmation | Mapping[Key, str] | None = None,
        staged: bool = False,
    ) -> Prepared:
        """Write the intents of ``batch`` durably (one transfer) and decide what to send.

        ``window`` is how long the broker remembers an id (zero without duplicate
        detection); ``confirm`` carries the previous transfer's confirmation.
        ``staged`` (only where ``_stages``): the intents are staged, to be sent only
        once ``_arm`` returns True; until then another writer may take them over.
        """
        now = self.clock()
        owner = self._new_owner()
        digests = body_digests(batch)
        extra = {"staged": True} if staged else {}
        existing = self.store.record_intents(
            entity,
            keys,
            digests,
            first_attempt=now,
            owner=owner,
            confirm=_confirmation(confirm),
            **extra,
        )
        prepared = Prepared(owner=owner, keys=keys)
        if not existing:
            prepared.send = list(range(len(batch)))
            prepared._fresh = len(batch)
            return prepared
        send, resumed = prepared.send, prepared.resumed
        for index, (message, key, digest) in enumerate(zip(batch, keys, digests, strict=True)):
            row = existing.get(key)
            if row is None or (row.owner == owner and row.confirmed_at is None):
                send.append(index)
                prepared._fresh += 1
            elif not same_body(row, digest, message):
                prepared.conflicts.append((index, row))
            elif row.confirmed_at is not None:
                prepared.confirmed.append((index, row))
            elif window > timedelta(0) and now < row.first_attempt + window - margin:
                send.append(index)
                resumed.add(key)
                if prepared.started is None or row.first_attempt < prepared.started:
                    prepared.started = row.first_attempt
            elif self.in_doubt == "resend":
                logger.warning(
                    "ledger: message %r of %r was sent at %s and never confirmed, and %s: "
                    "resending it (in_doubt='resend', at-least-once: it may now be delivered "
                    "twice)",
                    message.message_id,
                    entity,
                    row.first_attempt.isoformat(),
                    "the broker's window has passed"
                    if window > timedelta(0)
                    else "nothing says the broker remembers its id",
                )
                send.append(index)
                resumed.add(key)
            else:
                prepared.in_doubt.append((index, row))
        return prepared

    @property
    def _stages(self) -> bool:
        """Whether the store can stage intents (write them ahead, unsent, and arm them
        later): both built-in stores can (PostgreSQL where its user may create the staged
        table); a store of your own may add ``arm`` and take
        ``record_intents(..., staged=True)``."""
        store = self.store
        return callable(getattr(store, "arm", None)) and getattr(store, "stages", True) is True

    def _arm(self, entity: str, owner: str, confirm: Confirmation | None = None) -> bool:
        """Arm ``owner``'s staged intents (with ``confirm``, one transaction): False if
        another writer took some of them over meanwhile, and none may be sent."""
        armed: bool = self.store.arm(  # type: ignore[attr-defined]
            entity, owner, _confirmation(confirm), self.clock()
        )
        return armed

    # -- the protocol's old public spellings (deprecated: a sender's run drives it) -------

    def new_owner(self) -> str:
        """Deprecated (goes in 0.2): the write-ahead protocol is internal to a sender's run."""
        _deprecated_protocol("new_owner")
        return self._new_owner()

    def prepare(
        self,
        entity: str,
        batch: Sequence[Message],
        keys: Sequence[Key],
        *,
        window: timedelta,
        margin: timedelta,
        confirm: Confirmation | Mapping[Key, str] | None = None,
        staged: bool = False,
    ) -> Prepared:
        """Deprecated (goes in 0.2): write intents and decide what to send, as a sender's run
        does; the behaviour is unchanged."""
        _deprecated_protocol("prepare")
        return self._prepare(
            entity, batch, keys, window=window, margin=margin, confirm=confirm, staged=staged
        )

    @property
    def stages(self) -> bool:
        """Deprecated (goes in 0.2): whether the store can stage intents written ahead."""
        _deprecated_protocol("stages")
        return self._stages

    def arm(self, entity: str, owner: str, confirm: Confirmation | None = None) -> bool:
        """Deprecated (goes in 0.2): arm ``owner``'s staged intents, as a sender's run does."""
        _deprecated_protocol("arm")
        return self._arm(entity, owner, confirm)

    def confirm(
        self,
        entity: str,
        confirmation: Confirmation | Mapping[KeyLike, str] | Mapping[Key, str],
    ) -> None:
        """Record the broker's acknowledgement (sent or duplicate) of these intents.

        By hand: ``ledger.confirm("orders", {Key("order-3", None): "sent"})`` once you have
        checked that the broker has ``order-3`` (None, or a bare id: no partition key).
        """
        resolved = _confirmation(confirmation)
        if resolved:
            self.store.confirm(entity, resolved, self.clock())

    def release(self, entity: str, keys: Sequence[KeyLike], owner: str) -> None:
        """Drop ``owner``'s intents for ``keys``: the broker refused them, nothing is stored."""
        if keys:
            self.store.release(entity, [as_key(k) for k in keys], owner)

    def lookup(self, entity: str, keys: Sequence[KeyLike]) -> dict[Key, Entry]:
        """The rows the ledger holds for ``keys`` (None or a bare id: no partition key)."""
        return self.store.lookup(entity, [as_key(k) for k in keys]) if keys else {}

    # -- retention -------------------------------------------------------------------

    def prune(self, limit: int | None = None) -> int:
        """Delete at most ``limit`` keys older than the retention; returns how many."""
        if self.retention is None:
            return 0
        now = self.clock()
        self._last_prune = now
        return self.store.prune(now - self.retention, limit or self.prune_limit)

    def maybe_prune(self) -> None:
        """Prune a bounded amount, at most once per ``prune_interval`` in this process."""
        if self.retention is None:
            return
        last = self._last_prune
        if last is not None and self.clock() - last < self.prune_interval:
            return
        try:
            self.prune()
        except Exception as exc:  # pruning is housekeeping: never fail a send for it
            logger.warning("ledger: pruning failed (%s); will retry later", exc)

    # -- keys in doubt -----------------------------------------------------------------

    def keys_in_doubt(
        self, entity: str, rule: InDoubtRule | EntityProfile, *, limit: int | None = None
    ) -> list[Unconfirmed]:
        """The unconfirmed keys of ``entity`` in doubt under its rule, oldest first.

        ``rule`` is the entity's :class:`~sendonce.ledger.InDoubtRule` or its profile (a
        backend's ``describe(entity)``): with a window, keys whose window has passed since
        their first attempt (a re-run inside it resends the others and the broker drops a
        copy); without duplicate detection or with an id cache, every unconfirmed key.
        """
        from ._doubt import InDoubtRule
        from ._inspect import unconfirmed

        known = InDoubtRule.of(rule) if isinstance(rule, EntityProfile) else rule
        return unconfirmed(self.store, entity, limit=limit, before=known.cutoff(self.clock()))

    def reconcile(
        self,
        backend: LocalBackend | str,
        entity: str,
        *,
        subscriptions: Sequence[str] = (),
        apply: bool = False,
        release_absent: bool = False,
        min_age: timedelta = IN_FLIGHT_HORIZON,
    ) -> Reconciliation:
        """Compare ``entity``'s unconfirmed keys with what the broker shows; with ``apply``,
        record what it proves.

        ``backend`` is a :class:`~sendonce.backends.local.LocalBackend` (or its ``local:``
        url, never created here), read exactly: what it stores and the ids it remembers; or
        a Service Bus connection string (the emulator's too), peeked (``subscriptions``: the
        topic's subscriptions to look at). ``apply=True`` confirms the keys the broker holds
        or remembers and releases those it proves it never stored (the next run sends
        them); ``release_absent=True`` also releases those it does not show (only if you
        know no consumer received them). A key written less than ``min_age`` ago is not
        released (its producer may still be sending it). Raises ``ConfigurationError``
        naming ``broker`` for a broker it cannot read (Artemis).
        """
        from ._reconcile import reconcile_ledger

        return reconcile_ledger(
            self,
            backend,
            entity,
            subscriptions=subscriptions,
            apply=apply,
            release_absent=release_absent,
            min_age=min_age,
        )
