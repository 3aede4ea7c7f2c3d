"""What a send call reports: one result or failure per message, in input order.

Kept apart from the sender so that the ledger layer, which accounts what the ledger
decided, and the sender, which accounts what the broker acknowledged, write one report.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from operator import attrgetter
from typing import Literal, NamedTuple

from ._message import Message
from ._message_columns import MessageColumns
from ._retry import Attempted
from .backends._base import Ack
from .errors import InDoubtError, SendError

__all__ = ["Outcome", "Part", "SendFailure", "SendReport", "SendResult"]

Outcome = Literal["sent", "duplicate", "scheduled"]
_OUTCOME = attrgetter("outcome")


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


class Part(NamedTuple):
    """What became of (part of) one transfer: acknowledged, or failed with ``error``.

    ``offset`` is where ``messages`` start in the transfer (a transfer the transport
    found too big is split in parts): with the transfer's input positions it says which
    inputs the part's outcomes belong to.
    """

    messages: Sequence[Message]
    attempted: Attempted[list[Ack]] | None
    error: SendError | None
    offset: int = 0


def ack_results(
    batch: Sequence[Message],
    acks: list[Ack],
    attempts: int,
    in_doubt: bool,
    *,
    scheduled: bool = False,
) -> list[SendResult]:
    """Results for an acknowledged transfer.

    A duplicate ack after an in-doubt attempt is our own earlier copy: reported sent.
    """
    success: Outcome = "scheduled" if scheduled else "sent"
    # After an in-doubt schedule, the number returned may belong to a copy the broker dropped
    # (Azure/azure-service-bus #265): it cannot cancel the copy that was kept, so it is unknown.
    trust_numbers = not (scheduled and in_doubt)
    return [
        SendResult(
            m.message_id,
            m.partition_key,
            "duplicate" if ack.outcome == "duplicate" and not in_doubt else success,
            attempts,
            # A duplicate's number (a dropped scheduled copy's, #265) names no message.
            ack.sequence_number if trust_numbers and ack.outcome != "duplicate" else None,
        )
        for m, ack in zip(batch, acks, strict=True)
    ]


class SendReport:
    """The outcome of every message of a ``send_many`` call.

    ``results`` holds one :class:`SendResult` per message that reached the broker,
    ``failures`` one :class:`SendFailure` per message that did not (or may not have).
    """

    __slots__ = (
        "_chunks",
        "_failure_at",
        "_packed",
        "_reorder",
        "_result_at",
        "_results",
        "failures",
        "from_ledger",
    )

    def __init__(
        self,
        results: Iterable[SendResult] | None = None,
        failures: Iterable[SendFailure] | None = None,
    ) -> None:
        self._results: list[SendResult] = list(results or ())
        # Acknowledged transfers not yet turned into results: built on first access, so a
        # caller who only reads the counts never pays for one object per message.
        # Each chunk carries its count of duplicates, taken once when it is added, and
        # the input position of each of its messages.
        self._chunks: list[tuple[Sequence[Message], list[Ack], int, bool, int, Sequence[int]]] = []
        # Acknowledged messages of a streamed call, packed without their messages (see
        # ``_absorb``): what keeps a report over millions of messages small.
        self._packed: list[_Packed] = []
        self.failures: list[SendFailure] = list(failures or ())
        # The input position of each entry of _results / failures, as the sender records
        # them (what puts the report in input order: see _in_input_order).
        self._result_at: list[int] = list(range(len(self._results)))
        self._failure_at: list[int] = list(range(len(self.failures)))
        self._reorder = False  # results are put in input order when first read
        self.from_ledger: list[str] = []
        """Ids reported ``duplicate`` because the ledger says an earlier run sent them."""

    def _add_chunk(
        self,
        batch: Sequence[Message],
        attempted: Attempted[list[Ack]],
        duplicates: int | None = None,
        at: Sequence[int] = (),
    ) -> None:
        """An acknowledged transfer; ``at``: the input position of each of its messages."""
        acks, in_doubt = attempted.value, attempted.in_doubt_before
        if duplicates is None:
            duplicates = list(map(_OUTCOME, acks)).count("duplicate")
        chunk = (batch, acks, attempted.attempts, in_doubt, 0 if in_doubt else duplicates, at)
        self._chunks.append(chunk)

    def _add_result(self, result: SendResult, at: int) -> None:
        """A result known without a transfer (a repeat, a key the ledger confirmed)."""
        self._results.append(result)
        self._result_at.append(at)

    def _add_failure(self, failure: SendFailure, at: int) -> None:
        """A failure of the input at position ``at``."""
        self.failures.append(failure)
        self._failure_at.append(at)

    def _in_input_order(self) -> None:
        """Put ``results`` and ``failures`` in the order of the input positions recorded.

        Transfers group messages by key and run concurrently, the ledger settles some
        messages without a transfer, and repeats are settled last: a caller zipping
        results with its input needs them back in input order. A report whose entries
        were not all recorded with a position is left as it is. Results are sorted when
        first read, so a caller reading only the counts (a Spark task) never pays for one
        result object per message.
        """
        self._reorder = True
        failures, at = self.failures, self._failure_at
        if len(at) == len(failures) and _unsorted(at):
            order = sorted(range(len(failures)), key=at.__getitem__)
            self.failures[:] = [failures[i] for i in order]
            self._failure_at = [at[i] for i in order]

    @property
    def results(self) -> list[SendResult]:
        """One result per message that reached the broker, in the order of the input."""
        if self._chunks or self._packed:
            chunks, self._chunks = self._chunks, []
            packed, self._packed = self._packed, []
            built: list[SendResult] = []
            positions: list[int] = []
            for pack in packed:
                built.extend(pack.results())
                positions.extend(pack.at)
            for batch, acks, attempts, in_doubt, _, at in chunks:
                built.extend(ack_results(batch, acks, attempts, in_doubt))
                positions.extend(at)
            self._results[:0] = built  # transfers precede the in-call repeats
            if len(positions) == len(built):
                self._result_at[:0] = positions
            else:  # recorded without positions: no order to restore
                self._result_at = []
        if self._reorder:
            self._reorder = False
            results, at = self._results, self._result_at
            if len(at) == len(results) and _unsorted(at):
                order = sorted(range(len(results)), key=at.__getitem__)
                self._results = [results[i] for i in order]
                self._result_at = [at[i] for i in order]
        return self._results

    @property
    def duplicates(self) -> int:
        """Messages the broker already had (dropped as duplicates)."""
        count = sum(1 for r in self._results if r.outcome == "duplicate")
        count += sum(pack.duplicates for pack in self._packed)
        return count + sum(chunk[4] for chunk in self._chunks)

    @property
    def failed(self) -> int:
        """Messages that failed (not stored, or in doubt): see ``failures``."""
        return len(self.failures)

    @property
    def total(self) -> int:
        """Every message of the call: results plus failures."""
        packed = sum(len(pack.at) for pack in self._packed)
        held = sum(len(c[1]) for c in self._chunks)
        return len(self._results) + packed + held + len(self.failures)

    @property
    def sent(self) -> int:
        """Messages stored by this call (neither duplicates nor failures)."""
        return self.total - self.failed - self.duplicates

    @property
    def in_doubt(self) -> list[str]:
        """Ids whose outcome is unknown: resend them inside the window."""
        return [f.message_id for f in self.failures if isinstance(f.error, InDoubtError)]

    def _absorb(self, part: SendReport, base: int) -> None:
        """Take over the report of one chunk of a streamed call, whose first message is
        input position ``base``: its acknowledged transfers packed (ids, outcomes and
        sequence numbers, not the messages), its other entries as they are."""
        if part._chunks:
            self._packed.append(_pack(part._chunks, base))
            part._chunks = []
        if part._results:
            self._results.extend(part._results)
            self._result_at.extend(at + base for at in part._result_at)
        if part.failures:
            self.failures.extend(part.failures)
            self._failure_at.extend(at + base for at in part._failure_at)
        self.from_ledger.extend(part.from_ledger)
        self._reorder = True  # checked (and sorted if need be) when first read

    def raise_for_failures(self) -> None:
        """Raise the first failure's error (noting how many others there were)."""
        if not self.failures:
            return
        first = self.failures[0].error
        if len(self.failures) > 1:
            others = ", ".join(repr(f.message_id) for f in self.failures[1:6])
            first.add_note(f"{len(self.failures) - 1} more message(s) failed too, e.g. {others}")
        raise first

    def __repr__(self) -> str:
        return f"SendReport(sent={self.sent}, duplicates={self.duplicates}, failed={self.failed})"


_NO_NUMBER = -(2**63)
"""A packed result without a sequence number."""


class _Packed:
    """Acknowledged messages of one chunk of a streamed call, without the messages.

    A few bytes per message: the ids (and partition keys) joined by NUL (which no id or
    key contains) and compressed (ids built from a template compress to ~3-4 bytes each),
    each outcome and sequence number only when they are not all alike, the input
    positions as a range when they are one.
    """

    __slots__ = ("at", "attempts", "duplicates", "ids", "keys", "numbers", "outcomes")

    def __init__(
        self,
        ids: list[str],
        keys: list[str | None],
        duplicate: list[bool],
        attempts: list[int],
        numbers: list[int | None],
        at: list[int],
    ) -> None:
        count = len(ids)
        self.ids: bytes | tuple[str, ...] = _packed_text(ids, count) or tuple(ids)
        self.keys: bytes | tuple[str | None, ...] | None = None
        if any(k is not None for k in keys):
            self.keys = _packed_text([k or "" for k in keys], count) or tuple(keys)
        self.duplicates = duplicate.count(True)
        self.outcomes: bytes | None = bytes(duplicate) if self.duplicates else None
        first = attempts[0] if attempts else 0
        self.attempts: int | array[int] = (
            first if attempts.count(first) == count else array("q", attempts)
        )
        self.numbers: int | array[int] | None = None
        if any(n is not None for n in numbers):
            packed = array("q", [_NO_NUMBER if n is None else n for n in numbers])
            start = packed[0]
            if start != _NO_NUMBER and packed == array("q", range(start, start + count)):
                self.numbers = start  # consecutive: the first says them all
            else:
                self.numbers = packed
        low = at[0] if at else 0
        self.at: Sequence[int] = (
            range(low, low + count) if at == list(range(low, low + count)) else array("q", at)
        )

    def results(self) -> list[SendResult]:
        count = len(self.at)
        ids = _unpacked(self.ids) if isinstance(self.ids, bytes) else list(self.ids)
        keys: Sequence[str | None]
        if self.keys is None:
            keys = [None] * count
        elif isinstance(self.keys, bytes):
            keys = [k or None for k in _unpacked(self.keys)]
        else:
            keys = self.keys
        outcomes: Sequence[Outcome] = (
            ["sent"] * count
            if self.outcomes is None
            else ["duplicate" if o else "sent" for o in self.outcomes]
        )
        attempts: Sequence[int] = (
            [self.attempts] * count if isinstance(self.attempts, int) else self.attempts
        )
        numbers: Sequence[int | None]
        if self.numbers is None:
            numbers = [None] * count
        elif isinstance(self.numbers, int):
            numbers = range(self.numbers, self.numbers + count)
        else:
            numbers = [None if n == _NO_NUMBER else n for n in self.numbers]
        return list(map(SendResult, ids, keys, outcomes, attempts, numbers))


def _packed_text(texts: list[str], count: int) -> bytes | None:
    """``texts`` joined by NUL and compressed (None if one of them holds a NUL)."""
    joined = "\x00".join(texts)
    if joined.count("\x00") != count - 1:
        return None
    return zlib.compress(joined.encode("utf-8"), 1)


def _unpacked(packed: bytes) -> list[str]:
    return zlib.decompress(packed).decode("utf-8").split("\x00")


_ID = attrgetter("message_id")
_KEY = attrgetter("partition_key")
_NUMBER = attrgetter("sequence_number")


def _pack(
    chunks: Sequence[tuple[Sequence[Message], list[Ack], int, bool, int, Sequence[int]]],
    base: int,
) -> _Packed:
    """Every acknowledged transfer of a chunk, packed, in input order, positions from
    ``base`` (what ``ack_results`` would say of each message)."""
    ids: list[str] = []
    keys: list[str | None] = []
    duplicate: list[bool] = []
    attempts: list[int] = []
    numbers: list[int | None] = []
    at: list[int] = []
    for batch, acks, tried, in_doubt, dups, positions in chunks:
        count = len(acks)
        if isinstance(batch, MessageColumns):
            ids += batch.message_ids
            keys += batch.partition_keys or [None] * count
        else:
            ids += map(_ID, batch)
            keys += map(_KEY, batch)
        attempts += [tried] * count
        # A duplicate ack is reported duplicate unless an attempt before it was in doubt
        # (then it is our own copy: sent); either way its number names no message.
        if dups:
            duplicate += [ack.outcome == "duplicate" for ack in acks]
        else:
            duplicate += [False] * count
        if dups or in_doubt:
            numbers += [None if a.outcome == "duplicate" else a.sequence_number for a in acks]
        else:
            numbers += map(_NUMBER, acks)
        at += [position + base for position in positions]
    if _unsorted(at):
        order = sorted(range(len(at)), key=at.__getitem__)
        ids = [ids[i] for i in order]
        keys = [keys[i] for i in order]
        duplicate = [duplicate[i] for i in order]
        attempts = [attempts[i] for i in order]
        numbers = [numbers[i] for i in order]
        at = [at[i] for i in order]
    return _Packed(ids, keys, duplicate, attempts, numbers, at)


def sent_before(error: BaseException, report: SendReport, sent: int) -> None:
    """Say on an error that stopped a streamed call what the call did before it: its
    first ``sent`` messages were handled (sent, duplicates or failures), and their report
    becomes the error's ``sent_before``."""
    report._in_input_order()
    object.__setattr__(error, "sent_before", report)
    error.add_note(
        f"sendonce: messages[0:{sent}] of this call were handled before it stopped: "
        f"{report!r} (the error's sent_before)"
    )


def _unsorted(positions: Sequence[int]) -> bool:
    return any(a > b for a, b in pairwise(positions))


def per_message(error: SendError, message: Message) -> SendError:
    """A copy of a batch-level error naming one message of the batch."""
    text = (
        f"message {message.message_id!r} is in doubt: {error}"
        if isinstance(error, InDoubtError)
        else None
    )
    return error.for_message(message.message_id, message.partition_key, text=text)
