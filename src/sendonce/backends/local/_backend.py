"""``LocalBackend``: the embedded broker with Service Bus and Artemis duplicate detection.

A thin facade: each concept lives in a module of its own, working through the
:class:`~._store.Store` of the backend (the only way to the file):

- ``_store``: the broker file (opening, verifying, its errors) and its transactions;
- ``_entities``: stored profiles and administration;
- ``_sending``: checking and encoding batches, duplicate detection and its sweep;
- ``_receiving``: receiving, settling, deferral, dead-lettering, expiry;
- ``_session_locks`` and ``_sessions``: session locks, ``LocalSession``, session state;
- ``_inspection``: peek, count, stats, message ids, purge.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal

from ..._entity import EntityProfile
from ..._message import Message, PropertyValue
from ..._subscription import SubscriptionProfile
from ...errors import ConfigurationError
from .._base import Ack, Backend, Capabilities
from . import _entities, _inspection, _receiving, _sending, _sessions
from ._received import ReceivedMessage
from ._receiving import ReceiveMode, SubQueue
from ._sessions import LocalSession
from ._store import Clock, Durability, Store, open_broker, positive_seconds

__all__ = ["LocalBackend", "LocalSession"]


def _utc_now() -> datetime:
    return datetime.now(UTC)


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


class LocalBackend(Backend):
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
    ``read_only=True`` inspects a broker this user may not write (a read-only
    file, directory or file system, another user's ``.lock``): nothing is written
    in or beside the file, reads see what writers committed, and every call that
    would write raises :class:`~sendonce.errors.ConfigurationError` naming the file.
    """

    capabilities = Capabilities(
        messaging_system="sendonce_local", atomic_groups=True, reports_duplicates=True
    )
    """One transfer at a time (SQLite writes one at a time); OpenTelemetry's
    ``messaging.system`` is the embedded broker's own value; all-or-nothing groups on
    entities with an id cache (Artemis semantics); duplicates reported."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 60.0,
        create: bool | str = True,
        read_only: bool | str = False,
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
        self._durability = _durability(durability)
        busy = positive_seconds(busy_timeout, "busy_timeout")
        create = _flag(create, "create")
        self._read_only = _flag(read_only, "read_only")
        self._db = open_broker(
            self._path,
            durability=self._durability,
            busy_timeout=busy,
            create=create and not self._read_only,
            on_restart=_entities.forget_volatile_caches,
            read_only=self._read_only,
        )
        self._store = Store(
            self._db, clock or _utc_now, busy, repr(self), read_only=self._read_only
        )

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

    @property
    def read_only(self) -> bool:
        """Whether this handle only reads (``read_only=True``): every write is refused."""
        return self._read_only

    def __repr__(self) -> str:
        ro = ", read_only=True" if self._read_only else ""
        return f"LocalBackend({self._path!r}, durability={self._durability!r}{ro})"

    def close(self) -> None:
        """Release the file. Idempotent.

        Every backend on one file in a process shares one connection; the last
        to close in the process closes it, and the last in any process records a
        clean close (the next start can skip the full check of a large file).
        """
        self._stop_submissions()
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

    # -- entities -----------------------------------------------------------------

    def describe(self, entity: str) -> EntityProfile:
        """The profile of ``entity`` as the broker enforces it."""
        return _entities.describe(self._store, entity)

    # -- sending ------------------------------------------------------------------

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
        return _sending.send(self._store, entity, messages, timeout=timeout, atomic=atomic, raw=raw)

    def send_together(
        self,
        sends: Sequence[tuple[str, Sequence[Message], Sequence[bytes | None] | None]],
        *,
        timeout: float,
    ) -> list[list[Ack]]:
        """Several sends, each ``(entity, messages, raw)``, in one transaction: a group commit.

        A server answering many clients at once (the emulator) pays one commit for
        them all. Each send gets the acks it would get alone, in this order; one
        that fails fails them all, and nothing of any is stored.
        """
        return _sending.send_together(self._store, sends, timeout=timeout)

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
        return _sending.schedule(self._store, entity, messages, at, timeout=timeout, raw=raw)

    def cancel_scheduled(
        self,
        entity: str,
        sequence_numbers: Sequence[int],
        *,
        timeout: float | None = None,
        missing_ok: bool = True,
    ) -> None:
        """Remove scheduled messages still waiting for their time. Their ids stay remembered.

        A number naming no waiting message (unknown, cancelled, or activated already)
        is skipped; with ``missing_ok=False`` it raises :class:`MessageNotFoundError`
        and nothing is cancelled, as Service Bus answers.
        """
        return _sending.cancel_scheduled(
            self._store, entity, sequence_numbers, timeout=timeout, missing_ok=missing_ok
        )

    def create_entity(self, profile: EntityProfile, *, exist_ok: bool = False) -> None:
        """Create a queue or topic. Its duplicate-detection settings are fixed from now on."""
        return _entities.create_entity(self._store, profile, exist_ok=exist_ok)

    def delete_entity(self, name: str) -> None:
        """Delete an entity with its messages, subscriptions and remembered ids."""
        return _entities.delete_entity(self._store, name)

    def entities(self) -> list[EntityProfile]:
        """The profile of every queue and topic in the broker, by name."""
        return _entities.entities(self._store)

    def create_subscription(
        self,
        topic: str,
        name: str | SubscriptionProfile,
        *,
        exist_ok: bool = False,
        sessions: bool | None = None,
        lock_duration: timedelta | None = None,
        max_delivery_count: int | None = None,
        default_message_time_to_live: timedelta | None = None,
        dead_lettering_on_message_expiration: bool | None = None,
    ) -> SubscriptionProfile:
        """Add a subscription; it receives a copy of every message accepted from now on.

        A subscription has its own receive settings, as on Service Bus: sessions,
        lock duration, max delivery count, default time to live and dead-lettering
        on expiration. Each one not given (None) is the topic profile's, except the
        time to live: the topic's applies to every subscription anyway, and the
        subscription's own (if any) caps it further. ``name`` may be a whole
        :class:`~sendonce.SubscriptionProfile` instead. Names ignore case. Returns
        the settings as stored (with ``exist_ok``, the existing subscription's,
        which must match what was asked).
        """
        return _entities.create_subscription(
            self._store,
            topic,
            name,
            exist_ok=exist_ok,
            sessions=sessions,
            lock_duration=lock_duration,
            max_delivery_count=max_delivery_count,
            default_message_time_to_live=default_message_time_to_live,
            dead_lettering_on_message_expiration=dead_lettering_on_message_expiration,
        )

    def subscriptions(self, topic: str) -> list[str]:
        """The names of ``topic``'s subscriptions (none: its messages are kept nowhere)."""
        return _entities.subscriptions(self._store, topic)

    def describe_subscription(self, topic: str, name: str) -> SubscriptionProfile:
        """The settings of one of ``topic``'s subscriptions, as the broker applies them."""
        return _entities.describe_subscription(self._store, topic, name)

    def subscription_profiles(self, topic: str) -> list[SubscriptionProfile]:
        """The settings of every subscription of ``topic``, by name."""
        return _entities.subscription_profiles(self._store, topic)

    # -- receiving and settling ---------------------------------------------------

    def receive(
        self,
        entity: str,
        *,
        max_messages: int = 1,
        subscription: str | None = None,
        session_id: str | None = None,
        mode: ReceiveMode = "receive_and_delete",
        lock_duration: timedelta | None = None,
        sub_queue: SubQueue | None = None,
    ) -> list[ReceivedMessage]:
        """Take up to ``max_messages`` available messages, oldest sequence number first.

        ``receive_and_delete`` removes them; ``peek_lock`` locks them for
        ``lock_duration`` (None: the queue's or subscription's own) until
        :meth:`complete` or :meth:`abandon` (an expired lock makes the message
        available again, with its delivery count kept).
        A message delivered ``max_delivery_count`` times (the entity profile's)
        and not settled moves to the dead-letter subqueue instead, with the
        reason ``MaxDeliveryCountExceeded``, as Service Bus does.
        ``sub_queue="dead_letter"`` reads the dead-letter subqueue.
        """
        return _receiving.receive(
            self._store,
            entity,
            max_messages=max_messages,
            subscription=subscription,
            session_id=session_id,
            mode=mode,
            lock_duration=lock_duration,
            sub_queue=sub_queue,
        )

    # -- inspection ---------------------------------------------------------------

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
        return _inspection.peek(
            self._store,
            entity,
            max_messages=max_messages,
            subscription=subscription,
            session_id=session_id,
            from_sequence_number=from_sequence_number,
            sub_queue=sub_queue,
        )

    def count(
        self,
        entity: str,
        *,
        subscription: str | None = None,
        sub_queue: SubQueue | None = None,
    ) -> int:
        """Messages available now: not scheduled for later, not locked."""
        return _inspection.count(
            self._store, entity, subscription=subscription, sub_queue=sub_queue
        )

    def complete(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        sub_queue: SubQueue | None = None,
    ) -> None:
        """Remove a peek-locked message. Raises :class:`LockLostError` if the lock expired."""
        return _receiving.complete(
            self._store, entity, lock_token, subscription=subscription, sub_queue=sub_queue
        )

    def abandon(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        sub_queue: SubQueue | None = None,
        properties_to_modify: Mapping[str, PropertyValue] | None = None,
    ) -> None:
        """Release a peek-locked message so it can be received again.

        ``properties_to_modify`` (here and in :meth:`defer` and :meth:`dead_letter`) are
        written over the message's application properties, as Service Bus's settlements do.
        """
        return _receiving.abandon(
            self._store,
            entity,
            lock_token,
            subscription=subscription,
            sub_queue=sub_queue,
            properties_to_modify=properties_to_modify,
        )

    def dead_letter(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        reason: str | None = None,
        error_description: str | None = None,
        sub_queue: SubQueue | None = None,
        properties_to_modify: Mapping[str, PropertyValue] | None = None,
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
        return _receiving.dead_letter(
            self._store,
            entity,
            lock_token,
            subscription=subscription,
            reason=reason,
            error_description=error_description,
            sub_queue=sub_queue,
            properties_to_modify=properties_to_modify,
        )

    def defer(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        properties_to_modify: Mapping[str, PropertyValue] | None = None,
    ) -> None:
        """Set a peek-locked message aside: only :meth:`receive_deferred` hands it out again.

        Service Bus deferral: the message stays in the entity, keeps its sequence
        number, shows in :meth:`peek`, and is not delivered by :meth:`receive`
        (https://learn.microsoft.com/azure/service-bus-messaging/message-deferral).
        """
        return _receiving.defer(
            self._store,
            entity,
            lock_token,
            subscription=subscription,
            properties_to_modify=properties_to_modify,
        )

    def receive_deferred(
        self,
        entity: str,
        sequence_numbers: Sequence[int],
        *,
        subscription: str | None = None,
        session_id: str | None = None,
        mode: ReceiveMode = "peek_lock",
        lock_duration: timedelta | None = None,
    ) -> list[ReceivedMessage]:
        """Receive deferred messages by sequence number (settle them as any locked message).

        Raises :class:`MessageNotFoundError` when one of them is not a deferred
        message of the entity (as Service Bus does); nothing is received then.
        """
        return _receiving.receive_deferred(
            self._store,
            entity,
            sequence_numbers,
            subscription=subscription,
            session_id=session_id,
            mode=mode,
            lock_duration=lock_duration,
        )

    def renew_lock(
        self,
        entity: str,
        lock_token: str,
        *,
        subscription: str | None = None,
        lock_duration: timedelta | None = None,
        sub_queue: SubQueue | None = None,
    ) -> datetime:
        """Extend a peek lock by ``lock_duration`` (None: the entity's); returns the new expiry."""
        return _receiving.renew_lock(
            self._store,
            entity,
            lock_token,
            subscription=subscription,
            lock_duration=lock_duration,
            sub_queue=sub_queue,
        )

    # -- sessions -----------------------------------------------------------------

    def get_session_state(
        self, entity: str, session_id: str, *, subscription: str | None = None
    ) -> bytes | None:
        """The state an application stored for a session (None when it has none).

        Service Bus keeps session state with the session, up to the entity's
        maximum message size, whether or not the session has messages; the state
        is kept in the broker file so the emulator and ``local://`` share it.
        """
        return _sessions.get_session_state(
            self._store, entity, session_id, subscription=subscription
        )

    def set_session_state(
        self,
        entity: str,
        session_id: str,
        state: bytes | None,
        *,
        subscription: str | None = None,
    ) -> None:
        """Store (or with None, clear) the state of a session."""
        return _sessions.set_session_state(
            self._store, entity, session_id, state, subscription=subscription
        )

    def accept_session(
        self,
        entity: str,
        session_id: str | None = None,
        *,
        subscription: str | None = None,
        max_wait_time: float | None = None,
        lock_duration: timedelta | None = None,
    ) -> LocalSession:
        """Lock a session of a sessionful queue or subscription to a new receiver.

        ``session_id`` names the session (it need not have messages yet), or with
        ``None`` the broker picks the next available session, as azure-servicebus's
        ``NEXT_AVAILABLE_SESSION`` does: one that no receiver holds and that has a
        message available now (the one with the oldest such message). It waits up
        to ``max_wait_time`` seconds for one (``None`` or 0: no waiting) and then
        raises :class:`~sendonce.backends.local.NoSessionAvailableError`. The wait ends
        when either the broker's clock (the ``clock`` of this backend) or the real
        clock has gone ``max_wait_time`` past its start.

        A session that another receiver holds (a :class:`LocalSession` of any
        handle or process, or an emulator client) raises
        :class:`~sendonce.backends.local.SessionCannotBeLockedError` at once. The lock
        lasts ``lock_duration`` (None: the queue's or subscription's own) unless
        :meth:`LocalSession.renew_lock` extends it; an expired lock frees the
        session for the next receiver. The returned
        :class:`LocalSession` is a context manager that releases the session.
        """
        return _sessions.accept_session(
            self._store,
            entity,
            session_id,
            subscription=subscription,
            max_wait_time=max_wait_time,
            lock_duration=lock_duration,
        )

    def purge(self, entity: str, *, subscription: str | None = None) -> int:
        """Delete stored messages (a topic without ``subscription``: all of its copies).

        Remembered ids stay: purging does not reopen the duplicate-detection window.
        """
        return _inspection.purge(self._store, entity, subscription=subscription)

    def stats(self, entity: str) -> dict[str, int]:
        """Counts for operators: available, scheduled, locked, stored messages, remembered ids."""
        return _inspection.stats(self._store, entity)

    def message_ids(self, entity: str, *, subscription: str | None = None) -> list[str]:
        """Every stored message id, scheduled and locked ones included, in sequence order.

        On a topic without ``subscription``: one entry per accepted topic message.
        """
        return _inspection.message_ids(self._store, entity, subscription=subscription)
