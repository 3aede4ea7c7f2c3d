"""The idempotent sender: validate, batch by the key rules, retry in-doubt sends safely.

Every message leaves with its own deterministic id. Before anything of a call is
sent, every message is checked against the entity; then messages travel in
transfers that never mix partition keys or session ids, and each transfer is
retried with the same ids until the broker answers, the attempts run out, or
the duplicate-detection deadline comes near. Nothing is dropped silently: each
input message ends in the report as sent, duplicate or failed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, NamedTuple

from ._entity import EntityProfile
from ._message import Message
from ._retry import Attempted, RetryPolicy
from .backends._base import Ack, Backend
from .errors import (
    ConfigurationError,
    InDoubtError,
    MessageSizeError,
    PayloadConflictError,
    PermanentSendError,
    SendError,
    ValidationError,
)

__all__ = [
    "DEFAULT_MAX_BATCH_MESSAGES",
    "DEFAULT_MEMORY_SIZE",
    "IdempotentSender",
    "Outcome",
    "SendFailure",
    "SendReport",
    "SendResult",
    "Transaction",
]

logger = logging.getLogger("sendonce.sender")

Outcome = Literal["sent", "duplicate", "scheduled"]
DEFAULT_MEMORY_SIZE = 1_000_000
"""Ids a sender remembers for payload-conflict checks (also bounded by the window)."""
DEFAULT_MAX_BATCH_MESSAGES = 4500
"""Messages per transfer at most (the Service Bus batch limit)."""
_PER_MESSAGE_OVERHEAD = 64  # bytes a transfer spends per message beyond its own size


class SendResult(NamedTuple):
    """What happened to one message."""

    message_id: str
    partition_key: str | None
    outcome: Outcome
    attempts: int
    sequence_number: int | None = None


@dataclass(frozen=True, slots=True)
class SendFailure:
    """A message that was not confirmed, with the reason."""

    message_id: str
    partition_key: str | None
    error: SendError


@dataclass(slots=True)
class SendReport:
    """The outcome of every message of a ``send_many`` call."""

    results: list[SendResult] = field(default_factory=list)
    failures: list[SendFailure] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(1 for r in self.results if r.outcome != "duplicate")

    @property
    def duplicates(self) -> int:
        return sum(1 for r in self.results if r.outcome == "duplicate")

    @property
    def failed(self) -> int:
        return len(self.failures)

    @property
    def total(self) -> int:
        return len(self.results) + len(self.failures)

    @property
    def in_doubt(self) -> list[str]:
        """Ids whose outcome is unknown: resend them inside the window."""
        return [f.message_id for f in self.failures if isinstance(f.error, InDoubtError)]

    def raise_for_failures(self) -> None:
        """Raise the first failure's error (noting how many others there were)."""
        if not self.failures:
            return
        first = self.failures[0].error
        if len(self.failures) > 1:
            others = ", ".join(repr(f.message_id) for f in self.failures[1:6])
            first.add_note(
                f"{len(self.failures) - 1} more message(s) failed too, e.g. {others}"
            )
        raise first

    def __repr__(self) -> str:
        return (
            f"SendReport(sent={self.sent}, duplicates={self.duplicates}, failed={self.failed})"
        )


class _IdMemory:
    """Ids this sender has attempted, with a hash of their body, bounded by window and size."""

    __slots__ = ("entries", "max_size", "window")

    def __init__(self, window: timedelta | None, max_size: int) -> None:
        self.window = None if window is None else window.total_seconds()
        self.max_size = max_size
        self.entries: dict[object, tuple[int, float]] = {}

    def expire(self, now: float) -> None:
        entries = self.entries
        if self.window is not None and entries:
            horizon = now - self.window
            while entries:
                key = next(iter(entries))
                if entries[key][1] >= horizon:
                    break
                del entries[key]
        overflow = len(entries) - self.max_size
        if overflow > 0:
            for key in list(entries)[:overflow]:
                del entries[key]


def _body_hash(message: Message) -> int:
    body = message.body
    return hash(body if isinstance(body, bytes) else body.encode("utf-8"))


class IdempotentSender:
    """Sends messages so each business message lands exactly once.

    ``backend`` is a :class:`~sendonce.backends.Backend` (not closed by the
    sender) or a url for :func:`~sendonce.backends.connect` (closed with the
    sender). ``entity`` is an :class:`EntityProfile` or a name the backend can
    describe. A profile given for a backend that can create entities (the local
    broker) creates the entity if it does not exist yet.
    """

    def __init__(
        self,
        backend: Backend | str,
        entity: EntityProfile | str,
        *,
        retry: RetryPolicy | None = None,
        require_duplicate_detection: bool = True,
        memory_size: int = DEFAULT_MEMORY_SIZE,
        max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES,
    ) -> None:
        if isinstance(backend, str):
            from .backends._url import connect

            backend = connect(backend)
            self._owns_backend = True
        else:
            self._owns_backend = False
        self._backend = backend
        try:
            self.profile = self._resolve(backend, entity)
            self.retry = retry if retry is not None else RetryPolicy()
            if not isinstance(self.retry, RetryPolicy):
                raise ConfigurationError("retry must be a RetryPolicy", field="retry")
            if require_duplicate_detection:
                self.profile.require_duplicate_detection()
            self.retry.check_window(self.profile.window, entity=self.profile.name)
            if not isinstance(memory_size, int) or memory_size < 1:
                raise ConfigurationError("memory_size must be an int >= 1", field="memory_size")
            if not isinstance(max_batch_messages, int) or max_batch_messages < 1:
                raise ConfigurationError(
                    "max_batch_messages must be an int >= 1", field="max_batch_messages"
                )
        except BaseException:
            if self._owns_backend:
                backend.close()
            raise
        self.max_batch_messages = max_batch_messages
        self._memory = _IdMemory(self.profile.window, memory_size)
        self._transaction: Transaction | None = None
        self._closed = False

    @staticmethod
    def _resolve(backend: Backend, entity: EntityProfile | str) -> EntityProfile:
        if isinstance(entity, EntityProfile):
            create = getattr(backend, "create_entity", None)
            if create is not None:
                create(entity, exist_ok=True)
            declare = getattr(backend, "declare", None)
            if declare is not None:
                declare(entity)
            return entity
        if isinstance(entity, str) and entity:
            return backend.describe(entity)
        raise ConfigurationError(
            "entity must be an EntityProfile or a non-empty entity name", field="entity"
        )

    # -- lifecycle -----------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def entity(self) -> str:
        return self.profile.name

    def close(self) -> None:
        """Close the backend if this sender opened it. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._owns_backend:
                self._backend.close()

    def __enter__(self) -> IdempotentSender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IdempotentSender(entity={self.profile.name!r}, backend={self._backend!r})"

    # -- validation ----------------------------------------------------------------

    def _key_of(self, message: Message) -> object:
        return message.message_id if not self.profile.partitioned else self.profile.dedup_key(
            message
        )

    def _validate(self, messages: Sequence[Message], *, what: str) -> list[int]:
        """Check every message before anything is sent; return indexes of in-call repeats.

        Raises a ``ValidationError`` or ``PayloadConflictError`` naming the message,
        before any of ``messages`` has been sent.
        """
        profile = self.profile
        sessions = profile.sessions
        limit = profile.max_message_size
        partitioned = profile.partitioned
        memory = self._memory.entries
        seen: dict[object, int] = {}
        repeats: list[int] = []
        for index, message in enumerate(messages):
            if type(message) is not Message and not isinstance(message, Message):
                raise ValidationError(
                    f"{what}[{index}] is a {type(message).__name__}, not a sendonce.Message; "
                    "nothing was sent",
                    field="message",
                )
            if (sessions and message.session_id is None) or message.size > limit:
                try:
                    profile.check(message)
                except ValidationError as exc:
                    raise type(exc)(
                        f"{exc} ({what}[{index}]; nothing of this call was sent)", field=exc.field
                    ) from None
            key = message.message_id if not partitioned else profile.dedup_key(message)
            earlier = seen.get(key)
            if earlier is not None:
                if _body_hash(messages[earlier]) != _body_hash(message):
                    raise _conflict(message, f"{what}[{index}]", f"{what}[{earlier}]")
                repeats.append(index)
                continue
            if key in memory and memory[key][0] != _body_hash(message):
                raise _conflict(message, f"{what}[{index}]", "an earlier call")
            seen[key] = index
        return repeats

    def _remember(self, messages: Iterable[Message]) -> None:
        now = self.retry.clock()
        memory = self._memory
        entries = memory.entries
        partitioned = self.profile.partitioned
        for message in messages:
            key = message.message_id if not partitioned else self.profile.dedup_key(message)
            if key not in entries:
                entries[key] = (_body_hash(message), now)
        memory.expire(now)

    # -- batching ------------------------------------------------------------------

    def _batches(self, messages: Sequence[Message], skip: set[int]) -> list[list[Message]]:
        """Group messages into transfers that obey the entity's batching rules."""
        profile = self.profile
        if profile.partitioned and profile.duplicate_detection:
            # The service rejects batches mixing ids on partitioned entities with dedup.
            return [[m] for i, m in enumerate(messages) if i not in skip]
        limit = profile.max_message_size
        cap = self.max_batch_messages
        open_batches: dict[tuple[str | None, str | None], tuple[list[Message], list[int]]] = {}
        batches: list[list[Message]] = []
        for index, message in enumerate(messages):
            if skip and index in skip:
                continue
            group = (message.partition_key, message.session_id)
            entry = open_batches.get(group)
            size = message.size + _PER_MESSAGE_OVERHEAD
            if entry is None or entry[1][0] + size > limit or len(entry[0]) >= cap:
                entry = ([], [0])
                open_batches[group] = entry
                batches.append(entry[0])
            entry[0].append(message)
            entry[1][0] += size
        return batches

    # -- sending -------------------------------------------------------------------

    def _attempt_transfer(
        self, batch: Sequence[Message], *, atomic: bool = False
    ) -> Attempted[list[Ack]]:
        entity = self.profile.name
        backend = self._backend
        first = batch[0]

        def attempt(timeout: float) -> list[Ack]:
            acks = backend.send(entity, batch, timeout=timeout, atomic=atomic)
            if len(acks) != len(batch):
                raise PermanentSendError(
                    f"backend returned {len(acks)} acks for {len(batch)} messages",
                    message_id=first.message_id,
                )
            return acks

        return self.retry.call(
            attempt,
            window=self.profile.window,
            message_id=first.message_id if len(batch) == 1 else f"{first.message_id} (+{len(batch) - 1})",
            partition_key=first.partition_key,
        )

    @staticmethod
    def _results(
        batch: Sequence[Message], attempted: Attempted[list[Ack]], *, scheduled: bool = False
    ) -> list[SendResult]:
        in_doubt = attempted.in_doubt_before
        attempts = attempted.attempts
        results = []
        for message, ack in zip(batch, attempted.value, strict=True):
            if ack.outcome == "duplicate" and not in_doubt:
                outcome: Outcome = "duplicate"
            else:
                outcome = "scheduled" if scheduled else "sent"
            results.append(
                SendResult(
                    message.message_id, message.partition_key, outcome, attempts,
                    ack.sequence_number,
                )
            )
        return results

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this sender is closed", field="sender")
        if self._transaction is not None:
            raise ConfigurationError(
                "a transaction is open on this sender: send through the transaction object "
                "(with sender.transaction() as tx: tx.send(...))",
                field="transaction",
            )

    def send(self, message: Message) -> SendResult:
        """Send one message; raises ``InDoubtError``/``PermanentSendError`` if it fails."""
        self._check_open()
        self._validate([message], what="message")
        self._remember([message])
        attempted = self._attempt_transfer([message])
        return self._results([message], attempted)[0]

    def send_many(self, messages: Iterable[Message]) -> SendReport:
        """Send many messages in as few transfers as the entity's rules allow.

        Every message is validated before any is sent (a bad one raises, naming
        its index and id). Send failures do not raise: they are in the report,
        one entry per message, alongside the sent and duplicate results.
        """
        self._check_open()
        batch_list = messages if isinstance(messages, list | tuple) else list(messages)
        repeats = self._validate(batch_list, what="messages")
        skip = set(repeats)
        report = SendReport()
        outcome_of: dict[object, SendResult | SendFailure] = {}
        for batch in self._batches(batch_list, skip):
            self._send_batch(batch, report, outcome_of if repeats else None)
        if repeats:
            self._account_repeats(batch_list, repeats, report, outcome_of)
        return report

    def _send_batch(
        self,
        batch: list[Message],
        report: SendReport,
        outcome_of: dict[object, SendResult | SendFailure] | None,
    ) -> None:
        self._remember(batch)
        try:
            attempted = self._attempt_transfer(batch)
        except MessageSizeError:
            if len(batch) == 1:
                raise
            half = len(batch) // 2  # the transport's real limit is below our estimate: split
            self._send_batch(batch[:half], report, outcome_of)
            self._send_batch(batch[half:], report, outcome_of)
            return
        except (InDoubtError, PermanentSendError) as exc:
            for message in batch:
                error = exc if len(batch) == 1 else _per_message(exc, message)
                failure = SendFailure(message.message_id, message.partition_key, error)
                report.failures.append(failure)
                if outcome_of is not None:
                    outcome_of[self._key_of(message)] = failure
            logger.warning(
                "send of %d message(s) to %r failed: %s", len(batch), self.profile.name, exc
            )
            return
        results = self._results(batch, attempted)
        report.results.extend(results)
        if outcome_of is not None:
            for message, result in zip(batch, results, strict=True):
                outcome_of[self._key_of(message)] = result

    def _account_repeats(
        self,
        messages: Sequence[Message],
        repeats: list[int],
        report: SendReport,
        outcome_of: dict[object, SendResult | SendFailure],
    ) -> None:
        """A message repeated inside one call shares the fate of its first copy."""
        for index in repeats:
            message = messages[index]
            first = outcome_of[self._key_of(message)]
            if isinstance(first, SendFailure):
                report.failures.append(
                    SendFailure(message.message_id, message.partition_key, first.error)
                )
            else:
                report.results.append(
                    SendResult(message.message_id, message.partition_key, "duplicate", 0, None)
                )

    def schedule(self, message: Message, at: datetime) -> SendResult:
        """Schedule one message for ``at``; it shares the duplicate-detection id space.

        On Service Bus a retried schedule can return the sequence number of a
        copy the service dropped as a duplicate (Azure/azure-service-bus #265).
        """
        self._check_open()
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValidationError(
                f"message {getattr(message, 'message_id', None)!r}: schedule time must be a "
                "timezone-aware datetime",
                field="at",
            )
        self._validate([message], what="message")
        self._remember([message])
        entity = self.profile.name
        backend = self._backend

        def attempt(timeout: float) -> list[Ack]:
            return backend.schedule(entity, [message], at, timeout=timeout)

        attempted = self.retry.call(
            attempt,
            window=self.profile.window,
            message_id=message.message_id,
            partition_key=message.partition_key,
        )
        return self._results([message], attempted, scheduled=True)[0]

    # -- transactions ----------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Send a group all or nothing (local broker, Artemis semantics).

        ``with sender.transaction() as tx: tx.send(a); tx.send(b)`` commits on
        exit. A duplicate id on any member makes the broker ignore the whole
        group. Service Bus has no transactions in the Python client:
        ``ConfigurationError``.
        """
        self._check_open()
        if getattr(self._backend, "supports_atomic", None) is False:
            raise ConfigurationError(
                f"backend {type(self._backend).__name__} cannot send all-or-nothing groups "
                "(Service Bus has no transactions in the Python client)",
                field="transaction",
            )
        tx = Transaction(self)
        self._transaction = tx
        try:
            yield tx
        except BaseException:
            self._transaction = None
            tx.messages.clear()
            raise
        self._transaction = None
        tx._commit()

    def _send_atomic(self, messages: list[Message]) -> SendReport:
        self._validate(messages, what="transaction")
        self._remember(messages)
        report = SendReport()
        if messages:
            attempted = self._attempt_transfer(messages, atomic=True)
            report.results.extend(self._results(messages, attempted))
        return report


def _conflict(message: Message, where: str, earlier: str) -> PayloadConflictError:
    return PayloadConflictError(
        f"message {message.message_id!r} ({where}) was already sent by this sender, in "
        f"{earlier}, with a different body; the broker would silently drop this one. Give "
        "distinct business messages distinct ids. Nothing of this call was sent.",
        message_id=message.message_id,
        partition_key=message.partition_key,
    )


def _per_message(error: SendError, message: Message) -> SendError:
    """A copy of a batch-level error naming one message of the batch."""
    if isinstance(error, InDoubtError):
        return InDoubtError(
            f"message {message.message_id!r} is in doubt: {error}",
            message_id=message.message_id,
            partition_key=message.partition_key,
            attempts=error.attempts,
            elapsed=error.elapsed,
            last_error=error.last_error,
        )
    copy = type(error)(
        f"message {message.message_id!r}: {error}",
        message_id=message.message_id,
        partition_key=message.partition_key,
        condition=error.condition,
    )
    return copy


class Transaction:
    """A group of messages committed all or nothing when its ``with`` block exits."""

    def __init__(self, sender: IdempotentSender) -> None:
        self._sender = sender
        self.messages: list[Message] = []
        self.report: SendReport | None = None

    def send(self, message: Message) -> None:
        self._sender._validate([message], what="message")
        self.messages.append(message)

    def send_many(self, messages: Iterable[Message]) -> None:
        batch = list(messages)
        self._sender._validate(batch, what="messages")
        self.messages.extend(batch)

    def _commit(self) -> None:
        self.report = self._sender._send_atomic(self.messages)

