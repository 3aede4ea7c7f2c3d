"""The ledger's run protocol around a call's transfers: intents before, confirmations after.

The sender reads plan -> transfers -> report; a run reads record -> arm -> confirm ->
release, for the sync and the aio sender alike (they do the I/O, in a worker thread; this
module decides what to write and when). It lives in the ledger package because it is the
ledger's protocol: the sender core only asks it (through ``sendonce._ledger_layer``, which
names these classes for the core). ``LedgerLayer`` is one sender's side of it,
``LedgerRun`` one call's decisions (sans I/O), ``WriteAhead`` one call's writes beside its
transfers:

- the intents of the next several transfers (a *write-ahead window*) are written in one
  round trip, before the first attempt of any of them; a transfer never starts before
  its window is durable;
- how far ahead depends on what an unconfirmed key costs after a crash. Where the broker
  keeps a time window (duplicate detection on), a key left unconfirmed is resent on a
  re-run inside that window and the broker drops the copy: windows are wide and the next
  one is written while the current one is in flight. Elsewhere (no duplicate detection,
  or an Artemis-style count-bounded id cache) every unconfirmed key is in doubt, a
  possible duplicate or a key to check by hand: the intents durable, sendable and
  unconfirmed never cover more than ``max_in_flight`` transfers, so a crash leaves at
  most the transfers in flight in doubt. Where the store can (both built-in stores), the next window
  is still written while the current one is in flight, *staged*: not to be sent until
  a one-row write arms it, with the confirmations that make room; a staged intent left
  by a crash is taken over by the next writer, never in doubt (``LedgerRun``);
- confirmations of acknowledged transfers travel with the next intent write (one
  transaction: a window's confirmation and the next window's intents land together), and
  what is left is written once on the way out;
- on the way out, normal or interrupted (Ctrl-C, task cancellation), the intents of
  transfers never attempted are released and acknowledged transfers are confirmed, so a
  re-run finds neither in doubt.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from itertools import repeat
from operator import attrgetter
from typing import Any, Protocol, cast

from .._entity import EntityProfile
from .._message import Message
from .._message_columns import MessageColumns
from .._report import Part, SendFailure, SendReport, SendResult
from ..errors import InDoubtError, LedgerError, PayloadConflictError, PermanentSendError, SendError
from . import _telemetry
from ._ledger import Ledger, Prepared
from ._store import Confirmation, Key

__all__ = ["LEDGER_FAILURES", "LedgerLayer", "LedgerRun", "WriteAhead"]

logger = logging.getLogger("sendonce.sender")

LEDGER_FAILURES = (LedgerError, sqlite3.Error, OSError)
"""What a ledger that cannot write an intent raises: nothing may be sent then."""

WRITE_AHEAD_TRANSFERS = 32
"""Transfers whose intents one write covers at least (more with more in flight), where an
unconfirmed key costs nothing (a broker window); elsewhere at most half of ``max_in_flight``
(one transfer below 4), so one window is in flight while the next is written."""
WRITE_AHEAD_MESSAGES = 256
"""Messages one write covers at most (a bigger transfer is a window of its own)."""

_MESSAGE_ID = attrgetter("message_id")
_OUTCOME = attrgetter("outcome")
_PARTITION_KEY = attrgetter("partition_key")

Fail = Callable[
    [Sequence[Message], SendError, SendReport, dict[object, SendError], Sequence[int]], None
]
KeyOf = Callable[[Message], object]


class LedgerLayer:
    """One sender's ledger protocol: the decisions, the report entries, the confirmations."""

    def __init__(
        self,
        ledger: Ledger,
        profile: EntityProfile,
        margin: timedelta,
        retry_clock: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self.profile = profile
        self.entity = profile.name
        self.margin = margin
        self.retry_clock = retry_clock
        # Without duplicate detection the broker remembers nothing: any unconfirmed
        # send is in doubt at once. So too where the window was declared, not read from
        # the broker (trust_window=False): a wrong declaration must not store a copy.
        self.window = (
            profile.window
            if profile.duplicate_detection and profile.window is not None and ledger.trust_window
            else timedelta(0)
        )

    def keys(self, batch: Sequence[Message]) -> list[Key]:
        """The broker key of each message (the ledger's key)."""
        # Plain tuples equal (and hash like) Key: cheaper by the 100k, built in C here.
        if not self.profile.partitioned:
            if isinstance(batch, MessageColumns):
                return cast(list[Key], list(zip(batch.message_ids, repeat(""))))
            return cast(list[Key], list(zip(map(_MESSAGE_ID, batch), repeat(""))))
        if isinstance(batch, MessageColumns):
            ids, pks = batch.message_ids, batch.partition_keys
        else:
            ids, pks = list(map(_MESSAGE_ID, batch)), list(map(_PARTITION_KEY, batch))
        if pks is not None and None not in pks and "" not in pks:  # each has its own key
            return cast(list[Key], list(zip(ids, pks, strict=True)))
        dedup_key = self.profile.dedup_key  # a session id or the message id stands in
        return cast(list[Key], [(mid, pk or "") for mid, pk in map(dedup_key, batch)])

    def intents(
        self,
        batch: Sequence[Message],
        keys: Sequence[Key],
        confirm: Confirmation | None,
        staged: bool = False,
    ) -> Prepared:
        """Write ``batch``'s intents durably (with earlier confirmations): one round trip.

        ``staged``: written ahead, to be sent only once :meth:`arm` says so (``Ledger._arm``)."""
        with _telemetry.ledger_write("intent", self.entity, self.ledger.store, keys=len(keys)):
            return self.ledger._prepare(
                self.entity,
                batch,
                keys,
                window=self.window,
                margin=self.margin,
                confirm=confirm,
                staged=staged,
            )

    def arm(
        self, prepared: Prepared, messages: Sequence[Message], confirm: Confirmation | None
    ) -> Prepared | None:
        """Arm a staged write (with the confirmations carried): None once armed.

        If another writer took some of its intents over meanwhile (it found them staged
        after a crash of ours it assumed), the messages it was to send are decided again,
        unstaged: our own staged rows are taken back, the others' are what they are now.
        Returns that decision, over the staged write's indices.
        """
        with _telemetry.ledger_write("confirm", self.entity, self.ledger.store, keys=0):
            if self.ledger._arm(self.entity, prepared.owner, confirm):
                return None
        chosen = prepared.send
        again = self.intents(
            [messages[i] for i in chosen], [prepared.keys[i] for i in chosen], None
        )
        return replace(
            again,
            keys=prepared.keys,
            send=[chosen[i] for i in again.send],
            confirmed=[(chosen[i], row) for i, row in again.confirmed],
            conflicts=[(chosen[i], row) for i, row in again.conflicts],
            in_doubt=[(chosen[i], row) for i, row in again.in_doubt],
        )

    def resumed(self, prepared: Prepared, started: float | None) -> float | None:
        """The retry deadline's start: a resumed key keeps its first attempt's deadline."""
        if prepared.started is None:
            return started
        age = (self.ledger.clock() - prepared.started).total_seconds()
        earlier = self.retry_clock() - max(age, 0.0)
        return earlier if started is None else min(started, earlier)

    def confirm_quietly(self, confirmation: Confirmation) -> None:
        """Record acknowledgements; a failure is logged (they stay intents, decided later)."""
        try:
            with _telemetry.ledger_write(
                "confirm",
                self.entity,
                self.ledger.store,
                transfers=len(confirmation.transfers),
                keys=len(confirmation.keys),
            ):
                self.ledger.confirm(self.entity, confirmation)
        except Exception as exc:
            logger.warning(
                "ledger: acknowledged message(s) to %r could not be confirmed (%s); "
                "they stay unconfirmed intents, decided like in-doubt sends on a re-run",
                self.entity,
                exc,
            )

    def release_quietly(self, keys: Sequence[Key], owner: str) -> None:
        """Give back intents of messages never sent; a failure leaves them to a re-run."""
        try:
            with _telemetry.ledger_write("release", self.entity, self.ledger.store, keys=len(keys)):
                self.ledger.release(self.entity, keys, owner)
        except Exception as exc:
            logger.warning("ledger: intents of unsent messages could not be released (%s)", exc)

    def account(
        self,
        prepared: Prepared,
        messages: Sequence[Message],
        at: Sequence[int],
        report: SendReport,
        failed: dict[object, SendError],
        key_of: KeyOf,
    ) -> None:
        """Report what the ledger decided without a transfer: sent earlier, conflict, in doubt.

        ``messages`` is the batch ``prepared`` decided on, ``at`` the input position of each.
        """
        for index, _row in prepared.confirmed:
            message = messages[index]
            result = SendResult(message.message_id, message.partition_key, "duplicate", 0)
            report._add_result(result, at[index])
            report.from_ledger.append(message.message_id)
        for index, row in prepared.conflicts:
            message = messages[index]
            error: SendError = PayloadConflictError(
                f"message {message.message_id!r} was sent at {row.first_attempt.isoformat()} "
                "with a different body (according to the ledger); the broker would silently "
                "drop this one, so it was not sent. Give distinct business messages distinct ids.",
                message_id=message.message_id,
                partition_key=message.partition_key,
            )
            failure = SendFailure(message.message_id, message.partition_key, error)
            report._add_failure(failure, at[index])
            failed[key_of(message)] = error
        for index, row in prepared.in_doubt:
            message = messages[index]
            error = InDoubtError(
                self.ledger.in_doubt_message(
                    message.message_id, row, window=self.window, profile=self.profile
                ),
                message_id=message.message_id,
                partition_key=message.partition_key,
            )
            _telemetry.in_doubt(error, "ledger")
            failure = SendFailure(message.message_id, message.partition_key, error)
            report._add_failure(failure, at[index])
            failed[key_of(message)] = error

    @staticmethod
    def failure(exc: Exception, message: Message) -> LedgerError:
        """No durable intent, so nothing may be sent: the error each unsent message gets."""
        cause = exc if isinstance(exc, LedgerError) else f"{type(exc).__name__}: {exc}"
        return LedgerError(
            f"the ledger could not record the intent to send ({cause}); not sent",
            message_id=message.message_id,
        )

    def schedule_start(
        self, message: Message, written: Prepared | Exception
    ) -> Prepared | SendResult:
        """A schedule's ledger decision: go ahead (Prepared), or its result, or raise."""
        if isinstance(written, Exception):
            raise self.failure(written, message) from None
        report = SendReport()
        self.account(written, [message], (0,), report, {}, lambda m: m.message_id)
        if report.failures:
            raise report.failures[0].error
        if not written.send:
            return report.results[0]  # confirmed by an earlier run: a duplicate
        return written

    @staticmethod
    def scheduled(prepared: Prepared, result: SendResult) -> Confirmation:
        """What to confirm once a schedule was acknowledged."""
        outcome = "duplicate" if result.outcome == "duplicate" else "scheduled"
        return Confirmation((), {prepared.keys[prepared.send[0]]: outcome})


def _windows(
    batches: Sequence[Sequence[Message]], limit: int, bounded: bool
) -> list[tuple[int, int]]:
    """Consecutive runs of transfers whose intents are written together; ``bounded``: no
    more than half of ``limit`` transfers each (see ``LedgerRun``)."""
    most = max(limit // 2, 1) if bounded else max(WRITE_AHEAD_TRANSFERS, 4 * limit)
    windows: list[tuple[int, int]] = []
    start, count = 0, 0
    for index, batch in enumerate(batches):
        size = len(batch)
        if index > start and (index - start >= most or count + size > WRITE_AHEAD_MESSAGES):
            windows.append((start, index))
            start, count = index, 0
        count += size
    if start < len(batches):
        windows.append((start, len(batches)))
    return windows


class LedgerRun:
    """One call's ledger protocol over its transfers (sans I/O: the sender does the I/O).

    ``next_arm``/``next_write`` say which write to make next (None: none may be made now),
    ``armed``/``written`` and ``arm_failed``/``write_failed`` take the answer,
    ``ready``/``to_send`` say whether and what a transfer sends, ``done`` takes its outcome,
    and ``closing`` says what to release and confirm on the way out.

    Messages are followed by position, never by identity: ``positions[i]`` is the input
    position of each message of transfer ``i``, and what a transfer sends is named by
    its messages' indices in its window's write (``Prepared`` decides by index).

    How far ahead intents are written (see the module's docstring):

    - where an unconfirmed key costs nothing (a broker window), one window ahead of the
      transfers, wide windows;
    - elsewhere (``bounded``) the intents durable, sendable and unconfirmed never cover
      more than ``limit`` transfers: a window is written plainly only if the
      confirmations its write carries leave room for it. Windows hold at most half of
      ``limit``, so one is in flight while the next is written. Where the store can
      stage intents (``staging``), a window with no room yet is written ahead *staged*
      (sent only once armed; after a crash another writer takes staged intents over, so
      they are never in doubt), and armed by a one-row write, with the confirmations
      that make room, as soon as there is room: with a limit of 1, the next transfer's
      intents are written while the current one is in flight, and armed once it is
      acknowledged. A crash leaves at most the transfers in flight in doubt.
    """

    def __init__(
        self,
        layer: LedgerLayer,
        batches: Sequence[Sequence[Message]],
        positions: Sequence[Sequence[int]],
        started: float | None,
        limit: int,
        report: SendReport,
        failed: dict[object, SendError],
        fail: Fail,
        key_of: KeyOf,
    ) -> None:
        self.layer = layer
        self.batches = batches
        self.positions = positions
        self.started = started
        self.report, self.failed, self.fail, self.key_of = report, failed, fail, key_of
        self.limit = limit
        self.bounded = layer.window <= timedelta(0)
        """An unconfirmed key is in doubt at once (no broker window): no more than
        ``limit`` transfers' intents durable, sendable and unconfirmed."""
        self.staging = self.bounded and layer.ledger._stages
        """Windows without room yet are written ahead staged, and armed later."""
        self.windows = _windows(batches, limit, self.bounded)
        self.window_of = [w for w, (a, b) in enumerate(self.windows) for _ in range(a, b)]
        self.prepared: list[Prepared | None] = [None] * len(self.windows)
        self.left = [b - a for a, b in self.windows]
        self.sends: list[Sequence[Message] | None] = [None] * len(batches)
        self.send_at: list[Sequence[int]] = [()] * len(batches)
        """The index in its window's write of each message transfer ``i`` sends."""
        self.go = [False] * len(batches)
        """Whether transfer ``i`` may start (its intents durable, and armed if staged)."""
        self.window_at: list[list[int]] = [[] for _ in self.windows]
        """The input position of each message of a window's write."""
        self.starts: list[float | None] = [started] * len(batches)
        self.tried: list[list[int]] = [[0] for _ in batches]
        """Attempts each transfer made that may have reached the broker (0: none, its
        intents may be released)."""
        self.finished = [False] * len(batches)
        self.pending: Confirmation | None = None
        self.open = 0
        """Transfers whose intents are durable (or being written), sendable (not staged)
        and not yet confirmed."""
        self.settled = 0
        """Of those, the transfers of finished windows whose confirmation is ``pending``."""
        self.next_window = 0
        self.to_arm: int | None = None
        """The window written (or being written) staged, not armed yet: one at a time."""
        self.staged_messages: list[Message] = []
        self.broken = False
        self.reordered = False
        """Whether the report got entries outside the transfers' order (from the ledger)."""

    def _room(self, w: int) -> bool:
        a, b = self.windows[w]
        return not self.bounded or self.open - self.settled + (b - a) <= self.limit

    def _carry(self, w: int) -> Confirmation | None:
        """The confirmations a write carries; window ``w`` becomes sendable with it."""
        a, b = self.windows[w]
        self.open += (b - a) - self.settled
        self.settled = 0
        carried, self.pending = self.pending, None
        return carried

    def next_write(
        self,
    ) -> tuple[int, list[Message], list[Key], Confirmation | None, bool] | None:
        """The next window's intents to write (window, messages, keys, the confirmations
        carried, whether staged), or None when none may be written now."""
        if self.broken or self.next_window >= len(self.windows):
            return None
        w = self.next_window
        staged = not self._room(w)
        if staged and (not self.staging or self.to_arm is not None):
            return None
        self.next_window += 1
        a, b = self.windows[w]
        messages: list[Message] = []
        keys: list[Key] = []
        at = self.window_at[w]
        for index in range(a, b):
            batch = self.batches[index]
            messages.extend(batch)
            keys.extend(self.layer.keys(batch))
            at.extend(self.positions[index])
        if staged:
            self.to_arm, self.staged_messages = w, messages
            return w, messages, keys, None, True
        return w, messages, keys, self._carry(w), False

    def next_arm(self) -> tuple[int, Prepared, list[Message], Confirmation | None] | None:
        """The staged window to arm now (with the confirmations that make room), or None."""
        w = self.to_arm
        if w is None or self.broken or not self._room(w):
            return None
        prepared = self.prepared[w]
        if prepared is None:  # its staged write is not back yet
            return None
        return w, prepared, self.staged_messages, self._carry(w)

    def written(self, w: int, messages: list[Message], prepared: Prepared) -> None:
        """Window ``w``'s intents are durable: decide what each of its transfers sends."""
        self.prepared[w] = prepared
        self._decide(w, messages, prepared)
        if self.to_arm == w and not prepared.send:  # nothing to send: nothing to arm
            a, b = self.windows[w]
            self.open += b - a  # settled like any other window once its transfers end
            self.to_arm, self.staged_messages = None, []
        if self.to_arm != w:
            a, b = self.windows[w]
            self.go[a:b] = [True] * (b - a)

    def armed(self, w: int, again: Prepared | None) -> None:
        """Window ``w``'s staged intents are armed; ``again``: decided anew (some had been
        taken over by another writer), over the same indices."""
        if again is not None:
            self.prepared[w] = again
            self._decide(w, self.staged_messages, again)
        self.to_arm, self.staged_messages = None, []
        a, b = self.windows[w]
        self.go[a:b] = [True] * (b - a)

    def _decide(self, w: int, messages: list[Message], prepared: Prepared) -> None:
        if prepared.confirmed or prepared.conflicts or prepared.in_doubt:
            at = self.window_at[w]
            self.layer.account(prepared, messages, at, self.report, self.failed, self.key_of)
            self.reordered = True
        a, b = self.windows[w]
        whole = len(prepared.send) == len(messages)
        chosen, keys, resumed = prepared.send, prepared.keys, prepared.resumed
        offset, taken = 0, 0
        for index in range(a, b):
            batch = self.batches[index]
            end = offset + len(batch)
            if whole:
                self.sends[index] = batch
                self.send_at[index] = range(offset, end)
            else:
                first = taken
                while taken < len(chosen) and chosen[taken] < end:
                    taken += 1
                mine = chosen[first:taken]
                self.send_at[index] = mine
                self.sends[index] = [messages[i] for i in mine]
            offset = end
            if resumed and any(keys[i] in resumed for i in self.send_at[index]):
                self.starts[index] = self.layer.resumed(prepared, self.started)

    def write_failed(self, w: int, exc: Exception, carried: Confirmation | None) -> None:
        """No durable (or armed) intent for window ``w``: it and every later window fail,
        unsent."""
        self.broken = True
        self.pending = carried.merged(self.pending) if carried else self.pending
        for index in range(self.windows[w][0], len(self.batches)):
            if self.go[index]:
                continue
            sends = self.sends[index]
            if sends is None:
                batch, at = self.batches[index], self.positions[index]
            else:  # staged, decided, never armed: what it would have sent fails
                batch, at = sends, self.sent_at(index)
            if batch:
                error = self.layer.failure(exc, batch[0])
                self.fail(batch, error, self.report, self.failed, at)
            self.sends[index] = []
            self.go[index] = True

    arm_failed = write_failed

    def ready(self, index: int) -> bool:
        """Whether transfer ``index`` may start (its intents durable, and armed)."""
        return self.go[index]

    def to_send(self, index: int) -> tuple[Sequence[Message], float | None]:
        """What transfer ``index`` sends, and from when its deadline counts."""
        sends = self.sends[index]
        assert sends is not None
        return sends, self.starts[index]

    def sent_at(self, index: int) -> list[int]:
        """The input position of each message transfer ``index`` sends."""
        at = self.window_at[self.window_of[index]]
        chosen = self.send_at[index]
        if isinstance(chosen, range):  # the usual case: the whole transfer, one slice
            return at[chosen.start : chosen.stop]
        return [at[i] for i in chosen]

    def _indices(self, index: int, part: Part) -> Sequence[int]:
        """The write indices of ``part``'s messages (part of transfer ``index``)."""
        return self.send_at[index][part.offset : part.offset + len(part.messages)]

    def refused(self, index: int, parts: Sequence[Part]) -> tuple[list[Key], str]:
        """The keys of ``parts`` the broker refused (nothing stored), and their owner.

        They must be released before the window's confirmation is written.
        """
        prepared = self.prepared[self.window_of[index]]
        if prepared is None:
            return [], ""
        keys = [
            prepared.keys[i]
            for part in parts
            if part.attempted is None and isinstance(part.error, PermanentSendError)
            for i in self._indices(index, part)
        ]
        return keys, prepared.owner

    def done(self, index: int, parts: Sequence[Part]) -> tuple[list[Key], str]:
        """Transfer ``index`` is over: note its acks; the keys to release (refused) and owner."""
        self.finished[index] = True
        w = self.window_of[index]
        prepared = self.prepared[w]
        if prepared is None:
            return [], ""
        released: list[Key] = []
        for part in parts:
            if part.attempted is not None:
                outcomes = list(map(_OUTCOME, part.attempted.value))
                prepared.acknowledged(self._indices(index, part), outcomes)
            elif isinstance(part.error, PermanentSendError):
                released += prepared.refused(self._indices(index, part))  # nothing stored
        self.left[w] -= 1
        if not self.left[w]:
            self.pending = prepared.confirmation().merged(self.pending)
            a, b = self.windows[w]
            self.settled += b - a
        return released, prepared.owner

    def closing(self) -> tuple[list[tuple[list[Key], str]], Confirmation | None]:
        """On the way out: intents to release (never attempted), and what to confirm."""
        releases: list[tuple[list[Key], str]] = []
        confirmation = self.pending
        self.pending = None
        for w, prepared in enumerate(self.prepared):
            if prepared is None or not self.left[w]:
                continue
            a, b = self.windows[w]
            keys = [
                prepared.keys[i]
                for index in range(a, b)
                if not self.finished[index] and not self.tried[index][0]
                for i in self.send_at[index]
            ]
            fresh = [k for k in keys if k not in prepared.resumed]
            if fresh:
                releases.append((fresh, prepared.owner))
            partial = prepared.confirmation()  # the acknowledged part of the window
            if partial:
                confirmation = partial.merged(confirmation)
        return releases, confirmation


class Pending(Protocol):
    """A write running in a worker thread: a ``concurrent.futures`` or an asyncio future."""

    def done(self) -> bool: ...

    def result(self) -> Any: ...


Submit = Callable[..., Pending]
"""Runs ``fn(*args)`` in the shell's worker thread: ``submit(fn, *args) -> Pending``."""


class WriteAhead:
    """One call's ledger writes beside its transfers, for the sync and the aio sender alike.

    The shell gives ``submit`` (its worker thread) and ``room`` (a future never set: what
    a transfer waits on when no write may be made until a transfer in flight ends).
    ``launch`` starts the next write the ``LedgerRun`` allows (an arm first: transfers
    wait for it), ``collect`` takes a finished write's answer, ``ready(i)`` says whether
    transfer ``i`` may start (None) or what to wait for first, and ``closing`` says what
    to release and confirm on the way out. A write that completed is noted in ``landed``
    by the worker thread itself, so a call interrupted before it collected the answer
    still releases what it wrote.
    """

    __slots__ = ("landed", "layer", "room", "run", "submit", "writing")

    def __init__(self, run: LedgerRun, submit: Submit, room: Pending) -> None:
        self.run, self.layer, self.submit, self.room = run, run.layer, submit, room
        self.writing: list[Any] = []
        """[kind, window, messages, future, carried] of the write in flight, if any."""
        self.landed: dict[int, tuple[list[Message], Prepared]] = {}

    def _write(
        self,
        w: int,
        messages: list[Message],
        keys: list[Key],
        carried: Confirmation | None,
        staged: bool,
    ) -> Prepared:
        prepared = self.layer.intents(messages, keys, carried, staged)
        self.landed[w] = (messages, prepared)
        return prepared

    def _arm(
        self, w: int, prepared: Prepared, messages: list[Message], carried: Confirmation | None
    ) -> Prepared | None:
        again = self.layer.arm(prepared, messages, carried)
        if again is not None:  # decided anew: its owner is the one to release under
            self.landed[w] = (messages, again)
        return again

    def launch(self) -> bool:
        """Start the next write the run allows (an arm first); whether one started."""
        run, writing = self.run, self.writing
        arming = run.next_arm()
        if arming is not None:
            w, prepared, messages, carried = arming
            writing[:] = ["arm", w, messages, None, carried]
            writing[3] = self.submit(self._arm, w, prepared, messages, carried)
            return True
        request = run.next_write()
        if request is None:
            return False
        w, messages, keys, carried, staged = request
        writing[:] = ["write", w, messages, None, carried]
        writing[3] = self.submit(self._write, w, messages, keys, carried, staged)
        return True

    def collect(self, then_next: bool) -> None:
        """Take the finished write's answer (a failure fails its windows, unsent); then,
        if ``then_next``, start the next write, ahead of the transfers."""
        kind, w, messages, future, carried = self.writing
        self.writing.clear()
        try:
            if kind == "arm":
                self.run.armed(w, future.result())
            else:
                self.run.written(w, messages, future.result())
        except LEDGER_FAILURES as exc:
            self.run.write_failed(w, exc, carried)
        if then_next:
            self.launch()

    def ready(self, index: int) -> Pending | None:
        """None once transfer ``index`` may start, else what to wait for first."""
        run, writing = self.run, self.writing
        while not run.ready(index):
            if writing:
                future: Pending = writing[3]
                if not future.done():
                    return future
                self.collect(then_next=True)
            elif not self.launch():
                return self.room  # a transfer in flight must end (and be confirmed) first
        return None

    def after_transfer(self) -> None:
        """A transfer ended (``run.done`` taken): its confirmation may make room for the
        next write where the run is bounded."""
        if self.run.bounded and not self.writing:
            self.launch()

    @property
    def in_flight(self) -> Pending | None:
        """The write still running, to wait for on the way out (None: none)."""
        return self.writing[3] if self.writing and self.writing[3] is not None else None

    def closing(self) -> tuple[list[tuple[list[Key], str]], Confirmation | None]:
        """On the way out (every write ended and collected if it could be): the intents
        to release and what to confirm. A write that landed without being collected (the
        call was interrupted) is taken into account first."""
        run = self.run
        for w, (messages, prepared) in self.landed.items():
            if run.prepared[w] is None:  # written, then the call was interrupted
                run.written(w, messages, prepared)
            elif run.prepared[w] is not prepared:  # decided anew as it was armed
                run.prepared[w] = prepared
        return run.closing()
