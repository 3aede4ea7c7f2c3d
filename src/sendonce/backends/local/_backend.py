"""``LocalBackend``: the embedded broker with Service Bus and Artemis duplicate detection."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import compress, repeat
from types import TracebackType
from typing import Any, ClassVar, Literal, NamedTuple, NoReturn, TypeVar

from ..._entity import EntityProfile
from ..._message import Message
from ..._message_columns import MessageColumns
from ...errors import (
    ConfigurationError,
    LockLostError,
    NoSessionAvailableError,
    NotSentError,
    PermanentSendError,
    SendOnceError,
    ValidationError,
)
from .._base import Ack
from . import _sessions
from ._received import ROW_COLUMNS, ReceivedMessage, encode_extra, received_from_row
from ._sessions import LocalSession
from ._store import Durability, from_us, open_broker, to_us

__all__ = ["LocalBackend", "LocalSession", "LockLostError"]

T = TypeVar("T")
Clock = Callable[[], datetime]
ReceiveMode = Literal["receive_and_delete", "peek_lock"]
SubQueue = Literal["dead_letter"]

_US = timedelta(microseconds=1)
# Expired ids forgotten per send, at least: more than a send can add, so the id
# table stays bounded by the window without a stop-the-world sweep.
_HOUSEKEEPING_MIN = 256
_MAX_JSON_BATCH = 50_000
_SUBSCRIPTIONS = "SELECT name FROM subscriptions WHERE eid = ? ORDER BY name"


class MessageNotFoundError(SendOnceError):
    """A deferred message asked for by sequence number is not there to receive."""


_DUPLICATE = Ack("duplicate")
_IGNORED = Ack("ignored")


def _ack_maker() -> Callable[[int], Ack]:
    """A fast ``Ack("accepted", seq)``: a batch of 1000 acks is a visible share of a send.

    Sets the slots of the frozen dataclass directly; falls back to the constructor
    should ``Ack`` ever stop being a slotted dataclass.
    """
    try:
        set_outcome = Ack.__dict__["outcome"].__set__
        set_seq = Ack.__dict__["sequence_number"].__set__
    except (KeyError, AttributeError):  # pragma: no cover - depends on Ack's layout
        return lambda seq: Ack("accepted", seq)
    new = object.__new__

    def accepted(seq: int) -> Ack:
        ack = new(Ack)
        set_outcome(ack, "accepted")
        set_seq(ack, seq)
        return ack

    if accepted(1) != Ack("accepted", 1):  # pragma: no cover
        return lambda seq: Ack("accepted", seq)
    return accepted


_accepted = _ack_maker()


class _GroupRejected(Exception):
    """Internal: a transactional group met a duplicate and is rolled back whole."""

    def __init__(self, accepted: list[bool]) -> None:
        super().__init__("group rejected")
        self.accepted = accepted


def _locked_out(message: str) -> NotSentError:
    """Another process kept the write lock for the whole timeout: this call stored nothing.

    Every attempt was rolled back before it could commit, so the messages are not
    in doubt (a :class:`NotSentError`: retried, then reported as not stored).
    """
    # No condition of its own: the emulator maps it to Service Bus's server-busy.
    return NotSentError(f"{message}; nothing of this call was stored, so sending it again is safe")


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _profile_to_json(profile: EntityProfile) -> str:
    return json.dumps(
        {
            "kind": profile.kind,
            "duplicate_detection": profile.duplicate_detection,
            "window_us": profile.duplicate_detection_window // _US,
            "partitioned": profile.partitioned,
            "sessions": profile.sessions,
            "max_message_size": profile.max_message_size,
            "id_cache_size": profile.id_cache_size,
            "persist_id_cache": profile.persist_id_cache,
            "max_delivery_count": profile.max_delivery_count,
            "default_ttl_us": None
            if profile.default_message_time_to_live is None
            else profile.default_message_time_to_live // _US,
            "dead_letter_on_expiry": profile.dead_lettering_on_message_expiration,
        },
        sort_keys=True,
    )


def _check_same(wanted: EntityProfile, existing: EntityProfile) -> None:
    """Refuse an ``exist_ok`` create whose profile differs from the entity's."""
    for item in dataclasses.fields(EntityProfile):
        if getattr(existing, item.name) != getattr(wanted, item.name):
            raise ConfigurationError(
                f"entity {wanted.name!r} exists with {item.name}="
                f"{getattr(existing, item.name)!r}, not {getattr(wanted, item.name)!r}",
                field=item.name,
            )


def _profile_from_json(name: str, text: str) -> EntityProfile:
    data = json.loads(text)
    return EntityProfile(
        name,
        kind=data["kind"],
        duplicate_detection=data["duplicate_detection"],
        duplicate_detection_window=timedelta(microseconds=data["window_us"]),
        partitioned=data["partitioned"],
        sessions=data["sessions"],
        max_message_size=data["max_message_size"],
        id_cache_size=data["id_cache_size"],
        persist_id_cache=data["persist_id_cache"],
        max_delivery_count=data.get("max_delivery_count", 10),  # absent before it existed
        default_message_time_to_live=None
        if data.get("default_ttl_us") is None
        else timedelta(microseconds=data["default_ttl_us"]),
        dead_lettering_on_message_expiration=data.get("dead_letter_on_expiry", False),
    )


def _durability(value: object) -> Durability:
    if value == "normal":
        return "normal"
    if value == "full":
        return "full"
    raise ConfigurationError(
        f"durability must be 'normal' or 'full', got {value!r}", field="durability"
    )


def _flag(value: object, field: str) -> bool:
    """A bool, or its text from a url query (``?create=false``)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigurationError(f"{field} must be true or false, got {value!r}", field=field)


def _positive_seconds(value: object, field: str) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]  # url options arrive as str
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{field} must be a number of seconds, got {value!r}", field=field
        ) from None
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{field} must be positive, got {value!r}", field=field)
    return seconds


class LocalBackend:
    """A durable broker in one SQLite file, safe for many processes at once.

    It implements the Service Bus duplicate-detection semantics (time window,
    partition keys, sessions, scheduled messages sharing the id space, topics
    that deduplicate before fan-out) and, for entities with ``id_cache_size``,
    the Artemis ones (count-bounded id cache, persisted or not, all-or-nothing
    transactional groups). ``durability="normal"`` (WAL, ``synchronous=NORMAL``)
    keeps every acknowledged message through a crash of any process;
    ``"full"`` (``synchronous=FULL``) syncs to disk before acknowledging, so it
    also survives power loss.

    Every ``LocalBackend`` (and url sender) on one file in a process shares one
    connection, so opening and closing handles freely is safe; so is forking with
    a backend open (the child opens its own connection, even through a backend it
    inherited). ``create=False`` refuses a missing file instead of creating an
    empty broker (for tools where a typo must not start a new broker).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 60.0,
        create: bool | str = True,
        **options: object,
    ) -> None:
        if options:
            name = sorted(options)[0]
            raise ConfigurationError(f"unknown local broker option {name!r}", field=name)
        try:
            raw_path = os.fspath(path)
        except TypeError:
            raise ConfigurationError("path must be a file path", field="path") from None
        if not isinstance(raw_path, str) or not raw_path:
            raise ConfigurationError("path must be a non-empty str path", field="path")
        self._path = os.path.abspath(raw_path)
        if not os.path.isdir(os.path.dirname(self._path)):
            raise ConfigurationError(
                f"directory of broker file {self._path!r} does not exist", field="path"
            )
        if clock is not None and not callable(clock):
            raise ConfigurationError("clock must be a callable returning a datetime", field="clock")
        self._clock: Clock = clock or _utc_now
        self._durability = _durability(durability)
        self._busy_timeout = _positive_seconds(busy_timeout, "busy_timeout")
        create = _flag(create, "create")
        self._db = open_broker(
            self._path,
            durability=self._durability,
            busy_timeout=self._busy_timeout,
            create=create,
            on_restart=self._forget_volatile_caches,
        )
        # Each entity's profile as last read (its stored text, parsed): sends check and
        # encode their messages against it before taking the file's write lock.
        self._profiles: dict[str, tuple[str, EntityProfile]] = {}

    # -- plumbing -----------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The path as given (absolute); the file itself is at :attr:`real_path`."""
        return self._path

    @property
    def real_path(self) -> str:
        """The broker file with symbolic links resolved: how the process identifies it."""
        return self._db.real_path

    @property
    def durability(self) -> Durability:
        """``"normal"`` (survives process crashes) or ``"full"`` (also power loss)."""
        return self._durability

    def __repr__(self) -> str:
        return f"LocalBackend({self._path!r}, durability={self._durability!r})"

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the file. Idempotent.

        Every backend on one file in a process shares one connection; the last
        to close in the process closes it, and the last in any process records a
        clean close (the next start can skip the full check of a large file).
        """
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()

    def backup(self, target: str | os.PathLike[str]) -> None:
        """Copy the broker, while in use, into a new file ``target`` (never overwritten).

        Copying a live broker file with ``cp`` can catch it between a write to the
        WAL and a checkpoint and produce a damaged copy; this uses SQLite's online
        backup, which copies one consistent snapshot. The copy is a broker file
        like any other.
        """
        try:
            target_path = os.path.abspath(os.fspath(target))
        except TypeError:
            raise ConfigurationError("target must be a file path", field="target") from None
        if os.path.lexists(target_path):
            raise ConfigurationError(
                f"backup target {target_path!r} exists; a backup never overwrites a file",
                field="target",
            )
        if not os.path.isdir(os.path.dirname(target_path)):
            raise ConfigurationError(
                f"directory of backup target {target_path!r} does not exist", field="target"
            )
        partial = f"{target_path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
        copy = sqlite3.connect(partial)
        try:
            self._db.with_connection(lambda conn: conn.backup(copy))
            copy.close()
            try:
                os.link(partial, target_path)  # atomic, and never over an existing file
            except FileExistsError:
                raise ConfigurationError(
                    f"backup target {target_path!r} appeared during the backup; not overwritten",
                    field="target",
                ) from None
        finally:
            copy.close()
            for leftover in (partial, partial + "-journal", partial + "-wal", partial + "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)

    def _now(self) -> int:
        moment = self._clock()
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise ConfigurationError("clock must return a timezone-aware datetime", field="clock")
        return to_us(moment)

    def _write(
        self,
        work: Callable[[sqlite3.Connection], T],
        *,
        timeout: float,
        immediate: bool = True,
    ) -> T:
        if self._db.closed:
            raise ConfigurationError(f"{self!r} is closed", field="backend")
        return self._db.transaction(work, timeout=timeout, on_busy=_locked_out, immediate=immediate)

    def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return self._write(work, timeout=self._busy_timeout, immediate=False)

    def _forget_volatile_caches(self, conn: sqlite3.Connection) -> None:
        """First opener: the broker "restarts", so caches with persist_id_cache=False go.

        Session locks go too: no process had the file open, so none can hold a session.
        """
        conn.execute("DELETE FROM session_locks")
        for eid, name, text in conn.execute("SELECT eid, name, profile FROM entities").fetchall():
            if not _profile_from_json(name, text).persist_id_cache:
                conn.execute("DELETE FROM ids WHERE eid = ?", (eid,))
                conn.execute(
                    "UPDATE entities SET id_count = 0, first_stamp = NULL WHERE eid = ?", (eid,)
                )

    @staticmethod
    def _entity(
        conn: sqlite3.Connection, name: str, *, sending: bool = False
    ) -> tuple[int, EntityProfile, int, int]:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("entity must be a non-empty str", field="entity")
        row = conn.execute(
            "SELECT eid, profile, next_seq, id_count FROM entities WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            if sending:
                raise PermanentSendError(
                    f"entity {name!r} does not exist in the local broker",
                    condition="amqp:not-found",
                )
            raise ConfigurationError(
                f"entity {name!r} does not exist in the local broker", field="entity"
            )
        eid, text, next_seq, id_count = row
        return eid, _profile_from_json(name, text), next_seq, id_count

    @staticmethod
    def _sub(
        conn: sqlite3.Connection, eid: int, profile: EntityProfile, subscription: str | None
    ) -> str:
        if profile.kind == "queue":
            if subscription is not None:
                raise ConfigurationError(
                    f"{profile.name!r} is a queue; it has no subscription {subscription!r}",
                    field="subscription",
                )
            return ""
        if subscription is None:
            raise ConfigurationError(
                f"{profile.name!r} is a topic: name a subscription to read from",
                field="subscription",
            )
        if (
            conn.execute(
                "SELECT 1 FROM subscriptions WHERE eid = ? AND name = ?", (eid, subscription)
            ).fetchone()
            is None
        ):
            raise ConfigurationError(
                f"topic {profile.name!r} has no subscription {subscription!r}",
                field="subscription",
            )
        return subscription

    # -- sending ------------------------------------------------------------------------

    def describe(self, entity: str) -> EntityProfile:
        """The profile of ``entity`` as the broker enforces it."""
        return self._read(lambda conn: self._entity(conn, entity)[1])

    def send(
        self,
        entity: str,
        messages: Sequence[Message],
        *,
        timeout: float,
        atomic: bool = False,
        raw: Sequence[bytes | None] | None = None,
    ) -> list[Ack]:
        """Store ``messages`` in one transaction; one ack per message, in order.

        A message whose dedup key the entity remembers is acknowledged as
        ``"duplicate"`` and dropped (a second copy in the same call too). With
        ``atomic=True`` one duplicate makes the whole group ignored (Artemis).
        """
        return self._store(entity, messages, None, timeout=timeout, atomic=atomic, raw=raw)

    def schedule(
        self,
        entity: str,
        messages: Sequence[Message],
        at: datetime,
        *,
        timeout: float,
        raw: Sequence[bytes | None] | None = None,
    ) -> list[Ack]:
        """Store ``messages`` for delivery from ``at``; acks carry sequence numbers.

        Scheduled and ordinary messages share the duplicate-detection id space.
        """
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValidationError("at must be a timezone-aware datetime", field="at")
        return self._store(entity, messages, to_us(at), timeout=timeout, atomic=False, raw=raw)

    def _store(
        self,
        entity: str,
        messages: Sequence[Message],
        at: int | None,
        *,
        timeout: float,
        atomic: bool,
        raw: Sequence[bytes | None] | None,
    ) -> list[Ack]:
        if not isinstance(messages, MessageColumns):  # columns hold only plain messages
            messages = list(messages)
            for message in messages:
                if not isinstance(message, Message):
                    raise ValidationError(
                        f"messages must be Message objects, got {type(message).__name__}",
                        field="messages",
                    )
        raws: list[bytes | None] = [None] * len(messages) if raw is None else list(raw)
        if len(raws) != len(messages):
            raise ValidationError("raw must hold one entry per message", field="raw")
        seconds = _positive_seconds(timeout, "timeout")
        # The Python work (rule checks, stored columns, the dedup keys' JSON) is done
        # before the write transaction, against the entity's profile as last read,
        # so that processes sharing the file serialise on SQL only. The transaction
        # re-reads the profile and redoes the work if the entity changed meanwhile.
        known = self._profiles.get(entity) if isinstance(entity, str) else None
        early = None
        if known is not None and messages:
            early = _Batch.of(entity, known[0], known[1], messages, at, raws)

        def work(conn: sqlite3.Connection) -> tuple[int, list[bool] | None]:
            eid, text, base, ids = self._entity_row(conn, entity)
            if not messages:
                return base, None
            batch = early
            if batch is None or batch.text != text:
                profile = self._profile_of(entity, text)
                batch = _Batch.of(entity, text, profile, messages, at, raws)
            return base, self._store_in(conn, eid, batch, base, ids, atomic)

        try:
            base, accepted = self._write(work, timeout=seconds)
        except _GroupRejected as rejected:
            # Only the members the broker already holds are duplicates; the others were
            # dropped with the group and are stored nowhere: they must not look delivered.
            return [_DUPLICATE if not new else _IGNORED for new in rejected.accepted]
        if accepted is None:
            return list(map(_accepted, range(base, base + len(messages))))
        return [_accepted(base + i) if ok else _DUPLICATE for i, ok in enumerate(accepted)]

    def _entity_row(self, conn: sqlite3.Connection, name: str) -> tuple[int, str, int, _IdState]:
        """(eid, profile text, next sequence number, the state of its ids) of an entity."""
        if not isinstance(name, str) or not name:
            raise ConfigurationError("entity must be a non-empty str", field="entity")
        row = conn.execute(
            "SELECT eid, profile, next_seq, id_count, sweep_mid, sweep_pkey, first_stamp "
            "FROM entities WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            raise PermanentSendError(
                f"entity {name!r} does not exist in the local broker",
                condition="amqp:not-found",
            )
        eid, text, next_seq, id_count, sweep_mid, sweep_pkey, first_stamp = row
        return eid, text, next_seq, _IdState(id_count, (sweep_mid, sweep_pkey), first_stamp)

    def _profile_of(self, name: str, text: str) -> EntityProfile:
        """The profile stored as ``text``, parsed once per change and remembered."""
        known = self._profiles.get(name)
        if known is not None and known[0] == text:
            return known[1]
        profile = _profile_from_json(name, text)
        self._profiles[name] = (text, profile)
        return profile

    def _store_in(
        self,
        conn: sqlite3.Connection,
        eid: int,
        batch: _Batch,
        base: int,
        ids: _IdState,
        atomic: bool,
    ) -> list[bool] | None:
        """The SQL of a send, in its transaction; None when every message was new."""
        if batch.error is not None:
            raise batch.error
        profile = batch.profile
        n = batch.size
        now = self._now()
        conn.execute("UPDATE entities SET next_seq = next_seq + ? WHERE eid = ?", (n, eid))
        if profile.duplicate_detection:
            accepted = _remember(conn, eid, profile, batch, base, now, ids)
        else:
            accepted = [True] * n
        all_new = all(accepted)
        if atomic and not all_new:
            raise _GroupRejected(accepted)
        if profile.kind == "topic":
            subs = [r[0] for r in conn.execute(_SUBSCRIPTIONS, (eid,))]
        else:
            subs = [""]
        if not subs:
            return None if all_new else accepted
        _insert_messages(conn, eid, subs, base, now, batch.fields, None if all_new else accepted)
        return None if all_new else accepted

    def cancel_scheduled(
        self, entity: str, sequence_numbers: Sequence[int], *, timeout: float | None = None
    ) -> None:
        """Remove scheduled messages not yet delivered. Their ids stay remembered."""
        seqs = list(sequence_numbers)
        for seq in seqs:
            if not isinstance(seq, int) or isinstance(seq, bool):
                raise ValidationError("sequence numbers must be ints", field="sequence_numbers")

        def work(conn: sqlite3.Connection) -> None:
            eid, profile, _, _ = self._entity(conn, entity, sending=True)
            subs = [""]
            if profile.kind == "topic":
                subs = [r[0] for r in conn.execute(_SUBSCRIPTIONS, (eid,))]
            now = self._now()
            conn.executemany(
                "DELETE FROM messages WHERE eid = ? AND sub = ? AND seq = ? "
                "AND scheduled IS NOT NULL AND visible > ?",
                [(eid, sub, seq, now) for seq in seqs for sub in subs],
            )

        self._write(work, timeout=self._busy_timeout if timeout is None else timeout)

    # -- administration -----------------------------------------------------------------

    def create_entity(self, profile: EntityProfile, *, exist_ok: bool = False) -> None:
        """Create a queue or topic. Its duplicate-detection settings are fixed from now on."""
        if not isinstance(profile, EntityProfile):
            raise ConfigurationError("profile must be an EntityProfile", field="profile")
        text = _profile_to_json(profile)

        def existing(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT profile FROM entities WHERE name = ?", (profile.name,)
            ).fetchone()
            if row is None:
                return False
            if not exist_ok:
                raise ConfigurationError(f"entity {profile.name!r} already exists", field="entity")
            _check_same(profile, _profile_from_json(profile.name, row[0]))
            return True

        def work(conn: sqlite3.Connection) -> None:
            if not existing(conn):
                conn.execute(
                    "INSERT INTO entities (name, profile) VALUES (?, ?)", (profile.name, text)
                )

        # A read first: a sender opening on an existing entity needs no write lock, so
        # it does not wait behind other writers.
        if not self._read(existing):
            self._write(work, timeout=self._busy_timeout)

    def delete_entity(self, name: str) -> None:
        """Delete an entity with its messages, subscriptions and remembered ids."""

        def work(conn: sqlite3.Connection) -> None:
            eid = self._entity(conn, name)[0]
            for table in ("messages", "ids", "subscriptions", "session_states", "session_locks"):
                conn.execute(f"DELETE FROM {table} WHERE eid = ?", (eid,))
            conn.execute("DELETE FROM entities WHERE eid = ?", (eid,))

        self._write(work, timeout=self._busy_timeout)

    def entities(self) -> list[EntityProfile]:
        """The profile of every queue and topic in the broker, by name."""
        rows = self._read(
            lambda conn: conn.execute("SELECT name, profile FROM entities ORDER BY name").fetchall()
        )
        return [_profile_from_json(name, text) for name, text in rows]

    def create_subscription(self, topic: str, name: str, *, exist_ok: bool = False) -> None:
        """Add a subscription; it receives a copy of every message accepted from now on."""
        if not isinstance(name, str) or not name.strip() or "/" in name or len(name) > 50:
            raise ConfigurationError(
                f"subscription name {name!r} must be a non-empty str of at most 50 characters "
                "without '/'",
                field="subscription",
            )

        def work(conn: sqlite3.Connection) -> None:
            eid, profile, _, _ = self._entity(conn, topic)
            if profile.kind != "topic":
                raise ConfigurationError(
                    f"{topic!r} is a queue; only topics have subscriptions", field="topic"
                )
            cur = conn.execute(
                "INSERT OR IGNORE INTO subscriptions (eid, name) VALUES (?, ?)", (eid, name)
            )
            if cur.rowcount == 0 and not exist_ok:
                raise ConfigurationError(
                    f"topic {topic!r} already has subscription {name!r}", field="subscription"
                )

        self._write(work, timeout=self._busy_timeout)

    def subscriptions(self, topic: str) -> list[str]:
        """The names of ``topic``'s subscriptions (none: its messages are kept nowhere)."""

        def work(conn: sqlite3.Connection) -> list[str]:
            eid = self._entity(conn, topic)[0]
            return [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM subscriptions WHERE eid = ? ORDER BY name", (eid,)
                )
            ]

        return self._read(work)

    # -- receiving ----------------------------------------------------------------------

    @staticmethod
    def _max(max_messages: int) -> int:
        if not isinstance(max_messages, int) or isinstance(max_messages, bool) or max_messages < 1:
            raise ValidationError("max_messages must be a positive int", field="max_messages")
        return max_messages

    def receive(
        self,
        entity: str,
        *,
        max_messages: int = 1,
        subscription: str | None = None,
        session_id: str | None = None,
        mode: ReceiveMode = "receive_and_delete",
        lock_duration: timedelta = timedelta(seconds=60),
        sub_queue: SubQueue | None = None,
    ) -> list[ReceivedMessage]:
        """Take up to ``max_messages`` available messages, oldest sequence number first.

        ``receive_and_delete`` removes them; ``peek_lock`` locks them for
        ``lock_duration`` until :meth:`complete` or :meth:`abandon` (an expired
        lock makes the message available again, with its delivery count kept).
        A message delivered ``max_delivery_count`` times (the entity profile's)
        and not settled moves to the dead-letter subqueue instead, with the
        reason ``MaxDeliveryCountExceeded``, as Service Bus does.
        ``sub_queue="dead_letter"`` reads the dead-letter subqueue.
        """
        limit = self._max(max_messages)
        _check_sub_queue(sub_queue)
        if mode not in ("receive_and_delete", "peek_lock"):
            raise ValidationError(
                f"mode must be 'receive_and_delete' or 'peek_lock', got {mode!r}", field="mode"
            )
        if not isinstance(lock_duration, timedelta) or lock_duration <= timedelta(0):
            raise ValidationError(
                "lock_duration must be a positive timedelta", field="lock_duration"
            )

        def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = _in(self._sub(conn, eid, profile, subscription), sub_queue)
            now = self._now()
            skip_locked = False
            if sub_queue is None and session_id is not None:
                # A session someone holds (a LocalSession or an emulator client) is theirs.
                _sessions.refuse_if_locked(conn, eid, sub, session_id, now, entity, subscription)
            elif sub_queue is None and profile.sessions:
                skip_locked = True
            return self._take(
                conn,
                eid,
                sub,
                profile,
                now,
                limit=limit,
                mode=mode,
                until=now + lock_duration // _US,
                session_id=session_id,
                retire=sub_queue is None,
                skip_locked_sessions=skip_locked,
            )

        return self._write(work, timeout=self._busy_timeout)

    @staticmethod
    def _take(
        conn: sqlite3.Connection,
        eid: int,
        sub: str,
        profile: EntityProfile,
        now: int,
        *,
        limit: int,
        mode: ReceiveMode,
        until: int,
        session_id: str | None,
        retire: bool,
        skip_locked_sessions: bool = False,
    ) -> list[ReceivedMessage]:
        """Receive up to ``limit`` available messages (locking them until ``until``)."""
        query = (
            f"SELECT {ROW_COLUMNS} FROM messages WHERE eid = ? AND sub = ? "
            "AND visible <= ? AND (locked_until IS NULL OR locked_until <= ?) "
            "AND deferred IS NULL"
        )
        params: list[Any] = [eid, sub, now, now]
        if session_id is not None:
            query += " AND session_id = ?"
            params.append(session_id)
        if skip_locked_sessions:
            query += _sessions.NOT_IN_LOCKED_SESSION
            params.append(now)
        query += " ORDER BY seq LIMIT ?"
        params.append(limit)
        rows = conn.execute(query, params).fetchall()
        # Only the messages about to be delivered are checked for expiry and delivery
        # count (a sweep of the whole entity made each receive scan it).
        while retire and _retire(conn, eid, sub, profile, now, rows):
            rows = conn.execute(query, params).fetchall()
        out = []
        # Columns: seq, ..., scheduled (0-7), locked_until, lock_token, delivery_count, raw.
        if mode == "receive_and_delete":
            conn.executemany(
                "DELETE FROM messages WHERE eid = ? AND sub = ? AND seq = ?",
                [(eid, sub, r[0]) for r in rows],
            )
            for r in rows:
                out.append(received_from_row((*r[:8], None, None, r[10] + 1, *r[11:])))
            return out
        for r in rows:
            token = str(uuid.uuid4())
            conn.execute(
                "UPDATE messages SET lock_token = ?, locked_until = ?, "
                "delivery_count = delivery_count + 1 WHERE eid = ? AND sub = ? AND seq = ?",
                (token, until, eid, sub, r[0]),
            )
            out.append(received_from_row((*r[:8], until, token, r[10] + 1, *r[11:])))
        return out

    def peek(
        self,
        entity: str,
        *,
        max_messages: int = 1,
        subscription: str | None = None,
        session_id: str | None = None,
        from_sequence_number: int | None = None,
        sub_queue: SubQueue | None = None,
    ) -> list[ReceivedMessage]:
        """Look at stored messages (scheduled and locked ones too) without taking them."""
        limit = self._max(max_messages)
        _check_sub_queue(sub_queue)

        def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = _in(self._sub(conn, eid, profile, subscription), sub_queue)
            query = f"SELECT {ROW_COLUMNS} FROM messages WHERE eid = ? AND sub = ? AND seq >= ?"
            params: list[Any] = [eid, sub, from_sequence_number or 0]
            if sub_queue is None:  # expired messages are gone (or dead-lettered) for a peek too
                expiry, ttl_params = _expiry_sql(profile)
                query += (  # NULL expiry: never expires
                    f" AND NOT COALESCE({expiry} <= ? "
                    "AND (locked_until IS NULL OR locked_until <= ?), 0)"
                )
                now = self._now()
                params += [*ttl_params, now, now]
            if session_id is not None:
                query += " AND session_id = ?"
                params.append(session_id)
            query += " ORDER BY seq LIMIT ?"
            params.append(limit)
            return [received_from_row(r) for r in conn.execute(query, params).fetchall()]

        return self._read(work)

    def count(
        self,
        entity: str,
        *,
        subscription: str | None = None,
        sub_queue: SubQueue | None = None,
    ) -> int:
        """Messages available now: not scheduled for later, not locked."""
        _check_sub_queue(sub_queue)

        def work(conn: sqlite3.Connection) -> int:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = _in(self._sub(conn, eid, profile, subscription), sub_queue)
            now = self._now()
            row = conn.execute(
                "SELECT count(*) FROM messages WHERE eid = ? AND sub = ? AND visible <= ? "
                "AND (locked_until IS NULL OR locked_until <= ?) AND deferred IS NULL",
                (eid, sub, now, now),
            ).fetchone()
            return int(row[0])

        return self._read(work)

    _WHERE_LOCKED = "WHERE eid = ? AND sub = ? AND lock_token = ? AND locked_until > ?"
    # Settlements: operation -> (verb for errors, SQL over a locked message).
    _SETTLEMENTS: ClassVar[dict[str, tuple[str, str]]] = {
        "complete": ("complete", "DELETE FROM messages " + _WHERE_LOCKED),
        "abandon": (
            "abandon",
            "UPDATE messages SET lock_token = NULL, locked_until = NULL " + _WHERE_LOCKED,
        ),
        "dead_letter": (
            "dead-letter",
            "UPDATE messages SET sub = sub || ?, lock_token = NULL, locked_until = NULL, "
            "dl_reason = ?, dl_description = ?, deferred = NULL " + _WHERE_LOCKED,
        ),
        "defer": (
            "defer",
            "UPDATE messages SET lock_token = NULL, locked_until = NULL, deferred = 1 "
            + _WHERE_LOCKED,
        ),
    }

    def _settle(
        self,
        entity: str,
        lock_token: str,
        subscription: str | None,
        operation: str,
        sub_queue: SubQueue | None = None,
        values: tuple[Any, ...] = (),
        session: LocalSession | None = None,
    ) -> None:
        _check_sub_queue(sub_queue)
        verb, sql = self._SETTLEMENTS[operation]
        if not isinstance(lock_token, str) or not lock_token:
            raise ValidationError("lock_token must be a non-empty str", field="lock_token")

        def work(conn: sqlite3.Connection) -> None:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = _in(self._sub(conn, eid, profile, subscription), sub_queue)
            now = self._now()
            if session is not None:
                _sessions.check_held(
                    conn, eid, sub, session.session_id, session._token, now, entity, subscription
                )
                sql_here = sql + " AND session_id = ?"
                params: tuple[Any, ...] = (*values, eid, sub, lock_token, now, session.session_id)
            else:
                sql_here = sql
                params = (*values, eid, sub, lock_token, now)
            if conn.execute(sql_here, params).rowcount == 0:
                _lock_lost(entity, lock_token, verb)

        self._write(work, timeout=self._busy_timeout)

    def complete(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        sub_queue: SubQueue | None = None,
    ) -> None:
        """Remove a peek-locked message. Raises :class:`LockLostError` if the lock expired."""
        self._settle(entity, lock_token, subscription, "complete", sub_queue)

    def abandon(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        sub_queue: SubQueue | None = None,
    ) -> None:
        """Release a peek-locked message so it can be received again."""
        self._settle(entity, lock_token, subscription, "abandon", sub_queue)

    def dead_letter(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        reason: str | None = None,
        error_description: str | None = None,
        sub_queue: SubQueue | None = None,
    ) -> None:
        """Move a peek-locked message to the entity's dead-letter subqueue.

        It keeps its sequence number, body and properties; ``reason`` and
        ``error_description`` are handed out with it (Service Bus's
        ``DeadLetterReason`` and ``DeadLetterErrorDescription``). The
        duplicate-detection history is not touched: its id stays remembered.

        A message received from the dead-letter subqueue (``sub_queue="dead_letter"``)
        cannot be dead-lettered again: Service Bus documents that "you can't
        dead-letter a message from a DLQ"
        (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues);
        the message stays there with its reason, and its lock is released so it is
        delivered again, as the service does. Complete it to remove it.
        """
        _check_reason(reason, error_description)
        if sub_queue is not None:
            _check_sub_queue(sub_queue)
            self._settle(entity, lock_token, subscription, "abandon", sub_queue)
            return
        self._settle(
            entity,
            lock_token,
            subscription,
            "dead_letter",
            values=(DEAD_LETTER_SUFFIX, reason, error_description),
        )

    def defer(self, entity: str, lock_token: str, *, subscription: str | None = None) -> None:
        """Set a peek-locked message aside: only :meth:`receive_deferred` hands it out again.

        Service Bus deferral: the message stays in the entity, keeps its sequence
        number, shows in :meth:`peek`, and is not delivered by :meth:`receive`
        (https://learn.microsoft.com/azure/service-bus-messaging/message-deferral).
        """
        self._settle(entity, lock_token, subscription, "defer")

    def receive_deferred(
        self,
        entity: str,
        sequence_numbers: Sequence[int],
        *,
        subscription: str | None = None,
        session_id: str | None = None,
        mode: ReceiveMode = "peek_lock",
        lock_duration: timedelta = timedelta(seconds=60),
    ) -> list[ReceivedMessage]:
        """Receive deferred messages by sequence number (settle them as any locked message).

        Raises :class:`MessageNotFoundError` when one of them is not a deferred
        message of the entity (as Service Bus does); nothing is received then.
        """
        wanted = _sequence_numbers(sequence_numbers)
        _check_mode(mode)

        def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = self._sub(conn, eid, profile, subscription)
            now = self._now()
            if session_id is not None:
                _sessions.refuse_if_locked(conn, eid, sub, session_id, now, entity, subscription)
            return self._take_deferred(
                conn,
                eid,
                sub,
                now,
                entity,
                wanted,
                mode=mode,
                until=now + lock_duration // _US,
                session_id=session_id,
                skip_locked_sessions=session_id is None and profile.sessions,
            )

        return self._write(work, timeout=self._busy_timeout)

    @staticmethod
    def _take_deferred(
        conn: sqlite3.Connection,
        eid: int,
        sub: str,
        now: int,
        entity: str,
        wanted: list[int],
        *,
        mode: ReceiveMode,
        until: int,
        session_id: str | None,
        skip_locked_sessions: bool,
    ) -> list[ReceivedMessage]:
        out = []
        for seq in wanted:
            row = conn.execute(
                f"SELECT {ROW_COLUMNS} FROM messages WHERE eid = ? AND sub = ? AND seq = ? "
                "AND deferred = 1 AND (locked_until IS NULL OR locked_until <= ?)",
                (eid, sub, seq, now),
            ).fetchone()
            if (
                row is not None
                and session_id is None
                and skip_locked_sessions
                and row[3] is not None
                and _sessions.holder(conn, eid, sub, row[3], now) is not None
            ):
                row = None  # its session is someone else's
            if row is None or (session_id is not None and row[3] != session_id):
                raise MessageNotFoundError(
                    f"{entity!r} has no deferred message with sequence number {seq} "
                    "available (never deferred, settled, or locked by another receiver)"
                )
            if mode == "receive_and_delete":
                conn.execute(
                    "DELETE FROM messages WHERE eid = ? AND sub = ? AND seq = ?",
                    (eid, sub, seq),
                )
                out.append(received_from_row((*row[:8], None, None, row[10] + 1, *row[11:])))
                continue
            token = str(uuid.uuid4())
            conn.execute(
                "UPDATE messages SET lock_token = ?, locked_until = ?, "
                "delivery_count = delivery_count + 1 WHERE eid = ? AND sub = ? AND seq = ?",
                (token, until, eid, sub, seq),
            )
            out.append(received_from_row((*row[:8], until, token, row[10] + 1, *row[11:])))
        return out

    def renew_lock(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        lock_duration: timedelta = timedelta(seconds=60),
        sub_queue: SubQueue | None = None,
    ) -> datetime:
        """Extend a peek lock; returns the new expiry."""
        result: list[datetime] = []
        _check_sub_queue(sub_queue)

        def work(conn: sqlite3.Connection) -> None:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = _in(self._sub(conn, eid, profile, subscription), sub_queue)
            now = self._now()
            until = now + lock_duration // _US
            cur = conn.execute(
                "UPDATE messages SET locked_until = ? " + self._WHERE_LOCKED,
                (until, eid, sub, lock_token, now),
            )
            if cur.rowcount == 0:
                _lock_lost(entity, lock_token, "renew the lock of")
            result.append(datetime.fromtimestamp(0, UTC) + until * _US)

        self._write(work, timeout=self._busy_timeout)
        return result[0]

    def get_session_state(
        self, entity: str, session_id: str, *, subscription: str | None = None
    ) -> bytes | None:
        """The state an application stored for a session (None when it has none).

        Service Bus keeps session state with the session, up to the entity's
        maximum message size, whether or not the session has messages; the state
        is kept in the broker file so the emulator and ``local://`` share it.
        """
        _check_session_id(session_id)

        def work(conn: sqlite3.Connection) -> bytes | None:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = self._sub(conn, eid, profile, subscription)
            row = conn.execute(
                "SELECT state FROM session_states WHERE eid = ? AND sub = ? AND session_id = ?",
                (eid, sub, session_id),
            ).fetchone()
            return None if row is None else bytes(row[0])

        return self._read(work)

    def set_session_state(
        self,
        entity: str,
        session_id: str,
        state: bytes | None,
        *,
        subscription: str | None = None,
    ) -> None:
        """Store (or with None, clear) the state of a session."""
        _check_session_id(session_id)
        if state is not None and not isinstance(state, bytes | bytearray | memoryview):
            raise ValidationError("state must be bytes or None", field="state")

        def work(conn: sqlite3.Connection) -> None:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = self._sub(conn, eid, profile, subscription)
            _put_state(conn, eid, sub, profile, session_id, state)

        self._write(work, timeout=self._busy_timeout)

    # -- session receivers --------------------------------------------------------------

    def accept_session(
        self,
        entity: str,
        session_id: str | None = None,
        *,
        subscription: str | None = None,
        max_wait_time: float | None = None,
        lock_duration: timedelta = timedelta(seconds=60),
    ) -> LocalSession:
        """Lock a session of a sessionful queue or subscription to a new receiver.

        ``session_id`` names the session (it need not have messages yet), or with
        ``None`` the broker picks the next available session, as azure-servicebus's
        ``NEXT_AVAILABLE_SESSION`` does: one that no receiver holds and that has a
        message available now (the one with the oldest such message). It waits up
        to ``max_wait_time`` seconds for one (``None`` or 0: no waiting) and then
        raises :class:`~sendonce.errors.NoSessionAvailableError`. The wait ends
        when either the broker's clock (the ``clock`` of this backend) or the real
        clock has gone ``max_wait_time`` past its start.

        A session that another receiver holds (a :class:`LocalSession` of any
        handle or process, or an emulator client) raises
        :class:`~sendonce.errors.SessionCannotBeLockedError` at once. The lock
        lasts ``lock_duration`` unless :meth:`LocalSession.renew_lock` extends it;
        an expired lock frees the session for the next receiver. The returned
        :class:`LocalSession` is a context manager that releases the session.
        """
        if session_id is not None:
            _check_session_id(session_id)
        if not isinstance(lock_duration, timedelta) or lock_duration <= timedelta(0):
            raise ValidationError(
                "lock_duration must be a positive timedelta", field="lock_duration"
            )
        wait = _wait_seconds(max_wait_time)
        token = uuid.uuid4().hex

        def place(conn: sqlite3.Connection) -> tuple[int, str]:
            eid, profile, _, _ = self._entity(conn, entity)
            sub = self._sub(conn, eid, profile, subscription)
            if not profile.sessions:
                raise ConfigurationError(
                    f"{entity!r} does not require sessions: receive from it without a session "
                    "(a session receiver needs an entity created with sessions=True)",
                    field="entity",
                )
            return eid, sub

        def lock(conn: sqlite3.Connection) -> tuple[str, int] | None:
            eid, sub = place(conn)
            now = self._now()
            wanted = session_id
            if wanted is None:
                row = conn.execute(_sessions.NEXT_SESSION, (eid, sub, now)).fetchone()
                if row is None:
                    return None
                wanted = str(row[0])
            until = now + lock_duration // _US
            if _sessions.acquire(conn, eid, sub, wanted, token, until, now):
                return wanted, until
            if session_id is None:
                return None  # taken meanwhile: look again
            raise _sessions.cannot_lock(entity, subscription, wanted)

        def available(conn: sqlite3.Connection) -> bool:
            eid, sub = place(conn)
            return (
                conn.execute(_sessions.NEXT_SESSION, (eid, sub, self._now())).fetchone() is not None
            )

        started, started_real = self._now(), time.monotonic()
        pause = 0.005
        while True:
            # A read first: waiting receivers must not take the broker's write lock.
            got = (
                self._write(lock, timeout=self._busy_timeout)
                if session_id is not None or self._read(available)
                else None
            )
            if got is not None:
                name, until = got
                return LocalSession(
                    self, entity, subscription, name, token, from_us(until), lock_duration
                )
            waited = max((self._now() - started) * 1e-6, time.monotonic() - started_real)
            if waited >= wait:
                place_name = (
                    entity if subscription is None else f"{entity}/Subscriptions/{subscription}"
                )
                raise NoSessionAvailableError(
                    f"no session of {place_name!r} is free with a message available"
                    + (f" (waited {wait:g} s)" if wait else ""),
                    entity=entity,
                )
            time.sleep(min(pause, max(wait - waited, 0.001)))
            pause = min(pause * 2, 0.1)

    def _session_place(self, conn: sqlite3.Connection, session: LocalSession) -> tuple[int, str]:
        eid, profile, _, _ = self._entity(conn, session.entity)
        return eid, self._sub(conn, eid, profile, session.subscription)

    def _held(self, conn: sqlite3.Connection, session: LocalSession) -> tuple[int, str, int, int]:
        """(eid, sub, now, locked_until) of a session this receiver still holds."""
        if session.closed:
            raise _sessions.lock_lost(session.entity, session.subscription, session.session_id)
        eid, sub = self._session_place(conn, session)
        now = self._now()
        until = _sessions.check_held(
            conn,
            eid,
            sub,
            session.session_id,
            session._token,
            now,
            session.entity,
            session.subscription,
        )
        return eid, sub, now, until

    def _session_receive(
        self, session: LocalSession, *, max_messages: int, mode: ReceiveMode
    ) -> list[ReceivedMessage]:
        limit = self._max(max_messages)
        _check_mode(mode)

        def anything(conn: sqlite3.Connection) -> bool:
            eid, sub, now, _ = self._held(conn, session)
            return (
                conn.execute(
                    "SELECT 1 FROM messages WHERE eid = ? AND sub = ? AND session_id = ? "
                    "AND visible <= ? AND (locked_until IS NULL OR locked_until <= ?) "
                    "AND deferred IS NULL LIMIT 1",
                    (eid, sub, session.session_id, now, now),
                ).fetchone()
                is not None
            )

        def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
            eid, sub, now, until = self._held(conn, session)
            profile = self._entity(conn, session.entity)[1]
            # The session's messages are locked with the session: same expiry, renewed with it.
            return self._take(
                conn,
                eid,
                sub,
                profile,
                now,
                limit=limit,
                mode=mode,
                until=until,
                session_id=session.session_id,
                retire=True,
            )

        # A read first: an idle receiver polling an empty session takes no write lock.
        if not self._read(anything):
            return []
        return self._write(work, timeout=self._busy_timeout)

    def _session_receive_deferred(
        self, session: LocalSession, sequence_numbers: Sequence[int], *, mode: ReceiveMode
    ) -> list[ReceivedMessage]:
        wanted = _sequence_numbers(sequence_numbers)
        _check_mode(mode)

        def work(conn: sqlite3.Connection) -> list[ReceivedMessage]:
            eid, sub, now, until = self._held(conn, session)
            return self._take_deferred(
                conn,
                eid,
                sub,
                now,
                session.entity,
                wanted,
                mode=mode,
                until=until,
                session_id=session.session_id,
                skip_locked_sessions=False,
            )

        return self._write(work, timeout=self._busy_timeout)

    def _session_settle(
        self,
        session: LocalSession,
        operation: str,
        message: ReceivedMessage | str,
        *,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        token = message.lock_token if isinstance(message, ReceivedMessage) else message
        if not isinstance(token, str) or not token:
            raise ValidationError(
                "settle a message received in peek-lock mode (or its lock token)",
                field="message",
            )
        values: tuple[Any, ...] = ()
        if operation == "dead_letter":
            _check_reason(reason, error_description)
            values = (DEAD_LETTER_SUFFIX, reason, error_description)
        self._settle(
            session.entity,
            token,
            session.subscription,
            operation,
            values=values,
            session=session,
        )

    def _session_state(
        self, session: LocalSession, *, get: bool, state: bytes | None = None
    ) -> bytes | None:
        if not get and state is not None and not isinstance(state, bytes | bytearray | memoryview):
            raise ValidationError("state must be bytes or None", field="state")

        def work(conn: sqlite3.Connection) -> bytes | None:
            eid, sub, _, _ = self._held(conn, session)
            if get:
                row = conn.execute(
                    "SELECT state FROM session_states WHERE eid = ? AND sub = ? AND session_id = ?",
                    (eid, sub, session.session_id),
                ).fetchone()
                return None if row is None else bytes(row[0])
            profile = self._entity(conn, session.entity)[1]
            _put_state(conn, eid, sub, profile, session.session_id, state)
            return None

        if get:
            return self._read(work)
        return self._write(work, timeout=self._busy_timeout)

    def _session_renew(self, session: LocalSession) -> datetime:
        def work(conn: sqlite3.Connection) -> int:
            if session.closed:
                raise _sessions.lock_lost(session.entity, session.subscription, session.session_id)
            eid, sub = self._session_place(conn, session)
            now = self._now()
            until = now + session.lock_duration // _US
            if not _sessions.renew(conn, eid, sub, session.session_id, session._token, until, now):
                raise _sessions.lock_lost(session.entity, session.subscription, session.session_id)
            return until

        return from_us(self._write(work, timeout=self._busy_timeout))

    def _session_release(self, session: LocalSession) -> None:
        if self._db.closed:
            return  # nothing to release through: the lock runs out by itself

        def work(conn: sqlite3.Connection) -> None:
            try:
                eid, sub = self._session_place(conn, session)
            except ConfigurationError:
                return  # the entity was deleted meanwhile
            _sessions.release(conn, eid, sub, session.session_id, session._token, self._now())

        self._write(work, timeout=self._busy_timeout)

    def purge(self, entity: str, *, subscription: str | None = None) -> int:
        """Delete stored messages (a topic without ``subscription``: all of its copies).

        Remembered ids stay: purging does not reopen the duplicate-detection window.
        """

        def work(conn: sqlite3.Connection) -> int:
            eid, profile, _, _ = self._entity(conn, entity)
            if profile.kind == "topic" and subscription is None:
                return conn.execute("DELETE FROM messages WHERE eid = ?", (eid,)).rowcount
            sub = self._sub(conn, eid, profile, subscription)
            return conn.execute(
                "DELETE FROM messages WHERE eid = ? AND sub = ?", (eid, sub)
            ).rowcount

        return self._write(work, timeout=self._busy_timeout)

    def stats(self, entity: str) -> dict[str, int]:
        """Counts for operators: available, scheduled, locked, stored messages, remembered ids."""

        def work(conn: sqlite3.Connection) -> dict[str, int]:
            eid, profile, next_seq, id_count = self._entity(conn, entity)
            now = self._now()
            available, scheduled, locked, total = conn.execute(
                "SELECT coalesce(sum(visible <= ?1 AND coalesce(locked_until, 0) <= ?1), 0), "
                "coalesce(sum(visible > ?1), 0), coalesce(sum(coalesce(locked_until, 0) > ?1), 0), "
                "count(*) FROM messages WHERE eid = ?2",
                (now, eid),
            ).fetchone()
            window = profile.window
            if window is None:
                remembered = id_count
            else:
                remembered = conn.execute(
                    "SELECT count(*) FROM ids WHERE eid = ? AND stamp > ?",
                    (eid, now - window // _US),
                ).fetchone()[0]
            subs = conn.execute(
                "SELECT count(*) FROM subscriptions WHERE eid = ?", (eid,)
            ).fetchone()[0]
            return {
                "available": int(available),
                "scheduled": int(scheduled),
                "locked": int(locked),
                "messages": int(total),
                "ids_remembered": int(remembered),
                "subscriptions": int(subs),
                "last_sequence_number": int(next_seq) - 1,
            }

        return self._read(work)

    def message_ids(self, entity: str, *, subscription: str | None = None) -> list[str]:
        """Every stored message id, scheduled and locked ones included, in sequence order.

        On a topic without ``subscription``: one entry per accepted topic message.
        """

        def work(conn: sqlite3.Connection) -> list[str]:
            eid, profile, _, _ = self._entity(conn, entity)
            if profile.kind == "topic" and subscription is None:
                sql = "SELECT message_id FROM messages WHERE eid = ? GROUP BY seq ORDER BY seq"
                return [r[0] for r in conn.execute(sql, (eid,))]
            sub = self._sub(conn, eid, profile, subscription)
            return [
                r[0]
                for r in conn.execute(
                    "SELECT message_id FROM messages WHERE eid = ? AND sub = ? ORDER BY seq",
                    (eid, sub),
                )
            ]

        return self._read(work)


# Stored fields (see _Batch.fields) that a whole batch may lack: (index, column name).
_OPTIONAL = ((1, "partition_key"), (2, "session_id"), (4, "extra"), (5, "scheduled"), (6, "raw"))
_UNSET = object()


@dataclasses.dataclass(frozen=True, slots=True)
class _Batch:
    """A send's messages, checked and turned into what its SQL binds, outside any lock.

    Built against one version of the entity's profile (``text``); the transaction
    uses it only if the profile it reads is still that one.
    """

    text: str
    profile: EntityProfile
    fields: Sequence[Sequence[Any]]
    """The stored fields, column by column: id, partition key, session id, body (bytes or
    str), extra, scheduled, raw; one entry per message in each."""
    keys: list[Any]
    """The dedup keys (duplicate detection on): ids, or [id, partition key] pairs."""
    key_chunks: list[str]
    """``keys`` as JSON arrays of at most ``_MAX_JSON_BATCH``."""
    error: PermanentSendError | None

    @property
    def size(self) -> int:
        return len(self.fields[0]) if self.fields else 0

    @classmethod
    def of(
        cls,
        entity: str,
        text: str,
        profile: EntityProfile,
        messages: list[Message] | MessageColumns,
        at: int | None,
        raws: list[bytes | None],
    ) -> _Batch:
        fields: Sequence[Sequence[Any]]
        if isinstance(messages, MessageColumns) and _plain(messages, profile):
            fields = _fields_of_columns(messages, at, raws)
        else:
            if isinstance(messages, MessageColumns):
                messages = messages.messages()  # the per-message checks name the culprit
            try:
                rows = _prepare(entity, profile, messages, at, raws)
            except PermanentSendError as exc:
                return cls(text, profile, [], [], [], exc)
            fields = list(zip(*rows, strict=True))
        keys: list[Any] = []
        chunks: list[str] = []
        if profile.duplicate_detection:
            if profile.partitioned:
                for message in messages:
                    mid, pkey = profile.dedup_key(message)
                    keys.append([mid, pkey or ""])
            else:
                keys = list(fields[0]) if fields else []
            chunks = [
                json.dumps(keys[start : start + _MAX_JSON_BATCH], ensure_ascii=False)
                for start in range(0, len(keys), _MAX_JSON_BATCH)
            ]
        return cls(text, profile, fields, keys, chunks, None)


def _prepare(
    entity: str,
    profile: EntityProfile,
    messages: list[Message],
    at: int | None,
    raws: list[bytes | None],
) -> list[tuple[Any, ...]]:
    """Check every message against the entity's rules and build its stored columns.

    Message itself guarantees partition key == session id, so only the size and,
    for a session entity, a missing session id can break a rule; the full check
    runs (and raises) for those. The optional properties of messages that share
    them (Spark rows with one content type) are encoded once per batch.
    """
    limit = profile.max_message_size
    sessions = profile.sessions
    extras: dict[tuple[Any, ...], str | None] = {}
    prepared = []
    for i, message in enumerate(messages):
        if message.size > limit or (sessions and message.session_id is None):
            try:
                profile.check(message)
            except ValidationError as exc:
                raise _refused(entity, message, exc) from None
        props = message.application_properties
        # id(props) is stable for this call: ``messages`` keeps every mapping alive.
        shape = (
            message.subject,
            message.content_type,
            message.correlation_id,
            message.time_to_live,
            None if props is None else id(props),
        )
        extra = extras.get(shape, _UNSET)
        if extra is _UNSET:
            extra = extras[shape] = encode_extra(message)
        when = at
        if when is None and message.scheduled_enqueue_time is not None:
            when = to_us(message.scheduled_enqueue_time)
        prepared.append(
            (
                message.message_id,
                message.partition_key,
                message.session_id,
                message.body,
                extra,
                when,
                raws[i],
            )
        )
    return prepared


def _plain(columns: MessageColumns, profile: EntityProfile) -> bool:
    """Columns no rule of the entity can refuse (what ``_prepare`` would check per message)."""
    return max(columns.sizes) <= profile.max_message_size and not (
        profile.sessions and columns.session_ids is None
    )


def _fields_of_columns(
    columns: MessageColumns, at: int | None, raws: list[bytes | None]
) -> list[Sequence[Any]]:
    """The stored fields of ``_prepare``'s rows, column by column, for plain columns.

    They share their optional properties (one factory) and have no schedule time
    of their own, so one ``extra`` and one ``when`` serve them all.
    """
    n = len(columns)
    nothing: list[Any] = [None] * n
    return [
        columns.message_ids,
        nothing if columns.partition_keys is None else columns.partition_keys,
        nothing if columns.session_ids is None else columns.session_ids,
        columns.bodies,
        [encode_extra(columns[0])] * n,
        [at] * n,
        raws,
    ]


def _insert_messages(
    conn: sqlite3.Connection,
    eid: int,
    subs: list[str],
    base: int,
    now: int,
    stored: Sequence[Sequence[Any]],
    accepted: list[bool] | None,
) -> None:
    """Store a batch's messages (those ``accepted`` marks, or all) in every ``subs`` subqueue.

    ``stored`` holds the seven stored fields (see ``_Batch.fields``) as columns. One
    ``executemany`` per subqueue, which binds per row only what the rows carry: an
    optional field no message has (a partition key, a schedule time, raw AMQP bytes)
    is a literal NULL in the statement. Message ``i`` gets sequence number ``base + i``.
    """
    seqs: Sequence[int] = range(base, base + len(stored[0]))
    fields: Sequence[Sequence[Any]] = stored
    if accepted is not None:
        seqs = list(compress(seqs, accepted))
        fields = [list(compress(values, accepted)) for values in stored]
    if not seqs:
        return
    bodies = fields[3]
    if set(map(type, bodies)) != {bytes}:  # str bodies are stored as their UTF-8 bytes
        bodies = [b.encode("utf-8") if isinstance(b, str) else b for b in bodies]
    columns = ["eid", "sub", "seq", "enqueued", "message_id", "body"]
    bound: list[Iterable[Any]] = [fields[0], bodies]
    for index, name in _OPTIONAL:
        values = fields[index]
        if values.count(None) != len(values):
            columns.append(name)
            bound.append(values)
    placeholders = [f"?{i}" for i in range(1, len(columns) + 1)]
    visible = "?4"  # due now, unless scheduled
    if "scheduled" in columns:
        visible = f"coalesce(?{columns.index('scheduled') + 1}, ?4)"
    sql = (
        f"INSERT INTO messages ({', '.join(columns)}, visible) "
        f"VALUES ({', '.join(placeholders)}, {visible})"
    )
    for sub in subs:
        conn.executemany(sql, zip(repeat(eid), repeat(sub), seqs, repeat(now), *bound))


def _remember(
    conn: sqlite3.Connection,
    eid: int,
    profile: EntityProfile,
    batch: _Batch,
    base: int,
    now: int,
    ids: _IdState,
) -> list[bool]:
    """Record the dedup keys; True for each message seen for the first time.

    One statement per chunk: an upsert over ``json_each`` that writes exactly
    the keys that are new (or whose window had expired); ``RETURNING`` names
    them when some were not.
    """
    partitioned = profile.partitioned
    select = "j.value ->> 0, j.value ->> 1" if partitioned else "j.value, ''"
    keys = batch.keys
    counted = profile.id_cache_size is not None
    window = profile.window
    cutoff = -1 if window is None else now - window // _US
    accepted = [False] * len(keys)
    first: dict[Any, int] | None = None
    new = 0
    sql = (
        f"INSERT INTO ids (eid, mid, pkey, stamp, ordinal) SELECT ?1, {select}, ?4, "
        "CASE WHEN ?2 THEN ?3 + j.key END FROM json_each(?5) AS j WHERE true "
        "ON CONFLICT (eid, mid, pkey) DO UPDATE SET stamp = excluded.stamp "
        "WHERE ids.stamp <= ?6"
    )
    for number, chunk in enumerate(batch.key_chunks):
        start = number * _MAX_JSON_BATCH
        size = min(_MAX_JSON_BATCH, len(keys) - start)
        params = (eid, counted, base + start, now, chunk, cutoff)
        # The usual case, every key new, needs only the count of rows written; when
        # some were duplicates, redo the chunk listing the keys that were new.
        conn.execute("SAVEPOINT remember")
        if conn.execute(sql, params).rowcount == size:
            conn.execute("RELEASE remember")
            accepted[start : start + size] = [True] * size
            new += size
            continue
        conn.execute("ROLLBACK TO remember")
        conn.execute("RELEASE remember")
        returned = conn.execute(sql + " RETURNING mid, pkey", params).fetchall()
        new += len(returned)
        if first is None:
            first = {}
            for i, key in enumerate(keys):
                first.setdefault(tuple(key) if partitioned else key, i)
        for mid, pkey in returned:
            accepted[first[(mid, pkey) if partitioned else mid]] = True
    id_count = ids.id_count
    if ids.first_stamp is None or now < ids.first_stamp:  # the first ids, or the clock went back
        conn.execute("UPDATE entities SET first_stamp = ? WHERE eid = ?", (now, eid))
    if counted:
        # Artemis: a fixed-size cache; the oldest ids make room for the new ones.
        assert profile.id_cache_size is not None
        id_count += new
        excess = id_count - profile.id_cache_size
        if excess > 0:
            conn.execute(
                "DELETE FROM ids WHERE eid = ?1 AND ordinal <= (SELECT ordinal FROM ids "
                "WHERE eid = ?1 AND ordinal IS NOT NULL ORDER BY ordinal LIMIT 1 OFFSET ?2)",
                (eid, excess - 1),
            )
            id_count = profile.id_cache_size
        conn.execute("UPDATE entities SET id_count = ? WHERE eid = ?", (id_count, eid))
    elif ids.first_stamp is not None and cutoff >= ids.first_stamp:  # some may have expired
        _sweep(conn, eid, ids.cursor, cutoff, max(_HOUSEKEEPING_MIN, 2 * len(keys)))
    return accepted


class _IdState(NamedTuple):
    """What an entity's row says about its dedup ids (see the schema's notes)."""

    id_count: int
    """Ids stored (count-bounded caches)."""
    cursor: tuple[str, str]
    """The key the last sweep stopped after."""
    first_stamp: int | None
    """The earliest stamp any of its ids got; None before the first."""


def _sweep(
    conn: sqlite3.Connection, eid: int, cursor: tuple[str, str], cutoff: int, span: int
) -> None:
    """Forget the expired ids among the ``span`` keys after ``cursor``, and move it on.

    The walk follows the table's own key order, so no index by age is kept up
    on every send. A send sweeps twice the keys it can add: the table stays
    within about twice the ids of one window. The cursor wraps to ``('', '')``
    (before every key: message ids are never empty) at the end of the keys.
    """
    mid, pkey = cursor
    bound = conn.execute(
        "SELECT mid, pkey FROM ids WHERE eid = ?1 AND (mid, pkey) > (?2, ?3) "
        "ORDER BY mid, pkey LIMIT 1 OFFSET ?4",
        (eid, mid, pkey, span - 1),
    ).fetchone()
    if bound is None:  # fewer than span keys left: sweep to the end, then start over
        conn.execute(
            "DELETE FROM ids WHERE eid = ?1 AND (mid, pkey) > (?2, ?3) AND stamp <= ?4",
            (eid, mid, pkey, cutoff),
        )
        bound = ("", "")
    else:
        conn.execute(
            "DELETE FROM ids WHERE eid = ?1 AND (mid, pkey) > (?2, ?3) "
            "AND (mid, pkey) <= (?4, ?5) AND stamp <= ?6",
            (eid, mid, pkey, *bound, cutoff),
        )
    if tuple(bound) != cursor:
        conn.execute(
            "UPDATE entities SET sweep_mid = ?, sweep_pkey = ? WHERE eid = ?", (*bound, eid)
        )


def _refused(entity: str, message: Message, exc: ValidationError) -> PermanentSendError:
    return PermanentSendError(
        f"entity {entity!r} refused message {message.message_id!r}: {exc}",
        message_id=message.message_id,
        partition_key=message.partition_key,
        condition="amqp:link:message-size-exceeded"
        if exc.field == "body"
        else "amqp:invalid-field",
    )


DEAD_LETTER_SUFFIX = "/$DeadLetterQueue"
MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"


def _check_sub_queue(sub_queue: object) -> None:
    if sub_queue is not None and sub_queue != "dead_letter":
        raise ValidationError(
            f"sub_queue must be None or 'dead_letter', got {sub_queue!r}", field="sub_queue"
        )


def _in(sub: str, sub_queue: SubQueue | None) -> str:
    """The ``sub`` key of a queue's or subscription's subqueue (itself for None)."""
    return sub if sub_queue is None else sub + DEAD_LETTER_SUFFIX


TTL_EXPIRED = "TTLExpiredException"


def _expiry_sql(profile: EntityProfile) -> tuple[str, list[Any]]:
    """An SQL expression for a message's expiry time (µs; NULL: never) and its parameters.

    Service Bus: the effective time to live is the message's own, capped by the
    entity's default; it counts from the enqueue time (the scheduled time of a
    scheduled message)
    (https://learn.microsoft.com/azure/service-bus-messaging/message-expiration).
    """
    own = "json_extract(extra, '$.ttl_us')"
    start = "COALESCE(scheduled, enqueued)"
    default = profile.default_message_time_to_live
    if default is None:
        return f"({start} + {own})", []
    return f"({start} + COALESCE(min({own}, ?), ?))", [default // _US, default // _US]


def _retire(
    conn: sqlite3.Connection,
    eid: int,
    sub: str,
    profile: EntityProfile,
    now: int,
    rows: list[Any],
) -> bool:
    """Take expired and too-often-delivered messages out of ``rows``' entity; True if any.

    Expiry (https://learn.microsoft.com/azure/service-bus-messaging/message-expiration):
    the message's own time to live capped by the entity's default, from its enqueue
    (or scheduled) time; an expired message is removed, or dead-lettered with
    TTLExpiredException when the entity says so. Delivery count
    (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues):
    a message delivered ``max_delivery_count`` times and not settled moves to the
    dead-letter subqueue with MaxDeliveryCountExceeded; every peek-lock delivery
    counts, so abandons and lock expiries count alike.
    """
    default = profile.default_message_time_to_live
    default_us = None if default is None else default // _US
    changed = False
    for r in rows:
        seq, extra, enqueued, scheduled, delivery_count = r[0], r[5], r[6], r[7], r[10]
        own = json.loads(extra).get("ttl_us") if extra else None
        ttl = own if default_us is None else default_us if own is None else min(own, default_us)
        if ttl is not None and (scheduled or enqueued) + ttl <= now:
            if profile.dead_lettering_on_message_expiration:
                _to_dead_letter(
                    conn, eid, sub, seq, TTL_EXPIRED, "The message expired and was dead lettered."
                )
            else:
                conn.execute(
                    "DELETE FROM messages WHERE eid = ? AND sub = ? AND seq = ?", (eid, sub, seq)
                )
            changed = True
        elif delivery_count >= profile.max_delivery_count:
            _to_dead_letter(
                conn,
                eid,
                sub,
                seq,
                MAX_DELIVERY_COUNT_EXCEEDED,
                f"Message could not be consumed after {profile.max_delivery_count} "
                "delivery attempts.",
            )
            changed = True
    return changed


def _to_dead_letter(
    conn: sqlite3.Connection, eid: int, sub: str, seq: int, reason: str, description: str
) -> None:
    conn.execute(
        "UPDATE messages SET sub = sub || ?, lock_token = NULL, locked_until = NULL, "
        "dl_reason = ?, dl_description = ? WHERE eid = ? AND sub = ? AND seq = ?",
        (DEAD_LETTER_SUFFIX, reason, description, eid, sub, seq),
    )


def _lock_lost(entity: str, lock_token: str, verb: str) -> NoReturn:
    raise LockLostError(
        f"cannot {verb} the message with lock token {lock_token!r} on {entity!r}: "
        "the lock expired or the message was settled already"
    )


def _check_mode(mode: object) -> None:
    if mode not in ("receive_and_delete", "peek_lock"):
        raise ValidationError(
            f"mode must be 'receive_and_delete' or 'peek_lock', got {mode!r}", field="mode"
        )


def _sequence_numbers(sequence_numbers: object) -> list[int]:
    error = ValidationError("sequence_numbers must be a sequence of int", field="sequence_numbers")
    if isinstance(sequence_numbers, int | str | bytes):
        raise error
    try:
        items = list(sequence_numbers)  # type: ignore[call-overload]
    except TypeError:
        raise error from None
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in items):
        raise error
    return list(dict.fromkeys(items))


def _wait_seconds(value: object) -> float:
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValidationError(
            f"max_wait_time must be a non-negative number of seconds or None, got {value!r}",
            field="max_wait_time",
        )
    return float(value)


def _put_state(
    conn: sqlite3.Connection,
    eid: int,
    sub: str,
    profile: EntityProfile,
    session_id: str,
    state: bytes | bytearray | memoryview | None,
) -> None:
    if state is not None and len(state) > profile.max_message_size:
        raise ValidationError(
            f"state is larger than the entity's max_message_size "
            f"({profile.max_message_size} bytes)",
            field="state",
        )
    if state is None:
        conn.execute(
            "DELETE FROM session_states WHERE eid = ? AND sub = ? AND session_id = ?",
            (eid, sub, session_id),
        )
    else:
        conn.execute(
            "INSERT OR REPLACE INTO session_states VALUES (?, ?, ?, ?)",
            (eid, sub, session_id, bytes(state)),
        )


def _check_reason(reason: object, error_description: object) -> None:
    for name, value in (("reason", reason), ("error_description", error_description)):
        if value is not None and not isinstance(value, str):
            raise ValidationError(f"{name} must be a str or None", field=name)


def _check_session_id(session_id: object) -> None:
    if not isinstance(session_id, str) or not session_id or "\x00" in session_id:
        raise ValidationError(
            "session_id must be a non-empty str without NUL characters", field="session_id"
        )
