"""One entity's claimed rows, published in waves that keep each key's order.

A key's rows go out one transfer per key per wave (as many of its rows as the sender puts in
one transfer), so a transfer that fails is never followed by a later row of its key: the
key's remaining rows are released for a later round. Each ``send_many`` call's outcomes are
recorded in the round (:class:`~sendonce.outbox._round.Round`), and the keys it finished
handed to the settlement while the next call is sent.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime

from .._entity import EntityProfile
from .._report import SendReport
from .._retry import RetryPolicy
from .._sender import IdempotentSender
from ..errors import (
    LedgerError,
    NotStoredError,
    PayloadConflictError,
    SendError,
    ValidationError,
)
from ..ledger import Ledger
from ._round import Round
from ._store import ClaimedRow, Settled
from ._telemetry import forwarded
from ._verdict import conflicts, named, storage, text, verdict

__all__ = ["Publisher"]

_PER_MESSAGE_OVERHEAD = 64  # what the sender counts per message when it fills a transfer
_SETTLE_EVERY = 500
"""Messages per ``send_many`` call of a wave: the outcomes of the keys a call finished are
settled while the next call is sent, so a round's last settlement is of one call's rows."""


class Publisher:
    """Sends one entity's claimed rows at a time, for one relay (its stop event, its
    settlement and its ledger)."""

    def __init__(
        self,
        stopping: threading.Event,
        settle: Callable[[Settled], object],
        ledger: Ledger | None,
    ) -> None:
        self.stopping = stopping
        self.settle = settle
        self.ledger = ledger

    def publish(
        self, sender: IdempotentSender, rows: list[ClaimedRow], now: datetime, done: Round
    ) -> None:
        """Send one entity's rows (in key and sequence order, as claimed) in waves, each
        carrying its producer's trace context when it has one and it fits."""
        profile = sender.profile
        keyed: dict[str, deque[ClaimedRow]] = {}
        unordered: list[ClaimedRow] = []
        valid: list[ClaimedRow] = []
        seen: dict[str, dict[str, str] | None] = {}  # each stored context, decoded once
        for row in rows:
            try:
                profile.check(row.message)
            except ValidationError as exc:
                done.dead.append((row.id, "invalid", text(exc)))
                continue
            if row.trace_context is not None:  # the producer's context, on the message
                traced = forwarded(row.message, row.trace_context, profile, seen)
                if traced is None:
                    done.untraced += 1  # it would not fit: sent as it was enqueued
                elif traced is not row.message:
                    row = row._replace(message=traced)
            valid.append(row)
        conflicting = conflicts(profile, valid)
        for row in valid:
            conflict = conflicting.get(row.id)
            if conflict is not None:
                done.dead.append((row.id, "conflict", conflict))
                continue
            if row.okey is None:
                unordered.append(row)
            else:
                queue = keyed.get(row.okey)
                if queue is None:
                    keyed[row.okey] = queue = deque()
                queue.append(row)
        while (keyed or unordered) and not self.stopping.is_set():
            wave = [[row] for row in unordered]
            unordered = []
            for queue in keyed.values():
                wave.append(self.chunk(sender, queue))
            failed_keys = self.send_wave(sender, wave, now, done, keyed)
            for key in list(keyed):
                if key in failed_keys:
                    for row in keyed.pop(key):
                        done.release(row, tried=False)
                elif not keyed[key]:
                    del keyed[key]
        for queue in keyed.values():  # stopping: what is left was never tried
            for row in queue:
                done.release(row, tried=False)
        for row in unordered:
            done.release(row, tried=False)

    @staticmethod
    def chunk(sender: IdempotentSender, queue: deque[ClaimedRow]) -> list[ClaimedRow]:
        """The rows of one key that the sender puts in one transfer, taken off the queue.

        All share their prior first attempt (one ``send_many`` call each).
        """
        profile = sender.profile
        if profile.partitioned and profile.duplicate_detection:
            return [queue.popleft()]  # one message per transfer on such entities
        limit, cap = profile.max_message_size, sender.max_batch_messages
        first = queue.popleft()
        chunk = [first]
        prior = first.prior_attempt
        size = first.message.size + _PER_MESSAGE_OVERHEAD
        while queue and len(chunk) < cap:
            nxt = queue[0]
            size += nxt.message.size + _PER_MESSAGE_OVERHEAD
            if size > limit or nxt.prior_attempt != prior:
                break
            chunk.append(queue.popleft())
        return chunk

    def send_wave(
        self,
        sender: IdempotentSender,
        wave: list[list[ClaimedRow]],
        now: datetime,
        done: Round,
        keyed: dict[str, deque[ClaimedRow]],
    ) -> set[str]:
        """Send one wave of chunks (one per key), the keys that failed.

        One ``send_many`` per prior first attempt, of at most ``_SETTLE_EVERY`` messages
        (whole chunks: a key's chunk is one call). After each call the outcomes of the keys
        it finished go to the settlement (in the worker) while the next call is sent.
        """
        groups: dict[datetime | None, list[list[ClaimedRow]]] = {}
        for chunk in wave:
            groups.setdefault(chunk[0].prior_attempt, []).append(chunk)
        # A key is still sending while it has rows queued for a later wave or its chunk of
        # this wave is not sent yet: its outcomes so far (its head's lease) are kept.
        queued: set[str | None] = {key for key, queue in keyed.items() if queue}
        unsent: set[str | None] = {chunk[0].okey for chunk in wave}
        failed: set[str] = set()
        for prior, chunks in sorted(groups.items(), key=lambda g: (g[0] is not None, g[0] or now)):
            part: list[ClaimedRow] = []
            for i, chunk in enumerate(chunks):
                part.extend(chunk)
                if len(part) < _SETTLE_EVERY and i + 1 < len(chunks):
                    continue
                failed |= self.send_group(sender, part, prior, now, done)
                unsent.difference_update([row.okey for row in part])
                part = []
                ready = done.finished(queued | unsent)
                if ready is not None:
                    self.settle(ready)
        return failed

    def send_group(
        self,
        sender: IdempotentSender,
        group: list[ClaimedRow],
        prior: datetime | None,
        now: datetime,
        done: Round,
    ) -> set[str]:
        failed: set[str] = set()
        rows = group
        while rows:
            try:
                report = sender.send_many([r.message for r in rows], first_attempt=prior)
            except (ValidationError, PayloadConflictError) as exc:
                # Refused while planning: nothing of the call was sent. Set the named
                # message aside and send the rest.
                refused = named(exc, rows)
                if not refused:
                    for row in rows:
                        done.release_untouched(row, text(exc))
                        done.transient += 1
                        if row.okey is not None:
                            failed.add(row.okey)
                    return failed
                for row in refused:
                    reason = "conflict" if isinstance(exc, PayloadConflictError) else "invalid"
                    done.dead.append((row.id, reason, text(exc)))
                rows = [r for r in rows if r not in refused]
                continue
            except SendError as exc:
                for row in rows:
                    done.release(row, tried=True, error=text(exc))
                    done.transient += 1
                    if row.okey is not None:
                        failed.add(row.okey)
                return failed
            failed |= self.account(sender.profile, sender.retry, rows, report, prior, now, done)
            return failed
        return failed

    def account(
        self,
        profile: EntityProfile,
        retry: RetryPolicy,
        rows: Sequence[ClaimedRow],
        report: SendReport,
        prior: datetime | None,
        now: datetime,
        done: Round,
    ) -> set[str]:
        if not report.failures and not report.duplicates:
            # Every message stored by this call: no result objects to build or match.
            done.published.extend((row.id, "sent", None) for row in rows)
            return set()
        waiting: dict[tuple[str, str | None], deque[ClaimedRow]] = {}
        for row in rows:
            m = row.message
            waiting.setdefault((m.message_id, m.partition_key), deque()).append(row)
        for result in report.results:
            queue = waiting.get((result.message_id, result.partition_key))
            if queue:
                row = queue.popleft()
                done.published.append((row.id, result.outcome, result.sequence_number))
        failed: set[str] = set()
        first_attempt = prior if prior is not None else now
        for failure in report.failures:
            queue = waiting.get((failure.message_id, failure.partition_key))
            if not queue:
                continue
            row = queue.popleft()
            why = verdict(failure.error, profile, retry, first_attempt, self.ledger)
            if why is None and row.okey is not None:
                failed.add(row.okey)  # a row moved aside does not hold its key back
            if why is None:
                done.transient += 1
                if isinstance(failure.error, NotStoredError | LedgerError) or storage(
                    failure.error
                ):
                    done.release_untouched(row, text(failure.error))
                else:
                    done.release(row, tried=True, error=text(failure.error))
            else:
                done.dead.append((row.id, why, text(failure.error)))
        for queue in waiting.values():  # neither a result nor a failure: keep it pending
            for row in queue:
                done.release(row, tried=True, error="no outcome reported")
                if row.okey is not None:
                    failed.add(row.okey)
        return failed
