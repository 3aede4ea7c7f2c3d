"""Every sender call written once, as sans-I/O steps (``sendonce._effects``).

``send``, ``send_many`` (a whole input or a streamed one), ``schedule``, an all-or-nothing
group and one transfer with its splits: what each does, in what order, and what it
records, whatever runs it. The sync sender (``sendonce._sender``) runs these steps in the
calling thread, the aio sender (``sendonce.aio._sender``) awaits them; each performs the
effects its own way and holds nothing of the logic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from ._buffer import Chunks
from ._effects import (
    Ahead,
    Attempt,
    Drain,
    Flights,
    LedgerFlights,
    Mark,
    Pause,
    Read,
    Schedule,
    Steps,
    Store,
    Transfer,
)
from ._ledger_layer import LEDGER_FAILURES, LedgerLayer
from ._message import Message
from ._message_columns import MessageColumns
from ._report import Part, SendReport, SendResult, ack_results, sent_before
from ._sender_core import SenderCore, _Plan, _Planning, transfer_key
from .errors import InDoubtError, MessageSizeError, PermanentSendError, SendError
from .ledger import Key
from .ledger._ledger import Prepared
from .ledger._store import Confirmation

__all__ = ["SenderCalls", "TransactionCore"]

logger = logging.getLogger("sendonce.sender")

MARK = Mark()
LIGHT_RUN = 512
"""Transfers a ledger run may be set up over in the event loop itself (a few ms at most)."""


class SenderCalls(SenderCore):
    """The calls of both senders as steps; a shell runs them (``run`` or ``arun``)."""

    def _slice(self, what: str) -> int | None:
        """How many messages (``"plan"``) or transfers (``"account"``) a call handles
        between two pauses (None: all at once, as the sync sender does)."""
        return None

    def _gate_key(self, batch: Sequence[Message]) -> object:
        """The key a transfer holds across calls and senders (None: unordered)."""
        key = transfer_key(batch)
        return None if key is None else (self.profile.name, key)

    # -- one transfer ----------------------------------------------------------------

    def _transfer_steps(
        self,
        batch: Sequence[Message],
        started: float | None,
        tried: list[int] | None = None,
        stop: Any = None,
        offset: int = 0,
    ) -> Steps[list[Part]]:
        """One planned transfer with its retries (its key held by the caller), split in
        two if the transport finds it too big; what became of each part. ``tried`` counts
        the attempts made; ``offset``: where ``batch`` starts in its planned transfer."""
        try:
            attempted = yield Attempt(batch, started, tried, stop)
        except MessageSizeError:
            if len(batch) == 1:
                raise
            half = len(batch) // 2  # the transport's real limit is below our estimate: split
            steps = self._transfer_steps
            first = yield from steps(batch[:half], started, tried, stop, offset)
            return first + (yield from steps(batch[half:], started, tried, stop, offset + half))
        except (InDoubtError, PermanentSendError) as exc:
            return [Part(batch, None, exc, offset)]
        return [Part(batch, attempted, None, offset)]

    # -- send, send_many ---------------------------------------------------------------

    def _send_one_steps(
        self, message: Message, first_attempt: float | datetime | None
    ) -> Steps[SendResult]:
        """``send``: one message, its failure raised."""
        mark = yield MARK
        started = self._started(first_attempt)
        self._plan_remembered((message,), what="message", batch=False)
        report = SendReport()
        if self._ledger is not None:
            yield from self._fly_steps([[message]], [(0,)], report, {}, started)
        else:
            # One transfer: straight to it, no lanes or tasks to set up (failures name it).
            parts = yield Transfer((message,), started)
            self._account_parts(parts, report, {}, (0,))
        yield Mark(mark, check=True)
        if report.failures:
            raise report.failures[0].error
        return report.results[0]

    def _send_many_steps(
        self, messages: Iterable[Message], first_attempt: float | datetime | None
    ) -> Steps[SendReport]:
        """``send_many``: a whole input planned at once, any other iterable streamed a
        chunk at a time within ``max_buffer_bytes`` (``_buffer``)."""
        mark = yield MARK
        started = self._started(first_attempt)
        if isinstance(messages, list | tuple | MessageColumns):
            report = yield from self._planned_steps(messages, started)
            yield Mark(mark, check=True)
            return report
        report = SendReport()
        chunks = Chunks(messages, self.max_buffer_bytes)
        handled = 0  # messages whose outcome is in the report
        try:
            while True:
                yield Read(chunks)  # the input waits while the chunk before is sent
                chunk, base = chunks.take()
                if chunk:
                    report._absorb((yield from self._planned_steps(chunk, started, base)), base)
                    handled = base + len(chunk)
                if chunks.exhausted:
                    break
                yield Pause()
            yield Mark(mark, check=True)
        except BaseException as exc:
            if handled:
                sent_before(exc, report, handled)
            raise
        report._in_input_order()
        return report

    def _planned_steps(
        self, items: Sequence[Message], started: float | None, base: int = 0
    ) -> Steps[SendReport]:
        """Plan ``items`` (a whole call, or a chunk of a streamed one from input position
        ``base``), send them, and report with positions from 0."""
        plan = yield from self._plan_steps(items, base)
        report = SendReport()
        failed: dict[object, SendError] = {}
        plan.reordered |= yield from self._fly_steps(
            plan.batches, plan.positions, report, failed, started
        )
        self._account_repeats(items, plan, report, failed)
        logger.debug(
            "send_many to %r: %d message(s) in %d transfer(s): %r",
            self.profile.name,
            len(items),
            len(plan.batches),
            report,
        )
        return report

    def _plan_steps(self, items: Sequence[Message], base: int = 0) -> Steps[_Plan]:
        """``_plan_remembered``, a slice at a time for a big input when the shell pauses
        (other tasks run between slices, a cancellation too: nothing is sent then); every
        message is validated before any is sent."""
        step = self._slice("plan")
        if step is None or len(items) <= step:
            return self._plan_remembered(items, what="messages", base=base)
        planning = _Planning(self, items, "messages", True, base)
        additions = self._memory.additions
        while True:
            with self._state_lock:
                more = planning.step(step)
            if not more:
                break
            yield Pause()
        plan = planning.result()
        self._remember_stepped(plan, items, "messages", additions, base)
        return plan

    # -- a planned call's transfers, with the ledger around them -------------------------

    def _fly_steps(
        self,
        batches: Sequence[Sequence[Message]],
        positions: Sequence[Sequence[int]],
        report: SendReport,
        failed: dict[object, SendError],
        started: float | None,
    ) -> Steps[bool]:
        """Every transfer, up to ``max_in_flight`` at once, one per key at a time, then
        the report in input order whatever order they ended in; through the ledger when
        the sender has one. Whether the ledger took entries out of the transfers' order."""
        if self._ledger is not None:
            return (yield from self._ledger_steps(batches, positions, report, failed, started))
        outcomes = yield Flights(batches, started)
        yield from self._account_steps(outcomes, positions.__getitem__, report, failed)
        return False

    def _ledger_steps(
        self,
        batches: Sequence[Sequence[Message]],
        positions: Sequence[Sequence[int]],
        report: SendReport,
        failed: dict[object, SendError],
        started: float | None,
    ) -> Steps[bool]:
        """The transfers with the ledger's run around them (``sendonce.ledger._run``).

        The next window's intents are written in a worker thread while this window's
        transfers are in flight, as far ahead as the run allows; a transfer starts only
        once its window is durable. On the way out, interrupted or not, intents never
        attempted are released and acknowledged transfers confirmed.
        """
        layer = self._ledger_layer
        assert layer is not None
        setup = (batches, positions, report, failed, started)
        run = yield Store(self._ledger_run, setup, light=len(batches) <= LIGHT_RUN)
        outcomes: list[list[Part]] = [[] for _ in batches]
        ahead = yield Ahead(run)
        try:
            ahead.launch()
            yield LedgerFlights(run, ahead, outcomes)
        finally:
            yield Drain(ahead)  # a window written ahead: learn its owner, to release it
            releases, confirmation = ahead.closing()
            yield Store(settle, (layer, releases, confirmation))
        yield from self._account_steps(outcomes, run.sent_at, report, failed)
        yield Store(layer.ledger.maybe_prune)
        return bool(run.reordered)

    def _account_steps(
        self,
        outcomes: Sequence[Sequence[Part]],
        at: Callable[[int], Sequence[int]],
        report: SendReport,
        failed: dict[object, SendError],
    ) -> Steps[None]:
        """Record what became of each transfer (``at(i)``: the input positions of the
        messages transfer ``i`` sent), pausing between slices."""
        step = self._slice("account")
        for index, parts in enumerate(outcomes):
            if parts:
                self._account_parts(parts, report, failed, at(index))
            if step is not None and index % step == step - 1:
                yield Pause()

    # -- schedule, all-or-nothing groups -------------------------------------------------

    def _schedule_steps(
        self, message: Message, at: datetime, first_attempt: float | datetime | None
    ) -> Steps[SendResult]:
        """``schedule``: one message for ``at``, through the ledger when there is one."""
        mark = yield MARK
        self._check_schedule_time(message, at)
        started = self._started(first_attempt)
        self._plan_remembered((message,), what="message", batch=False)
        layer = self._ledger_layer
        prepared: Prepared | None = None
        if layer is not None:
            try:
                written: Prepared | Exception = yield Store(
                    layer.intents, ([message], layer.keys([message]), None)
                )
            except LEDGER_FAILURES as exc:
                written = exc
            decided = layer.schedule_start(message, written)
            if isinstance(decided, SendResult):
                return decided
            prepared = decided
            started = layer.resumed(prepared, started)
        try:
            attempted = yield Schedule(message, at, started)
        except PermanentSendError:
            if layer is not None and prepared is not None:  # refused: nothing was stored
                yield Store(layer.release_quietly, (prepared.refused([0]), prepared.owner))
            raise
        result = ack_results(
            [message],
            attempted.value,
            attempted.attempts,
            attempted.in_doubt_before,
            scheduled=True,
        )[0]
        if layer is not None and prepared is not None:
            yield Store(layer.confirm_quietly, (layer.scheduled(prepared, result),))
        yield Mark(mark, check=True)
        return result

    def _atomic_steps(
        self, messages: list[Message], started: float | None = None
    ) -> Steps[SendReport]:
        """An all-or-nothing group: one atomic transfer; members of a group the broker
        ignored (another member was a duplicate) are failures in the report."""
        self._plan_remembered(messages, what="transaction", batch=False)
        report = SendReport()
        if messages:
            attempted = yield Attempt(messages, started, atomic=True)
            self._account(report, messages, attempted, {}, range(len(messages)))
        return report


class TransactionCore:
    """What both senders' transactions do: validate now, collect, send on commit."""

    def __init__(self, sender: SenderCalls, started: float | None = None) -> None:
        self._sender = sender
        self._started = started
        self.messages: list[Message] = []
        self.report: SendReport | None = None

    def _add(self, messages: Iterable[Message], what: str) -> None:
        batch = list(messages)
        self._sender._plan(batch, what=what, batch=False)
        self.messages.extend(batch)


def settle(
    layer: LedgerLayer,
    releases: list[tuple[list[Key], str]],
    confirmation: Confirmation | None,
) -> None:
    """The ledger writes of a call's way out (one worker-thread hop in aio)."""
    for keys, owner in releases:
        layer.release_quietly(keys, owner)
    if confirmation:
        layer.confirm_quietly(confirmation)
