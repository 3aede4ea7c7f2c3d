"""The relay: publish what the outbox holds, exactly once, in commit order per key.

A round claims rows (``_store``), publishes them through the public sender
(``IdempotentSender.send_many``), and settles them: published rows marked, rows that can
never be sent moved aside with their reason, the rest released for a later round. Each
key's outcomes are settled (one statement per ``send_many`` call, in the relay's worker
thread) as soon as the key has nothing left to send in the round, while the next transfers
are in flight. Any number of relays may run on one table.

This module is the relay's life and its rounds: claiming (and claiming ahead), the lease
heartbeat, settling, pruning and backing off. Its parts live beside it, one concept each:
the waves that keep a key's order (``_waves``), what a failure means for a row
(``_verdict``), a round's outcomes and the totals (``_round``), the ``LISTEN`` wake-up
(``_listener``), and the relay's span and gauges (``_telemetry``). Rows first tried in an
earlier round keep that first attempt (``send_many(first_attempt=...)``), so a resend never
outlives the broker's window.

Wake-up: ``LISTEN``; with nothing to do a relay waits for a notification, and claims again
at the latest after ``poll_interval`` (leases of a dead relay expire; a producer may enqueue
with ``notify=False``). While the broker is down the relay backs off (tenacity).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import tenacity

from .._entity import EntityProfile
from .._names import name_key
from .._retry import RetryPolicy
from .._sender import IdempotentSender
from ..backends import Backend, connect
from ..errors import ConfigurationError, redact
from ..ledger import Ledger
from . import _telemetry
from ._listener import Listener
from ._round import RelayTotals, Round
from ._store import ClaimedRow, RelayStore, Settled, check_url
from ._waves import Publisher

__all__ = ["DEFAULT_RELAY_RETRY", "Relay", "RelayTotals"]

logger = logging.getLogger("sendonce.outbox")
T = TypeVar("T")

DEFAULT_RELAY_RETRY = RetryPolicy(
    max_attempts=3, initial_backoff=0.2, max_backoff=2.0, attempt_timeout=10.0
)
"""The sender's retries inside one round: short, because the relay itself backs off and
tries again in a later round (with the first attempt kept, so the window still bounds it)."""


class _StopWhenSet(tenacity.stop.stop_base):
    """Stop retrying once the relay is asked to stop."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.event.is_set()


class _Unavailable(Exception):
    """Internal: a round published nothing and some rows failed transiently: back off."""


class Relay:
    """Publishes the outbox's rows for ``entities`` through ``backend``; many may run at once.

    ``outbox`` is the PostgreSQL url of the outbox (its schema is created or migrated on
    start). ``backend`` is a :class:`~sendonce.backends.Backend` or a url for
    :func:`~sendonce.backends.connect` (closed with the relay). ``entities`` are the
    queues/topics this relay serves (profiles, or names the backend describes); rows of
    other entities are left to other relays. An entity without duplicate detection is
    refused unless ``ledger`` (a :class:`~sendonce.ledger.Ledger` or its url) is given:
    without one a resend after a crash would publish a duplicate.

    ``lease``: how long a claim is held without renewal (renewed every third of it while
    its transfers are in flight); a dead relay's rows are taken over after it.
    ``poll_interval``: the longest wait between claims when no notification comes.
    ``retention``: how long published rows are kept (marked) before pruning;
    ``timedelta(0)`` deletes them at once. ``batch_size``: keys (and unordered rows)
    claimed per round (the first round after idle takes a tenth); ``per_key``: rows per
    key per round.
    """

    def __init__(
        self,
        outbox: str,
        backend: Backend | str,
        entities: Iterable[EntityProfile | str],
        *,
        ledger: Ledger | str | None = None,
        retry: RetryPolicy | None = None,
        lease: timedelta = timedelta(seconds=30),
        poll_interval: float = 5.0,
        batch_size: int = 500,
        per_key: int = 100,
        retention: timedelta = timedelta(hours=1),
        prune_interval: float = 60.0,
        max_in_flight: int | None = None,
        backoff_max: float = 30.0,
    ) -> None:
        url = check_url(outbox)
        targets = list(entities) if not isinstance(entities, str | EntityProfile) else [entities]
        if not targets:
            raise ConfigurationError("a relay needs at least one entity to serve", field="entities")
        _positive("lease", lease.total_seconds() if isinstance(lease, timedelta) else None)
        _positive("poll_interval", poll_interval)
        _positive("prune_interval", prune_interval)
        _positive("backoff_max", backoff_max)
        for name, value in (("batch_size", batch_size), ("per_key", per_key)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"{name} must be an int >= 1", field=name)
        if not isinstance(retention, timedelta) or retention < timedelta(0):
            raise ConfigurationError("retention must be a timedelta >= 0", field="retention")
        self.url = url
        self.lease = lease
        self.poll_interval = float(poll_interval)
        self.batch_size = batch_size
        self.per_key = per_key
        self.retention = retention
        self.prune_interval = float(prune_interval)
        self.backoff_max = float(backoff_max)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.totals = RelayTotals()
        self._stopping = threading.Event()
        self._owns_backend = isinstance(backend, str)
        self._backend: Backend = connect(backend) if isinstance(backend, str) else backend
        self._owns_ledger = isinstance(ledger, str)
        self._ledger: Ledger | None = None
        self._senders: dict[str, IdempotentSender] = {}
        self._store: RelayStore | None = None
        self._listener: Listener | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sendonce-relay")
        self._ahead: Future[tuple[list[ClaimedRow], datetime]] | None = None
        self._ahead_limit = 0
        self._last_task: Future[Any] | None = None  # the worker runs its tasks in order
        # The heads of the round in flight and the outcomes it has handed over: what the
        # heartbeat renews (one thread for the relay's life, not one per round).
        self._holding: tuple[list[int], set[int]] = ([], set())
        self._closing = threading.Event()
        self._heartbeat: threading.Thread | None = None
        try:
            self._ledger = Ledger(ledger) if isinstance(ledger, str) else ledger
            self._publisher = Publisher(self._stopping, self._settle_later, self._ledger)
            policy = retry if retry is not None else DEFAULT_RELAY_RETRY
            for target in targets:
                sender = self._sender(target, policy, max_in_flight)
                self._senders[name_key(sender.profile.name)] = sender
            self._store = RelayStore(url)
            self._listener = Listener(url, set(self._senders))
        except BaseException:
            self.close()
            raise

    def _sender(
        self, target: EntityProfile | str, policy: RetryPolicy, max_in_flight: int | None
    ) -> IdempotentSender:
        try:
            return IdempotentSender(
                self._backend,
                target,
                retry=policy,
                ledger=self._ledger,
                max_in_flight=max_in_flight,
            )
        except ConfigurationError as exc:
            if exc.field != "duplicate_detection":
                raise
            name = target.name if isinstance(target, EntityProfile) else target
            raise ConfigurationError(
                f"entity {name!r} has no duplicate detection, so a relay that resends after "
                "a crash or an in-doubt send would publish a duplicate: give the relay a "
                "ledger (ledger=..., sendonce relay --ledger URL), which remembers what was "
                "sent; nothing was published",
                field="ledger",
            ) from None

    # -- lifecycle -------------------------------------------------------------------

    @property
    def entities(self) -> list[str]:
        return list(self._senders)

    @property
    def store(self) -> RelayStore:
        assert self._store is not None
        return self._store

    def stop(self) -> None:
        """Ask :meth:`run` to return: the round in flight finishes its current wave,
        releases what it did not send, and settles. Safe from a signal handler."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def close(self) -> None:
        if self._store is not None:
            self._release_ahead()
        self._closing.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        self._worker.shutdown(wait=True)
        for sender in self._senders.values():
            sender.close()
        if self._listener is not None:
            self._listener.close()
        if self._store is not None:
            self._store.close()
        if self._owns_ledger and self._ledger is not None:
            self._ledger.close()
        if self._owns_backend:
            self._backend.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Relay({redact(self.url)!r}, entities={self.entities!r})"

    # -- running -----------------------------------------------------------------------

    def run(self) -> RelayTotals:
        """Publish until :meth:`stop`; wait for NOTIFY (at most ``poll_interval``) when idle."""
        assert self._listener is not None
        self._listener.start()
        next_prune = time.monotonic()
        while not self._stopping.is_set():
            if time.monotonic() >= next_prune:
                self._prune()
                next_prune = time.monotonic() + self.prune_interval
            claimed = self._round_with_backoff()
            if claimed == 0 and not self._stopping.is_set():
                self._release_ahead()
                wait = min(self.poll_interval, max(next_prune - time.monotonic(), 0.0))
                self._listener.wait(wait, self._stopping)
        self._release_ahead()
        return self.totals

    def drain(self) -> RelayTotals:
        """Publish until a round finds nothing to claim (or :meth:`stop`); no waiting.

        For tests, scripts and benchmarks; a round whose rows all failed transiently ends
        the drain too (they stay pending). Returns what this drain did (``totals`` holds
        everything since the relay started).
        """
        import psycopg

        before = self.totals.copy()
        while not self._stopping.is_set():
            try:
                if self.round() == 0:
                    break
            except _Unavailable:
                break
        self._release_ahead()
        try:
            self._observe_backlog()  # what a one-shot relay (a cron job) leaves behind
        except psycopg.Error as exc:
            logger.warning("outbox backlog not read (%s)", exc)
        return self.totals.since(before)

    def _round_with_backoff(self) -> int:
        """One round; while rounds keep failing for want of a broker, back off (tenacity)."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Unavailable),
            wait=tenacity.wait_random_exponential(multiplier=0.5, max=self.backoff_max),
            stop=_StopWhenSet(self._stopping),
            sleep=self._pause,
            before_sleep=self._backing_off,
            reraise=True,
        )
        try:
            return retrying(self._round_or_db_down)
        except _Unavailable:
            return 0

    def _round_or_db_down(self) -> int:
        import psycopg

        try:
            return self.round()
        except psycopg.OperationalError as exc:
            logger.warning("outbox %s unreachable (%s)", redact(self.url), exc)
            raise _Unavailable() from None

    def _pause(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # a stop ends the backoff at once

    @staticmethod
    def _backing_off(state: tenacity.RetryCallState) -> None:
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        logger.warning(
            "relay: nothing could be published (broker or outbox unavailable); next try in %.1fs",
            sleep,
        )

    def _prune(self) -> None:
        import psycopg

        try:
            self.store.prune(self.retention, 10_000)
            self._observe_backlog()  # the backlog gauges, once per prune
        except psycopg.Error as exc:
            logger.warning("outbox prune failed (%s); trying again later", exc)

    def _observe_backlog(self) -> None:
        """Set the lag and rows-pending gauges from the outbox (when telemetry is on)."""
        if _telemetry.observed():
            served = [s for s in self.store.stats() if s.entity in self._senders]
            lag = max((s.lag or 0.0 for s in served), default=0.0)
            _telemetry.relay_backlog(lag, sum(s.pending + s.leased for s in served))

    def round(self) -> int:
        """Claim, publish and settle once; the number of rows claimed (0: nothing to do).

        After a full claim the next round's claim runs in the relay's worker thread while
        this round's transfers are in flight, and each key's settlement after it as soon as
        the key is done: the database's round trips overlap the broker's. Keys in flight
        cannot be claimed twice (their heads are leased), so the overlap never reorders a key.
        Raises ``_Unavailable`` (internal) when rows failed transiently and none was
        published, after settling them.
        """
        rows, now, asked = self._claimed_rows()
        if not rows:
            return 0
        heads = sum(1 for row in rows if row.head)
        if heads >= asked:
            # A full claim: more is waiting. Claim the next round's rows meanwhile, up to
            # twice this round's keys, so that after a small first round the claim ahead
            # is ready about when this round's sends are done. (After a partial claim the
            # next one runs when this round is done: at a trickle of commits a claim ahead
            # would find nothing, and cost a statement per round.)
            self._ahead_limit = min(self.batch_size, max(2 * heads, self._first_claim))
            self._ahead = self._submit(self._claim, self._ahead_limit)
        done = Round(now=now)
        done.key_of = {row.id: row.okey for row in rows}
        self._holding = ([r.id for r in rows if r.head], done.handed)
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(
                target=self._renew, name="sendonce-relay-heartbeat", daemon=True
            )
            self._heartbeat.start()
        try:
            by_entity: dict[str, list[ClaimedRow]] = {}
            for row in rows:
                by_entity.setdefault(row.entity, []).append(row)
            system = getattr(self._backend, "messaging_system", None)
            for entity, entity_rows in by_entity.items():
                sender = self._senders[entity]
                before = (len(done.published), len(done.dead), len(done.released), done.untraced)
                with _telemetry.relay_batch(
                    sender.profile.name,
                    len(entity_rows),
                    system=system,
                    contexts=(row.trace_context for row in entity_rows),  # read if traced
                ) as scope:
                    self._publisher.publish(sender, entity_rows, now, done)
                    scope.set(
                        published=len(done.published) - before[0],
                        dead=len(done.dead) - before[1],
                        released=len(done.released) - before[2],
                    )
                    if done.untraced > before[3]:
                        scope.set(untraced=done.untraced - before[3])
        except BaseException:
            self._release_ahead()  # interrupted: hand the next round's rows back at once
            raise
        finally:
            settled_ids = {p[0] for p in done.published}
            settled_ids.update(d[0] for d in done.dead)
            settled_ids.update(r[0] for r in done.released)
            for row in rows:
                if row.id not in settled_ids:  # interrupted: it may have been sent
                    done.release(row, tried=True, error="relay interrupted")
            rest = done.finished(set())
            self._holding = ([], set())
            if rest is not None:
                self._submit(self._settle, rest)
            self._count(done)
        if done.transient and not done.published:
            self._release_ahead()  # backing off: do not hold the next round's rows meanwhile
            raise _Unavailable()
        return len(rows)

    def _claim(self, limit: int | None = None) -> tuple[list[ClaimedRow], datetime]:
        now = datetime.now(UTC)
        rows = self.store.claim(
            list(self._senders),
            self.owner,
            limit=self.batch_size if limit is None else limit,
            per_key=self.per_key - 1,
            lease=self.lease,
            now=now,
            partitioned=[k for k, s in self._senders.items() if s.profile.partitioned],
        )
        return rows, now

    def _claimed_rows(self) -> tuple[list[ClaimedRow], datetime, int]:
        """The rows claimed ahead by the previous round, else a claim now; and the limit
        of keys the claim was given.

        A claim made now (after idle, or when the claim ahead found nothing) takes a tenth
        of ``batch_size`` keys: nothing is in flight to hide it behind, so the first transfer
        should not wait for a full round to be read. Each claim ahead then takes up to twice
        the keys of the round it overlaps, up to ``batch_size``. A claim made now runs after
        the settlements queued: what they release or finish may be claimable then.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            rows, now = ahead.result()
            if rows:
                return rows, now, self._ahead_limit
        self._wait_worker()
        return *self._claim(self._first_claim), self._first_claim

    def _submit(self, task: Callable[..., T], *args: Any) -> Future[T]:
        future = self._worker.submit(task, *args)
        self._last_task = future
        return future

    def _wait_worker(self) -> None:
        """Until every task queued for the worker has run (none raises: errors are logged)."""
        last = self._last_task
        if last is not None and not last.done():
            wait([last])

    @property
    def _first_claim(self) -> int:
        return max(1, self.batch_size // 10)

    def _settle(self, settled: Settled) -> None:
        import psycopg

        try:
            self.store.settle(settled, self.owner, delete_published=self.retention == timedelta(0))
        except psycopg.Error as exc:  # the rows stay leased: taken over once the lease expires
            logger.warning("relay: could not settle %d rows (%s)", len(settled.published), exc)

    def _settle_later(self, settled: Settled) -> None:
        """Queue a settlement for the worker (it runs after the tasks queued before it)."""
        self._submit(self._settle, settled)

    def _release_ahead(self) -> None:
        """Give back the rows claimed ahead (untried), and wait for the worker to finish."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                rows, now = ahead.result()
            except Exception as exc:
                logger.warning("relay: the claim ahead failed (%s)", exc)
                rows, now = [], datetime.now(UTC)
            if rows:
                done = Round(now=now)
                for row in rows:
                    done.release(row, tried=False)
                self._settle(Settled([], [], done.released))
        self._wait_worker()  # every settlement queued has run

    def _count(self, done: Round) -> None:
        totals = self.totals
        totals.rounds += 1
        totals.published += len(done.published)
        totals.dead += len(done.dead)
        totals.released += len(done.released)
        for _, reason, _ in done.dead:
            totals.dead_reasons[reason] = totals.dead_reasons.get(reason, 0) + 1

    def _renew(self) -> None:
        """The heartbeat: every third of the lease, extend the leases of the heads held
        (the rows after a head need none): the round in flight's, less those whose outcome
        went to a settlement already, and the next round's, claimed ahead."""
        import psycopg

        every = self.lease.total_seconds() / 3
        while not self._closing.wait(every):
            heads, handed = self._holding
            ids = [i for i in heads if i not in handed]
            ahead = self._ahead  # the next round's rows wait as long as this round takes
            if ahead is not None and ahead.done() and ahead.exception() is None:
                held_now = set(ids)
                ids += [r.id for r in ahead.result()[0] if r.head and r.id not in held_now]
            if not ids:
                continue
            try:
                held = self.store.renew(ids, self.owner, self.lease)
            except psycopg.Error as exc:
                logger.warning("relay: could not renew its leases (%s)", exc)
                continue
            # Settled meanwhile (by this relay) is not lost.
            lost = [i for i in ids if i not in held and i not in handed]
            if lost:
                logger.warning(
                    "relay: %d of %d claimed rows are no longer leased to it (taken over or "
                    "settled); a copy it sends is dropped by the broker's duplicate detection",
                    len(lost),
                    len(ids),
                )


def _positive(name: str, value: object) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not value > 0
        or value != value
    ):
        raise ConfigurationError(f"{name} must be a positive number of seconds", field=name)
