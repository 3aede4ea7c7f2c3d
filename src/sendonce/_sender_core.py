"""What every sender does whatever its transport: validation, batching by the key rules,
the payload-conflict memory, and accounting (``SenderCore``).

The sync ``IdempotentSender`` (``_sender``) and ``sendonce.aio.IdempotentSender`` build on
it; they own the transfers, and ``_ledger_layer`` the ledger around them.
"""

from __future__ import annotations

import copy
import logging
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import accumulate, filterfalse
from operator import attrgetter
from typing import Any

from . import _sender_telemetry
from ._buffer import DEFAULT_MAX_BUFFER_BYTES, check_buffer
from ._entity import EntityProfile
from ._ledger_layer import LedgerLayer, LedgerRun
from ._message import Message
from ._message_columns import MessageColumns
from ._report import Part, SendFailure, SendReport, SendResult, per_message
from ._retry import Attempted, RetryPolicy
from .backends._base import Ack
from .errors import (
    ConfigurationError,
    PayloadConflictError,
    PermanentSendError,
    SendError,
    ValidationError,
)
from .ledger import Ledger

__all__ = [
    "DEFAULT_MAX_BATCH_MESSAGES",
    "DEFAULT_MEMORY_SIZE",
    "SenderCore",
    "transfer_key",
]

_OUTCOME = attrgetter("outcome")

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

    __slots__ = ("additions", "entries", "generations", "max_size", "window")

    def __init__(self, window: timedelta | None, max_size: int) -> None:
        self.window = None if window is None else window.total_seconds()
        self.max_size = max_size
        self.entries: dict[object, int] = {}
        self.generations: deque[tuple[float, list[object]]] = deque()
        self.additions = 0
        """Calls remembered so far: a call planned in steps checks again if it grew."""

    def add(self, seen: dict[object, int], now: float) -> None:
        self.additions += 1
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
    """A validated call: the transfers to make, where their messages are in the input,
    and the in-call repeats.

    ``positions[i]`` is the input position of each message of ``batches[i]`` (a range
    for a slice of the input): the report is put back in input order by them, never by
    the messages' identity (a ``MessageColumns`` builds its messages on access).
    """

    __slots__ = ("batches", "positions", "reordered", "repeats", "seen")

    def __init__(self) -> None:
        self.batches: list[Sequence[Message]] = []
        self.positions: list[Sequence[int]] = []
        self.repeats: list[int] = []
        self.seen: dict[object, int] = {}
        self.reordered = False  # a batch took a message after a later batch had started


class _Planning:
    """A call being planned a slice of its input at a time (``step``), then ``result``.

    The sync sender plans in one step; the aio sender yields to its event loop between
    steps, so a big input never holds the loop up, and still validates every message
    before it sends any. The common bulk case (no keys, no repeats, nothing the entity
    must check) is read off whole slices; a slice that does not fit sends planning back
    to the first message, message by message (the path that names what is wrong).
    """

    __slots__ = (
        "base",
        "batch",
        "core",
        "done",
        "fast",
        "messages",
        "open",
        "plan",
        "sizes",
        "what",
    )

    def __init__(
        self,
        core: SenderCore,
        messages: Sequence[Message],
        what: str,
        batch: bool,
        base: int = 0,
    ) -> None:
        self.core, self.messages, self.what, self.batch = core, messages, what, batch
        self.base = base
        """Where ``messages`` start in the call's input (a chunk of a streamed call): the
        index an error names."""
        profile = core.profile
        self.fast = batch and len(messages) > 64 and not (profile.partitioned or profile.sessions)
        self.done = 0  # messages planned
        self.plan = _Plan()
        self.sizes: list[int] = []  # the fast path's transfer size of each message
        self.open: dict[object, list[Any]] = {}  # group -> [messages, bytes, positions]

    def step(self, count: int) -> bool:
        """Plan up to ``count`` more messages; whether any are left. Raises a
        ``ValidationError`` or ``PayloadConflictError`` naming the first bad message."""
        messages = self.messages
        start, stop = self.done, min(self.done + count, len(messages))
        if self.fast:
            if isinstance(messages, MessageColumns):  # read off the columns in one go
                columns = self.core._plan_columns(messages)
                if columns is not None:
                    self.plan, self.fast, self.done = columns, False, len(messages)
                    return False
            if isinstance(messages, MessageColumns) or not self._unkeyed(start, stop):
                self.fast, self.done, self.plan, self.sizes = False, 0, _Plan(), []
                return True  # the per-message path, from the first message
        else:
            self._one_by_one(start, stop)
        self.done = stop
        return stop < len(messages)

    def result(self) -> _Plan:
        """The plan, once ``step`` has planned every message."""
        if self.fast:
            self.fast = False
            self.plan = self.core._planned(self.messages, self.sizes, self.plan.seen)
        return self.plan

    def _slice(self, start: int, stop: int) -> Sequence[Message]:
        messages = self.messages
        return messages if start == 0 and stop == len(messages) else messages[start:stop]

    def _unkeyed(self, start: int, stop: int) -> bool:
        """The bulk case over ``messages[start:stop]``: False if it does not fit."""
        chunk = self._slice(start, stop)
        if not all(m.__class__ is Message for m in chunk):
            return False
        if any(m.partition_key is not None or m.session_id is not None for m in chunk):
            return False
        overhead = self.core._overhead()
        sizes = [m._size + overhead for m in chunk]
        if sizes and max(sizes) > self.core.profile._check_above:
            return False  # the full check decides
        fresh: dict[object, int] = dict(
            zip([m.message_id for m in chunk], [m._body_hash for m in chunk], strict=True)
        )
        seen = self.plan.seen
        if len(fresh) != len(chunk) or (seen and not seen.keys().isdisjoint(fresh)):
            return False  # a repeat inside the call
        if self.core._conflicts(fresh):
            return False
        seen.update(fresh)
        self.sizes += sizes
        return True

    def _one_by_one(self, start: int, stop: int) -> None:
        """Validate ``messages[start:stop]`` one by one and group them into transfers."""
        core, what, batch = self.core, self.what, self.batch
        profile = core.profile
        sessions, limit = profile.sessions, profile.max_message_size
        check_above = profile._check_above
        partitioned = profile.partitioned
        one_per_transfer = partitioned and profile.duplicate_detection
        cap = core.max_batch_messages
        overhead = core._overhead()
        memory = core._memory.entries
        plan = self.plan
        seen, repeats, batches, positions = plan.seen, plan.repeats, plan.batches, plan.positions
        open_batches = self.open
        base = self.base
        for index, message in enumerate(self._slice(start, stop), start):
            if message.__class__ is not Message and not isinstance(message, Message):
                raise ValidationError(
                    f"{what}[{index + base}] is a {type(message).__name__}, not a "
                    f"sendonce.Message; {unsent(base)}",
                    field="message",
                )
            size = message._size
            if size > check_above or (sessions and message.session_id is None):
                try:
                    profile.check(message)
                except ValidationError as exc:
                    raise type(exc)(
                        f"{exc} ({what}[{index + base}]; {unsent(base)})", field=exc.field
                    ) from None
            key: object = message.message_id if not partitioned else profile.dedup_key(message)
            digest = message._body_hash
            earlier = seen.get(key)
            if earlier is not None:
                if earlier != digest:
                    raise _conflict(message, f"{what}[{index + base}]", "the same call", base)
                repeats.append(index)
                continue
            remembered = memory.get(key)
            if remembered is not None and remembered != digest:
                before = "an earlier call" if not base else "an earlier chunk of this call or call"
                raise _conflict(message, f"{what}[{index + base}]", before, base)
            seen[key] = digest
            if not batch:
                continue
            if one_per_transfer:
                # The service rejects batches mixing ids on partitioned entities with dedup.
                batches.append([message])
                positions.append((index,))
                continue
            pk, sid = message.partition_key, message.session_id
            group = None if pk is None and sid is None else (pk, sid)
            size += overhead
            entry = open_batches.get(group)
            if entry is None or entry[1] + size > limit or len(entry[0]) >= cap:
                entry = [[message], size, [index]]
                open_batches[group] = entry
                batches.append(entry[0])
                positions.append(entry[2])
            else:
                if entry[0] is not batches[-1]:
                    plan.reordered = True
                entry[0].append(message)
                entry[1] += size
                entry[2].append(index)


class SenderCore:
    """What every sender does whatever its transport (sync or ``aio``): validation,
    batching by the key rules, the payload-conflict memory, and accounting.

    Not public API; ``IdempotentSender`` and ``sendonce.aio.IdempotentSender`` build on it.
    """

    profile: EntityProfile
    retry: RetryPolicy
    max_batch_messages: int
    max_buffer_bytes: int
    max_in_flight: int
    _memory: _IdMemory
    _otel: _sender_telemetry.Telemetry | None
    """The sender's telemetry, decided once when it is configured (None: off, free)."""

    def _configure(
        self,
        profile: EntityProfile,
        *,
        retry: RetryPolicy | None,
        require_duplicate_detection: bool,
        memory_size: int,
        max_batch_messages: int,
        ledger: Ledger | None = None,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
    ) -> None:
        self.max_buffer_bytes = check_buffer(max_buffer_bytes)
        """What a streamed ``send_many`` holds of its input at most (see ``_buffer``)."""
        self.profile = profile
        self.retry = retry if retry is not None else RetryPolicy()
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError("retry must be a RetryPolicy", field="retry")
        self._ledger = ledger
        self._ledger_layer: LedgerLayer | None = None
        if ledger is not None:
            ledger.check_entity(profile)
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
        _sender_telemetry.instrument(self)

    @property
    def entity(self) -> str:
        return self.profile.name

    # -- validation and batching -----------------------------------------------------

    def _key_of(self, message: Message) -> object:
        if not self.profile.partitioned:
            return message.message_id
        return self.profile.dedup_key(message)

    def _plan(
        self, messages: Sequence[Message], *, what: str, batch: bool = True, base: int = 0
    ) -> _Plan:
        """Validate every message and group them into transfers, in one pass.

        Raises a ``ValidationError`` or ``PayloadConflictError`` naming the message
        before any of ``messages`` has been sent (``base``: where they start in the
        call's input, for a chunk of a streamed call).
        """
        planning = _Planning(self, messages, what, batch, base)
        while planning.step(len(messages)):
            pass
        return planning.result()

    def _overhead(self) -> int:
        """What a transfer spends per message beyond its size: room for the trace context
        when traced (``_sender_telemetry.RESERVE``), so it never pushes a transfer over the
        limit."""
        return (
            _PER_MESSAGE_OVERHEAD
            if self._otel is None
            else (_PER_MESSAGE_OVERHEAD + _sender_telemetry.RESERVE)
        )

    def _plan_columns(self, columns: MessageColumns) -> _Plan | None:
        """The unkeyed fast path read off the columns: transfers are slices of them."""
        if columns.partition_keys is not None or columns.session_ids is not None:
            return None
        overhead = self._overhead()
        sizes = [size + overhead for size in columns.sizes]
        seen: dict[object, int] = dict(zip(columns.message_ids, columns.hashes, strict=True))
        if len(seen) != len(columns) or max(sizes) > self.profile._check_above:
            return None
        if self._conflicts(seen):
            return None
        return self._planned(columns, sizes, seen)

    def _conflicts(self, seen: dict[object, int]) -> bool:
        """Whether an id of ``seen`` is remembered with another body (the general path
        then names the message)."""
        memory = self._memory.entries
        if not memory:
            return False
        common = memory.keys() & seen.keys()
        return any(memory[k] != seen[k] for k in common)

    def _planned(
        self, messages: Sequence[Message], sizes: list[int], seen: dict[object, int]
    ) -> _Plan:
        """Transfers of consecutive messages within the size and count limits."""
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
            plan.positions.append(range(start, end))
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
        self, messages: Sequence[Message], *, what: str, batch: bool = True, base: int = 0
    ) -> _Plan:
        """Plan a call (or a chunk of one, from input position ``base``) and remember
        its ids as one step, whatever other threads do."""
        with self._state_lock:
            plan = self._plan(messages, what=what, batch=batch, base=base)
            self._remember(plan)
        return plan

    def _remember_stepped(
        self, plan: _Plan, messages: Sequence[Message], what: str, additions: int, base: int = 0
    ) -> None:
        """Remember a call planned in steps (``_Planning``), during which other calls may
        have been remembered (``additions``: the memory's count when it began). An id one
        of them sent with another body is a conflict, as if that call had come first."""
        with self._state_lock:
            memory = self._memory
            if memory.additions != additions and self._conflicts(plan.seen):
                entries = memory.entries
                for index, message in enumerate(messages):
                    digest = entries.get(self._key_of(message))
                    if digest is not None and digest != message._body_hash:
                        raise _conflict(message, f"{what}[{index + base}]", "another call", base)
            self._remember(plan)

    def _account_parts(
        self,
        parts: Sequence[Part],
        report: SendReport,
        failed: dict[object, SendError],
        at: Sequence[int],
    ) -> None:
        """Record what became of one transfer (its parts, if the transport split it);
        ``at`` is the input position of each message the transfer sent."""
        for part in parts:
            where = at[part.offset : part.offset + len(part.messages)]
            if part.attempted is not None:
                self._account(report, part.messages, part.attempted, failed, where)
            elif part.error is not None:
                self._fail(part.messages, part.error, report, failed, where)

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
        at: Sequence[int],
    ) -> None:
        """Record an acknowledged transfer; members of an ignored group are failures."""
        acks = attempted.value
        outcomes = list(map(_OUTCOME, acks))
        if "ignored" not in outcomes:
            report._add_chunk(batch, attempted, outcomes.count("duplicate"), at)
            return
        culprits = [
            m.message_id for m, a in zip(batch, acks, strict=True) if a.outcome == "duplicate"
        ]
        kept = [i for i, a in enumerate(acks) if a.outcome != "ignored"]
        if kept:
            report._add_chunk(
                [batch[i] for i in kept],
                Attempted([acks[i] for i in kept], attempted.attempts, attempted.in_doubt_before),
                at=[at[i] for i in kept],
            )
        for message, ack, position in zip(batch, acks, at, strict=True):
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
            failure = SendFailure(message.message_id, message.partition_key, error)
            report._add_failure(failure, position)
            failed[self._key_of(message)] = error

    def _fail(
        self,
        batch: Sequence[Message],
        exc: SendError,
        report: SendReport,
        failed: dict[object, SendError],
        at: Sequence[int],
    ) -> None:
        """Record a transfer that failed: one failure per message, each naming its id;
        ``at`` is the input position of each."""
        for message, position in zip(batch, at, strict=True):
            named = len(batch) == 1 and exc.message_id == message.message_id
            error = exc if named else per_message(exc, message)
            failure = SendFailure(message.message_id, message.partition_key, error)
            report._add_failure(failure, position)
            failed[self._key_of(message)] = error
        logger.warning("send of %d message(s) to %r failed: %s", len(batch), self.profile.name, exc)

    def _account_repeats(
        self,
        items: Sequence[Message],
        plan: _Plan,
        report: SendReport,
        failed: dict[object, SendError],
    ) -> None:
        """A repeat inside one call shares the fate of its first copy; then the report is
        put in input order if transfers or the ledger took messages out of it."""
        for index in plan.repeats:
            message = items[index]
            error = failed.get(self._key_of(message)) if failed else None
            if error is not None:
                failure = SendFailure(message.message_id, message.partition_key, error)
                report._add_failure(failure, index)
            else:
                result = SendResult(message.message_id, message.partition_key, "duplicate", 0)
                report._add_result(result, index)
        if plan.reordered or plan.repeats:
            report._in_input_order()

    # -- what both shells check and say the same way ---------------------------------

    @staticmethod
    def _checked(acks: list[Ack], batch: Sequence[Message]) -> list[Ack]:
        """A backend's acks for ``batch``: one per message, or the transfer is refused."""
        if len(acks) != len(batch):
            raise PermanentSendError(
                f"backend returned {len(acks)} acks for {len(batch)} messages",
                message_id=batch[0].message_id,
            )
        return acks

    def _retry_terms(self, batch: Sequence[Message], started: float | None) -> dict[str, Any]:
        """What the retry policy needs besides the attempt: the window, the transfer's name
        in errors (its first id, and how many more), its key, its deadline's start."""
        first = batch[0]
        label = first.message_id if len(batch) == 1 else f"{first.message_id} (+{len(batch) - 1})"
        return {
            "window": self.profile.window,
            "message_id": label,
            "partition_key": first.partition_key,
            "started": started,
        }

    @staticmethod
    def _check_schedule_time(message: Message, at: object) -> None:
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValidationError(
                f"message {getattr(message, 'message_id', None)!r}: schedule time must be a "
                "timezone-aware datetime",
                field="at",
            )

    def _check_atomic(self, backend: object) -> None:
        """An all-or-nothing group needs a backend with transactions and no ledger."""
        self._refuse_with_ledger("transaction")
        if getattr(backend, "supports_atomic", None) is False:
            raise ConfigurationError(
                f"backend {type(backend).__name__} cannot send all-or-nothing groups "
                "(Service Bus has no transactions in the Python client)",
                field="transaction",
            )

    def _ledger_run(
        self,
        batches: Sequence[Sequence[Message]],
        positions: Sequence[Sequence[int]],
        report: SendReport,
        failed: dict[object, SendError],
        started: float | None,
    ) -> LedgerRun:
        """One call's ledger protocol over its planned transfers (``_ledger_layer``)."""
        layer = self._ledger_layer
        assert layer is not None
        return LedgerRun(
            layer,
            batches,
            positions,
            started,
            self.max_in_flight,
            report,
            failed,
            self._fail,
            self._key_of,
        )

    # -- the ledger (shared by the sync and aio senders) ----------------------------

    def _refuse_with_ledger(self, what: str) -> None:
        if self._ledger is not None:
            raise ConfigurationError(
                f"{what}() is not supported on a sender with a ledger yet: use a sender "
                "without one for all-or-nothing groups",
                field="ledger",
            )


def _single_attempt(policy: RetryPolicy) -> RetryPolicy:
    """The policy without retries: without duplicate detection a retry could duplicate."""
    clone = copy.copy(policy)
    object.__setattr__(clone, "max_attempts", 1)
    return clone


def unsent(base: int) -> str:
    """What a call that stopped at a bad message sent: nothing, or (a streamed call's
    later chunk) the chunks before it."""
    if not base:
        return "nothing of this call was sent"
    return (
        f"nothing from messages[{base}] on was sent; messages[0:{base}], read before it, "
        "were (their report: the error's sent_before)"
    )


def _conflict(message: Message, where: str, earlier: str, base: int = 0) -> PayloadConflictError:
    what = unsent(base)
    return PayloadConflictError(
        f"message {message.message_id!r} ({where}) was already sent by this sender, in "
        f"{earlier}, with a different body; the broker would silently drop this one. Give "
        f"distinct business messages distinct ids. {what[0].upper()}{what[1:]}.",
        message_id=message.message_id,
        partition_key=message.partition_key,
    )
