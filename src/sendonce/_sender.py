"""The idempotent sender: validate, batch by the key rules, retry in-doubt sends safely.

Every message leaves with its own deterministic id. Before anything of a call is
sent, every message is checked against the entity; then messages travel in
transfers that never mix partition keys or session ids, and each transfer is
retried with the same ids until the broker answers, the attempts run out, or
the duplicate-detection deadline comes near. Nothing is dropped silently: each
input message ends in the report as sent, duplicate or failed.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from itertools import accumulate, filterfalse
from operator import attrgetter
from typing import Any, cast

from ._entity import EntityProfile
from ._inflight import KeyGate, Stopped, fly, gate_for, in_flight_limit
from ._ledger_layer import LEDGER_FAILURES, LedgerLayer, LedgerRun
from ._message import Message
from ._message_columns import MessageColumns
from ._report import (
    Outcome,
    Part,
    SendFailure,
    SendReport,
    SendResult,
    ack_results,
    per_message,
)
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
from .ledger import Key, Ledger
from .ledger._ledger import Prepared
from .ledger._store import Confirmation

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

DEFAULT_MEMORY_SIZE = 1_000_000
"""Ids a sender remembers for payload-conflict checks (also bounded by the window)."""
DEFAULT_MAX_BATCH_MESSAGES = 4500
"""Messages per transfer at most (the Service Bus batch limit)."""
_PER_MESSAGE_OVERHEAD = 64  # bytes a transfer spends per message beyond its own size


def transfer_key(batch: Sequence[Message]) -> tuple[str | None, str | None] | None:
    """The key a transfer keeps order by (partition key, session id), or None: unordered."""
    first = batch[0]
    pk, sid = first.partition_key, first.session_id
    return None if pk is None and sid is None else (pk, sid)


class _IdMemory:
    """Ids this sender has attempted, with their body hash; bounded by window and size.

    Ids are added a call at a time, so expiry drops whole generations, oldest first.
    """

    __slots__ = ("entries", "generations", "max_size", "window")

    def __init__(self, window: timedelta | None, max_size: int) -> None:
        self.window = None if window is None else window.total_seconds()
        self.max_size = max_size
        self.entries: dict[object, int] = {}
        self.generations: deque[tuple[float, list[object]]] = deque()

    def add(self, seen: dict[object, int], now: float) -> None:
        entries = self.entries
        fresh = list(filterfalse(entries.__contains__, seen)) if entries else list(seen)
        entries.update(seen)
        if fresh:
            self.generations.append((now, fresh))
        self.expire(now)

    def expire(self, now: float) -> None:
        entries, generations = self.entries, self.generations
        horizon = None if self.window is None else now - self.window
        while generations:
            born, keys = generations[0]
            if horizon is not None and born < horizon:
                generations.popleft()  # the broker has forgotten these ids too
                for key in keys:
                    entries.pop(key, None)
                continue
            excess = len(entries) - self.max_size
            if excess <= 0:
                break
            dropped = keys[:excess]
            del keys[:excess]
            if not keys:
                generations.popleft()
            for key in dropped:
                entries.pop(key, None)


class _Plan:
    """A validated call: the transfers to make, and the in-call repeats."""

    __slots__ = ("batches", "reordered", "repeated_results", "repeats", "seen")

    def __init__(self) -> None:
        self.batches: list[Sequence[Message]] = []
        self.repeats: list[int] = []
        self.seen: dict[object, int] = {}
        self.reordered = False  # a batch took a message after a later batch had started
        self.repeated_results: list[int] = []  # input index of each repeat reported as a result


class SenderCore:
    """What every sender does whatever its transport (sync or ``aio``): validation,
    batching by the key rules, the payload-conflict memory, and accounting.

    Not public API; ``IdempotentSender`` and ``sendonce.aio.IdempotentSender`` build on it.
    """

    profile: EntityProfile
    retry: RetryPolicy
    max_batch_messages: int
    _memory: _IdMemory

    def _configure(
        self,
        profile: EntityProfile,
        *,
        retry: RetryPolicy | None,
        require_duplicate_detection: bool,
        memory_size: int,
        max_batch_messages: int,
        ledger: Ledger | None = None,
    ) -> None:
        self.profile = profile
        self.retry = retry if retry is not None else RetryPolicy()
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError("retry must be a RetryPolicy", field="retry")
        self._ledger = ledger
        self._ledger_layer: LedgerLayer | None = None
        if ledger is not None:
            ledger.check_window(profile.window, profile.name)
            if not profile.duplicate_detection and ledger.in_doubt == "error":
                self.retry = _single_attempt(self.retry)
            self._ledger_layer = LedgerLayer(
                ledger, profile, self.retry.safety_margin, self.retry.clock
            )
        elif require_duplicate_detection:
            profile.require_duplicate_detection()
        self.retry.check_window(profile.window, entity=profile.name)
        if not isinstance(memory_size, int) or memory_size < 1:
            raise ConfigurationError("memory_size must be an int >= 1", field="memory_size")
        if not isinstance(max_batch_messages, int) or max_batch_messages < 1:
            raise ConfigurationError(
                "max_batch_messages must be an int >= 1", field="max_batch_messages"
            )
        self.max_batch_messages = max_batch_messages
        self._memory = _IdMemory(profile.window, memory_size)
        # Calls from many threads share the id memory: planning reads it and
        # remembering writes it, so a call does both under this lock (never a transfer).
        self._state_lock = threading.Lock()

    @property
    def entity(self) -> str:
        return self.profile.name

    # -- validation and batching -----------------------------------------------------

    def _key_of(self, message: Message) -> object:
        if not self.profile.partitioned:
            return message.message_id
        return self.profile.dedup_key(message)

    def _plan(self, messages: Sequence[Message], *, what: str, batch: bool = True) -> _Plan:
        """Validate every message and group them into transfers, in one pass.

        Raises a ``ValidationError`` or ``PayloadConflictError`` naming the message
        before any of ``messages`` has been sent.
        """
        if batch and len(messages) > 64:
            fast = self._plan_unkeyed(messages)
            if fast is not None:
                return fast
        profile = self.profile
        sessions, limit = profile.sessions, profile.max_message_size
        partitioned = profile.partitioned
        one_per_transfer = partitioned and profile.duplicate_detection
        cap = self.max_batch_messages
        memory = self._memory.entries
        plan = _Plan()
        seen, repeats, batches = plan.seen, plan.repeats, plan.batches
        open_batches: dict[object, list[Any]] = {}  # group -> [messages, bytes]
        for index, message in enumerate(messages):
            if message.__class__ is not Message and not isinstance(message, Message):
                raise ValidationError(
                    f"{what}[{index}] is a {type(message).__name__}, not a sendonce.Message; "
                    "nothing was sent",
                    field="message",
                )
            size = message._size
            if size > limit or (sessions and message.session_id is None):
                try:
                    profile.check(message)
                except ValidationError as exc:
                    raise type(exc)(
                        f"{exc} ({what}[{index}]; nothing of this call was sent)", field=exc.field
                    ) from None
            key: object = message.message_id if not partitioned else profile.dedup_key(message)
            digest = message._body_hash
            earlier = seen.get(key)
            if earlier is not None:
                if earlier != digest:
                    raise _conflict(message, f"{what}[{index}]", "the same call")
                repeats.append(index)
                continue
            remembered = memory.get(key)
            if remembered is not None and remembered != digest:
                raise _conflict(message, f"{what}[{index}]", "an earlier call")
            seen[key] = digest
            if not batch:
                continue
            if one_per_transfer:
                # The service rejects batches mixing ids on partitioned entities with dedup.
                batches.append([message])
                continue
            pk, sid = message.partition_key, message.session_id
            group = None if pk is None and sid is None else (pk, sid)
            size += _PER_MESSAGE_OVERHEAD
            entry = open_batches.get(group)
            if entry is None or entry[1] + size > limit or len(entry[0]) >= cap:
                entry = [[message], size]
                open_batches[group] = entry
                batches.append(entry[0])
            else:
                if entry[0] is not batches[-1]:
                    plan.reordered = True
                entry[0].append(message)
                entry[1] += size
        return plan

    def _plan_unkeyed(self, messages: Sequence[Message]) -> _Plan | None:
        """The common case in bulk operations: no keys, no repeats, nothing over the limit.

        Returns None whenever the general per-message path is needed (it reports errors).
        """
        profile = self.profile
        if profile.partitioned or profile.sessions:
            return None
        if isinstance(messages, MessageColumns):
            return self._plan_columns(messages)
        if not all(m.__class__ is Message for m in messages):
            return None
        if any(m.partition_key is not None or m.session_id is not None for m in messages):
            return None
        sizes = [m._size + _PER_MESSAGE_OVERHEAD for m in messages]
        limit = profile.max_message_size
        if max(sizes) > limit:
            return None
        seen: dict[object, int] = dict(
            zip([m.message_id for m in messages], [m._body_hash for m in messages], strict=True)
        )
        if len(seen) != len(messages):
            return None
        return self._planned(messages, sizes, seen)

    def _plan_columns(self, columns: MessageColumns) -> _Plan | None:
        """``_plan_unkeyed`` read off the columns: transfers are slices of them."""
        if columns.partition_keys is not None or columns.session_ids is not None:
            return None
        sizes = [size + _PER_MESSAGE_OVERHEAD for size in columns.sizes]
        seen: dict[object, int] = dict(zip(columns.message_ids, columns.hashes, strict=True))
        if len(seen) != len(columns) or max(sizes) > self.profile.max_message_size:
            return None
        return self._planned(columns, sizes, seen)

    def _planned(
        self, messages: Sequence[Message], sizes: list[int], seen: dict[object, int]
    ) -> _Plan | None:
        """Transfers of consecutive messages within the size and count limits."""
        memory = self._memory.entries
        if memory:
            common = memory.keys() & seen.keys()
            if any(memory[k] != seen[k] for k in common):
                return None
        plan = _Plan()
        plan.seen = seen
        cap, limit = self.max_batch_messages, self.profile.max_message_size
        ends = list(accumulate(sizes))
        start, offset, total = 0, 0, len(messages)
        while start < total:
            end = min(bisect_right(ends, offset + limit, lo=start), start + cap)
            end = max(end, start + 1)
            chunk = messages[start:end]
            plan.batches.append(chunk if isinstance(chunk, MessageColumns | list) else list(chunk))
            offset = ends[end - 1]
            start = end
        return plan

    def plan_batches(self, messages: Sequence[Message]) -> list[list[Message]]:
        """The transfers ``send_many`` would make for ``messages``, without sending.

        Validates like ``send_many`` (raising on a bad message). For tools and benchmarks.
        """
        return [list(batch) for batch in self._plan(messages, what="messages").batches]

    def _remember(self, plan: _Plan) -> None:
        self._memory.add(plan.seen, self.retry.clock())

    def _plan_remembered(
        self, messages: Sequence[Message], *, what: str, batch: bool = True
    ) -> _Plan:
        """Plan a call and remember its ids as one step, whatever other threads do."""
        with self._state_lock:
            plan = self._plan(messages, what=what, batch=batch)
            self._remember(plan)
        return plan

    def _account_parts(
        self, parts: Sequence[Part], report: SendReport, failed: dict[object, SendError]
    ) -> None:
        """Record what became of one transfer (its parts, if the transport split it)."""
        for part in parts:
            if part.attempted is not None:
                self._account(report, part.messages, part.attempted, failed)
            elif part.error is not None:
                self._fail(part.messages, part.error, report, failed)

    def _started(self, first_attempt: float | datetime | None) -> float | None:
        """A resumed call's first attempt on the policy's clock (a datetime is wall time)."""
        if first_attempt is None:
            return None
        if isinstance(first_attempt, datetime):
            if first_attempt.tzinfo is None:
                raise ValidationError(
                    "first_attempt must be a timezone-aware datetime", field="first_attempt"
                )
            age = (datetime.now(UTC) - first_attempt).total_seconds()
            return self.retry.clock() - max(age, 0.0)
        if isinstance(first_attempt, int | float) and not isinstance(first_attempt, bool):
            return float(first_attempt)
        raise ValidationError(
            "first_attempt must be a datetime or a time on the retry policy's clock",
            field="first_attempt",
        )

    def _account(
        self,
        report: SendReport,
        batch: Sequence[Message],
        attempted: Attempted[list[Ack]],
        failed: dict[object, SendError],
    ) -> None:
        """Record an acknowledged transfer; members of an ignored group are failures."""
        acks = attempted.value
        outcomes = Counter(map(attrgetter("outcome"), acks))
        if not outcomes["ignored"]:
            report._add_chunk(batch, attempted, outcomes["duplicate"])
            return
        culprits = [
            m.message_id for m, a in zip(batch, acks, strict=True) if a.outcome == "duplicate"
        ]
        kept = [(m, a) for m, a in zip(batch, acks, strict=True) if a.outcome != "ignored"]
        if kept:
            report._add_chunk(
                [m for m, _ in kept],
                Attempted([a for _, a in kept], attempted.attempts, attempted.in_doubt_before),
            )
        for message, ack in zip(batch, acks, strict=True):
            if ack.outcome != "ignored":
                continue
            error = PermanentSendError(
                f"message {message.message_id!r} was not stored: the broker ignored its whole "
                f"all-or-nothing group because member(s) {culprits[:5]!r} are duplicates. Resend "
                "it in a group without them.",
                message_id=message.message_id,
                partition_key=message.partition_key,
                condition="sendonce:group-ignored",
            )
            report.failures.append(SendFailure(message.message_id, message.partition_key, error))
            failed[self._key_of(message)] = error

    def _fail(
        self,
        batch: Sequence[Message],
        exc: SendError,
        report: SendReport,
        failed: dict[object, SendError],
    ) -> None:
        """Record a transfer that failed: one failure per message, each naming its id."""
        for message in batch:
            named = len(batch) == 1 and exc.message_id == message.message_id
            error = exc if named else per_message(exc, message)
            report.failures.append(SendFailure(message.message_id, message.partition_key, error))
            failed[self._key_of(message)] = error
        logger.warning("send of %d message(s) to %r failed: %s", len(batch), self.profile.name, exc)

    def _account_repeats(
        self,
        items: Sequence[Message],
        plan: _Plan,
        report: SendReport,
        failed: dict[object, SendError],
    ) -> None:
        """A repeat inside one call shares the fate of its first copy."""
        for index in plan.repeats:
            message = items[index]
            error = failed.get(self._key_of(message)) if failed else None
            if error is not None:
                report.failures.append(
                    SendFailure(message.message_id, message.partition_key, error)
                )
            else:
                report._results.append(
                    SendResult(message.message_id, message.partition_key, "duplicate", 0, None)
                )
                plan.repeated_results.append(index)
        if plan.reordered or plan.repeats:
            _in_input_order(items, plan, report)

    # -- the ledger (shared by the sync and aio senders) ----------------------------

    def _refuse_with_ledger(self, what: str) -> None:
        if self._ledger is not None:
            raise ConfigurationError(
                f"{what}() is not supported on a sender with a ledger yet: use a sender "
                "without one for all-or-nothing groups",
                field="ledger",
            )


class IdempotentSender(SenderCore):
    """Sends messages so each business message lands exactly once.

    ``backend`` is a :class:`~sendonce.backends.Backend` (not closed by the
    sender) or a url for :func:`~sendonce.backends.connect` (closed with the
    sender). ``entity`` is an :class:`EntityProfile` or a name the backend can
    describe. A profile given for a backend that can create entities (the local
    broker) creates the entity if it does not exist yet.

    ``max_in_flight`` is how many transfers one call keeps outstanding at once
    (default: the backend's ``max_in_flight``, else 1); transfers sharing a partition
    key or session id never overlap and start in input order. Many threads may
    share one sender.
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
        ledger: Ledger | str | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        in_flight_limit(None, max_in_flight)  # a bad value fails before anything is opened
        if isinstance(backend, str):
            from .backends._url import connect

            backend = connect(backend)
            self._owns_backend = True
        else:
            self._owns_backend = False
        self._backend = backend
        self._owns_ledger = False
        try:
            resolved = _open_ledger(ledger)
            self._owns_ledger = isinstance(ledger, str)
            try:
                self._configure(
                    self._resolve(backend, entity),
                    retry=retry,
                    require_duplicate_detection=require_duplicate_detection,
                    memory_size=memory_size,
                    max_batch_messages=max_batch_messages,
                    ledger=resolved,
                )
                self.max_in_flight = in_flight_limit(backend, max_in_flight)
            except BaseException:
                if resolved is not None and self._owns_ledger:
                    resolved.close()
                raise
        except BaseException:
            if self._owns_backend:
                backend.close()
            raise
        self._transaction: Transaction | None = None
        self._closed = False
        self._gate: KeyGate = gate_for(backend, KeyGate)
        self._ledger_pool: ThreadPoolExecutor | None = None
        self._ledger_pid = os.getpid()

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
        """The backend this sender sends through (closed with the sender only if it opened it)."""
        return self._backend

    def close(self) -> None:
        """Close the backend (and ledger) if this sender opened it from a url. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._ledger_pool is not None and self._ledger_pid == os.getpid():
                self._ledger_pool.shutdown(wait=True)
            try:
                if self._owns_backend:
                    self._backend.close()
            finally:
                if self._owns_ledger and self._ledger is not None:
                    self._ledger.close()

    @property
    def ledger(self) -> Ledger | None:
        """The durable send ledger this sender records its intents in, if any."""
        return self._ledger

    def __enter__(self) -> IdempotentSender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IdempotentSender(entity={self.profile.name!r}, backend={self._backend!r})"

    # -- sending -------------------------------------------------------------------

    def _attempt_transfer(
        self,
        batch: Sequence[Message],
        *,
        atomic: bool = False,
        started: float | None = None,
        stop: threading.Event | None = None,
        tried: list[int] | None = None,
    ) -> Attempted[list[Ack]]:
        entity = self.profile.name
        backend = self._backend
        first = batch[0]
        attempts = tried if tried is not None else [0]

        def attempt(timeout: float) -> list[Ack]:
            if stop is not None and stop.is_set():
                raise Stopped(attempts[0])
            attempts[0] += 1
            acks = backend.send(entity, batch, timeout=timeout, atomic=atomic)
            if len(acks) != len(batch):
                raise PermanentSendError(
                    f"backend returned {len(acks)} acks for {len(batch)} messages",
                    message_id=first.message_id,
                )
            return acks

        label = first.message_id if len(batch) == 1 else f"{first.message_id} (+{len(batch) - 1})"
        return self.retry.call(
            attempt,
            window=self.profile.window,
            message_id=label,
            partition_key=first.partition_key,
            started=started,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this sender is closed", field="sender")
        if self._transaction is not None:
            raise ConfigurationError(
                "a transaction is open on this sender: send through the transaction object "
                "(with sender.transaction() as tx: tx.send(...))",
                field="transaction",
            )

    def send(
        self, message: Message, *, first_attempt: float | datetime | None = None
    ) -> SendResult:
        """Send one message; raises ``InDoubtError``/``PermanentSendError`` if it fails.

        ``first_attempt`` resumes a message whose first attempt was made earlier (by a
        process that then crashed): its deadline stays first attempt + window - margin,
        and once that has passed nothing is sent and ``InDoubtError`` is raised. Pass the
        wall-clock time you recorded (an aware ``datetime``) or a time on the policy's clock.
        """
        self._check_open()
        started = self._started(first_attempt)
        self._plan_remembered((message,), what="message", batch=False)
        report = SendReport()
        if self._ledger is not None:
            self._send_through_ledger([[message]], report, {}, started)
        else:
            self._send_transfers([[message]], report, {}, started)  # failures name the message
        if report.failures:
            raise report.failures[0].error
        return report.results[0]

    def send_many(
        self, messages: Iterable[Message], *, first_attempt: float | datetime | None = None
    ) -> SendReport:
        """Send many messages in as few transfers as the entity's rules allow.

        Every message is validated before any is sent (a bad one raises, naming
        its index and id). Send failures do not raise: they are in the report,
        one entry per message, alongside the sent and duplicate results.
        ``first_attempt`` resumes a crashed call with its original deadline (see ``send``).
        """
        self._check_open()
        started = self._started(first_attempt)
        items = messages if isinstance(messages, list | tuple | MessageColumns) else list(messages)
        plan = self._plan_remembered(items, what="messages")
        report = SendReport()
        failed: dict[object, SendError] = {}
        if self._ledger is not None:
            plan.reordered |= self._send_through_ledger(plan.batches, report, failed, started)
        else:
            self._send_transfers(plan.batches, report, failed, started)
        self._account_repeats(items, plan, report, failed)
        logger.debug(
            "send_many to %r: %d message(s) in %d transfer(s): %r",
            self.profile.name,
            len(items),
            len(plan.batches),
            report,
        )
        return report

    def _send_transfers(
        self,
        batches: Sequence[Sequence[Message]],
        report: SendReport,
        failed: dict[object, SendError],
        started: float | None,
    ) -> None:
        """Every transfer, up to ``max_in_flight`` at once, one per key at a time.

        The report is written in input order once all are over, whatever order they
        ended in. An interruption lets the transfers in flight end and starts no other.
        """
        stop = threading.Event()
        outcomes: list[list[Part]] = [[] for _ in batches]

        def step(index: int) -> list[Part]:
            batch = batches[index]
            with self._gate.hold(self._gate_key(batch)):
                return self._transfer(batch, started, stop)

        def finish(index: int, parts: list[Part]) -> None:
            outcomes[index] = parts

        keys = [transfer_key(batch) for batch in batches]
        fly(keys, self.max_in_flight, step, finish, stop)
        for parts in outcomes:
            self._account_parts(parts, report, failed)

    def _gate_key(self, batch: Sequence[Message]) -> object:
        key = transfer_key(batch)
        return None if key is None else (self.profile.name, key)

    def _transfer(
        self,
        batch: Sequence[Message],
        started: float | None,
        stop: threading.Event | None,
        tried: list[int] | None = None,
    ) -> list[Part]:
        """One planned transfer with its retries (split in two if the transport finds it
        too big); what became of each part. ``Stopped`` leaves if ``stop`` is set;
        ``tried`` counts the attempts made."""
        try:
            attempted = self._attempt_transfer(batch, started=started, stop=stop, tried=tried)
        except MessageSizeError:
            if len(batch) == 1:
                raise
            half = len(batch) // 2  # the transport's real limit is below our estimate: split
            first = self._transfer(batch[:half], started, stop, tried)
            return first + self._transfer(batch[half:], started, stop, tried)
        except (InDoubtError, PermanentSendError) as exc:
            return [Part(batch, None, exc)]
        return [Part(batch, attempted, None)]

    def _ledger_writer(self) -> ThreadPoolExecutor:
        """The worker thread intents are written in (one per sender, made on first use)."""
        with self._state_lock:
            # A forked child inherits the executor but not its thread: it makes its own.
            if self._ledger_pool is None or self._ledger_pid != os.getpid():
                self._ledger_pool = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="sendonce-ledger"
                )
                self._ledger_pid = os.getpid()
            return self._ledger_pool

    def _send_through_ledger(
        self,
        batches: Sequence[Sequence[Message]],
        report: SendReport,
        failed: dict[object, SendError],
        started: float | None,
    ) -> bool:
        """The transfers with the ledger around them (see ``_ledger_layer``).

        The next window's intents are written in a worker thread while this window's
        transfers are in flight (SQLite and psycopg release the GIL); a transfer starts
        only once its window is durable. On the way out, interrupted or not, intents
        never attempted are released and acknowledged transfers confirmed. Returns
        whether the report got entries from the ledger (out of the transfers' order).
        """
        layer = self._ledger_layer
        assert layer is not None
        run = LedgerRun(
            layer, batches, started, self.max_in_flight, report, failed, self._fail, self._key_of
        )
        stop = threading.Event()
        outcomes: list[list[Part]] = [[] for _ in batches]
        pool = self._ledger_writer()
        writing: list[Any] = []  # [window, messages, future, carried] of the write in flight
        landed: dict[int, tuple[list[Message], Prepared]] = {}  # every write that completed

        def write(
            w: int, messages: list[Message], keys: list[Key], carried: Confirmation | None
        ) -> Prepared:
            prepared = layer.intents(messages, keys, carried)
            landed[w] = (messages, prepared)
            return prepared

        def write_next() -> None:
            # Always in the worker thread, even for one window: Ctrl-C reaches only the
            # main thread, so a write that completes is recorded in `landed` whatever
            # the main thread was doing, and can be released on the way out.
            request = run.next_write()
            if request is None:
                return
            w, messages, keys, carried = request
            writing[:] = [w, messages, None, carried]
            writing[2] = pool.submit(write, w, messages, keys, carried)

        def collect(then_next: bool) -> None:
            w, messages, future, carried = writing
            writing.clear()
            try:
                run.written(w, messages, future.result())
            except LEDGER_FAILURES as exc:
                run.write_failed(w, exc, carried)
            if then_next:
                write_next()  # one window ahead of the transfers

        def ready(index: int) -> Future[Prepared] | None:
            while not run.ready(index):
                if not writing:
                    write_next()
                    continue
                if not writing[2].done():
                    return cast("Future[Prepared]", writing[2])
                collect(then_next=True)
            return None

        def step(index: int) -> list[Part]:
            sends, start = run.to_send(index)
            if not sends:
                return []
            with self._gate.hold(self._gate_key(sends)):
                return self._transfer(sends, start, stop, run.tried[index])

        def finish(index: int, parts: list[Part]) -> None:
            outcomes[index] = parts
            released, owner = run.done(index, parts)
            if released:
                layer.release_quietly(released, owner)

        try:
            write_next()
            keys = [transfer_key(batch) for batch in batches]
            fly(keys, self.max_in_flight, step, finish, stop, ready=ready)
        finally:
            if writing and writing[2] is not None:  # a window written ahead: learn its owner
                collect(then_next=False)
            pool.submit(int).result()  # every write queued has ended
            for w, (messages, prepared) in landed.items():
                if run.prepared[w] is None:  # written, then the call was interrupted
                    run.written(w, messages, prepared)
            releases, confirmation = run.closing()
            for keys_, owner in releases:
                layer.release_quietly(keys_, owner)
            if confirmation:
                layer.confirm_quietly(confirmation)
        for parts in outcomes:
            self._account_parts(parts, report, failed)
        layer.ledger.maybe_prune()
        return run.reordered

    def schedule(
        self, message: Message, at: datetime, *, first_attempt: float | datetime | None = None
    ) -> SendResult:
        """Schedule one message for ``at``; it shares the duplicate-detection id space.

        On Service Bus a retried schedule can return the sequence number of a
        copy the service dropped as a duplicate (Azure/azure-service-bus #265), and
        after an in-doubt attempt the sequence number may be unknown (None).
        """
        self._check_open()
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValidationError(
                f"message {getattr(message, 'message_id', None)!r}: schedule time must be a "
                "timezone-aware datetime",
                field="at",
            )
        started = self._started(first_attempt)
        self._plan_remembered((message,), what="message", batch=False)
        entity = self.profile.name
        backend = self._backend
        layer = self._ledger_layer
        prepared: Prepared | None = None
        if layer is not None:
            try:
                written: Prepared | Exception = layer.intents(
                    [message], layer.keys([message]), None
                )
            except LEDGER_FAILURES as exc:
                written = exc
            decided = layer.schedule_start(message, written)
            if isinstance(decided, SendResult):
                return decided
            prepared = decided
            started = layer.resumed(prepared, started)

        def attempt(timeout: float) -> list[Ack]:
            return backend.schedule(entity, [message], at, timeout=timeout)

        try:
            with self._gate.hold(self._gate_key([message])):
                attempted = self.retry.call(
                    attempt,
                    window=self.profile.window,
                    message_id=message.message_id,
                    partition_key=message.partition_key,
                    started=started,
                )
        except PermanentSendError:
            if layer is not None and prepared is not None:  # refused: nothing was stored
                layer.release_quietly(prepared.refused([message]), prepared.owner)
            raise
        result = ack_results(
            [message],
            attempted.value,
            attempted.attempts,
            attempted.in_doubt_before,
            scheduled=True,
        )[0]
        if layer is not None and prepared is not None:
            layer.confirm_quietly(layer.scheduled(prepared, result))
        return result

    # -- transactions ----------------------------------------------------------------

    @contextmanager
    def transaction(
        self, *, first_attempt: float | datetime | None = None
    ) -> Iterator[Transaction]:
        """Send a group all or nothing (local broker, Artemis semantics).

        ``with sender.transaction() as tx: tx.send(a); tx.send(b)`` commits on
        exit. A duplicate id on any member makes the broker ignore the whole
        group; its other members are reported as failures. ``first_attempt``
        resumes a crashed group with its original deadline (see ``send``).
        Service Bus has no transactions in the Python client: ``ConfigurationError``.
        """
        self._check_open()
        self._refuse_with_ledger("transaction")
        if getattr(self._backend, "supports_atomic", None) is False:
            raise ConfigurationError(
                f"backend {type(self._backend).__name__} cannot send all-or-nothing groups "
                "(Service Bus has no transactions in the Python client)",
                field="transaction",
            )
        started = self._started(first_attempt)
        tx = Transaction(self, started)
        self._transaction = tx
        try:
            yield tx
        except BaseException:
            self._transaction = None
            tx.messages.clear()
            raise
        self._transaction = None
        tx._commit()

    def _send_atomic(self, messages: list[Message], started: float | None = None) -> SendReport:
        self._plan_remembered(messages, what="transaction", batch=False)
        report = SendReport()
        if messages:
            attempted = self._attempt_transfer(messages, atomic=True, started=started)
            self._account(report, messages, attempted, {})
        return report


def _open_ledger(ledger: Ledger | str | None) -> Ledger | None:
    if ledger is None or isinstance(ledger, Ledger):
        return ledger
    if isinstance(ledger, str):
        return Ledger(ledger)
    raise ConfigurationError("ledger must be a Ledger, a ledger url or None", field="ledger")


def _single_attempt(policy: RetryPolicy) -> RetryPolicy:
    """The policy without retries: without duplicate detection a retry could duplicate."""
    clone = copy.copy(policy)
    object.__setattr__(clone, "max_attempts", 1)
    return clone


def _in_input_order(items: Sequence[Message], plan: _Plan, report: SendReport) -> None:
    """Put ``report.results`` (and ``failures``) in the order of ``items``.

    Transfers group messages by partition key and repeats are settled last; a
    caller zipping results with its input needs them back in input order.
    """
    position: dict[int, int] = {}
    first: dict[tuple[str, str | None], int] = {}
    for index, message in enumerate(items):
        position.setdefault(id(message), index)
        first.setdefault((message.message_id, message.partition_key), index)
    keys = [position[id(m)] for batch, *_ in report._chunks for m in batch]
    results = report.results  # transfers, then results known without one (ledger), repeats
    known = len(results) - len(keys) - len(plan.repeated_results)
    keys.extend(first.get((r.message_id, r.partition_key), 0) for r in results[len(keys) :][:known])
    keys.extend(plan.repeated_results)
    if len(keys) != len(results):  # pragma: no cover - a safety net: keep the order as is
        return
    order = sorted(range(len(results)), key=keys.__getitem__)
    report._results = [results[i] for i in order]
    if report.failures:
        report.failures.sort(key=lambda f: first.get((f.message_id, f.partition_key), 0))


def _conflict(message: Message, where: str, earlier: str) -> PayloadConflictError:
    return PayloadConflictError(
        f"message {message.message_id!r} ({where}) was already sent by this sender, in "
        f"{earlier}, with a different body; the broker would silently drop this one. Give "
        "distinct business messages distinct ids. Nothing of this call was sent.",
        message_id=message.message_id,
        partition_key=message.partition_key,
    )


class Transaction:
    """A group of messages committed all or nothing when its ``with`` block exits."""

    def __init__(self, sender: IdempotentSender, started: float | None = None) -> None:
        self._sender = sender
        self._started = started
        self.messages: list[Message] = []
        self.report: SendReport | None = None

    def send(self, message: Message) -> None:
        """Add ``message`` to the group (validated now, sent when the ``with`` block exits)."""
        self._sender._plan((message,), what="message", batch=False)
        self.messages.append(message)

    def send_many(self, messages: Iterable[Message]) -> None:
        """Add ``messages`` to the group (validated now, sent when the ``with`` block exits)."""
        batch = list(messages)
        self._sender._plan(batch, what="messages", batch=False)
        self.messages.extend(batch)

    def _commit(self) -> None:
        self.report = self._sender._send_atomic(self.messages, self._started)
