"""The relay: publish what the outbox holds, exactly once, in commit order per key.

A round claims rows (``_store``), publishes them through the public sender
(``IdempotentSender.send_many``), and settles them: published rows marked, rows that can
never be sent moved aside with their reason, the rest released for a later round. Each
key's outcomes are settled (one statement per ``send_many`` call, in the relay's worker
thread) as soon as the key has nothing left to send in the round, while the next transfers
are in flight. Any number of relays may run on one table.

Order per key inside a round: a key's claimed rows go out in **waves**, one transfer per
key per wave (as many of its rows as the sender puts in one transfer), so a transfer that
fails is never followed by a later row of its key: the key's remaining rows are released
and wait for the next round. Rows first tried in an earlier round keep that first attempt
(``send_many(first_attempt=...)``), so a resend never outlives the broker's window.

Wake-up: ``LISTEN``; with nothing to do a relay waits for a notification, and claims again
at the latest after ``poll_interval`` (leases of a dead relay expire; a producer may enqueue
with ``notify=False``). While the broker is down the relay backs off (tenacity).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import tenacity

from .. import _telemetry
from .._entity import EntityProfile
from .._names import name_key
from .._report import SendReport
from .._retry import RetryPolicy
from .._sender import IdempotentSender
from ..backends import Backend, connect
from ..errors import (
    ConfigurationError,
    InDoubtError,
    LedgerError,
    NotStoredError,
    PayloadConflictError,
    PermanentSendError,
    SendError,
    TransientSendError,
    ValidationError,
    redact,
)
from ..ledger import Ledger
from ._enqueue import CHANNEL
from ._store import ClaimedRow, RelayStore, Settled, check_url

__all__ = ["DEFAULT_RELAY_RETRY", "Relay", "RelayTotals"]

logger = logging.getLogger("sendonce.outbox")
T = TypeVar("T")

DEFAULT_RELAY_RETRY = RetryPolicy(
    max_attempts=3, initial_backoff=0.2, max_backoff=2.0, attempt_timeout=10.0
)
"""The sender's retries inside one round: short, because the relay itself backs off and
tries again in a later round (with the first attempt kept, so the window still bounds it)."""
_PER_MESSAGE_OVERHEAD = 64  # what the sender counts per message when it fills a transfer
_SETTLE_EVERY = 500
"""Messages per ``send_many`` call of a wave: the outcomes of the keys a call finished are
settled while the next call is sent, so a round's last settlement is of one call's rows."""


@dataclass(slots=True)
class RelayTotals:
    """What a relay has done since it started."""

    published: int = 0
    dead: int = 0
    released: int = 0
    rounds: int = 0
    dead_reasons: dict[str, int] = field(default_factory=dict)

    def since(self, earlier: RelayTotals) -> RelayTotals:
        """What was done after ``earlier`` (a copy taken then)."""
        reasons = {
            k: v - earlier.dead_reasons.get(k, 0)
            for k, v in self.dead_reasons.items()
            if v != earlier.dead_reasons.get(k, 0)
        }
        return RelayTotals(
            self.published - earlier.published,
            self.dead - earlier.dead,
            self.released - earlier.released,
            self.rounds - earlier.rounds,
            reasons,
        )

    def copy(self) -> RelayTotals:
        return RelayTotals(
            self.published, self.dead, self.released, self.rounds, dict(self.dead_reasons)
        )


class _StopWhenSet(tenacity.stop.stop_base):
    """Stop retrying once the relay is asked to stop."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.event.is_set()


class _Unavailable(Exception):
    """Internal: a round published nothing and some rows failed transiently: back off."""


_Released = tuple[int, bool, datetime | None, bool, str | None, datetime, int | None, bool]


@dataclass(slots=True)
class _Round:
    """The fate of each claimed row, filled in as waves complete.

    Outcomes are handed to the settlement in parts (:meth:`finished`) as soon as their key
    has no row left to send in this round, so the database marks them while later transfers
    are in flight; a key still sending keeps its outcomes (and its head's lease) until it is
    done, so no other relay can start on its later rows meanwhile.
    """

    published: list[tuple[int, str, int | None]] = field(default_factory=list)
    dead: list[tuple[int, str, str]] = field(default_factory=list)
    released: list[_Released] = field(default_factory=list)
    transient: int = 0
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    key_of: dict[int, str | None] = field(default_factory=dict)
    """Each claimed row's order key (None: unordered), by row id."""
    handed: set[int] = field(default_factory=set)
    """Rows whose outcome went to a settlement already."""
    _seen: list[int] = field(default_factory=lambda: [0, 0, 0])
    _held: tuple[list[Any], list[Any], list[Any]] = field(default_factory=lambda: ([], [], []))

    def release(self, row: ClaimedRow, *, tried: bool, error: str | None = None) -> None:
        """Back to pending. A row that may have reached the broker keeps its first attempt;
        one that cannot have (never tried, or refused before the broker) gets its old one."""
        self._add(row, tried, tried, error)

    def release_untouched(self, row: ClaimedRow, error: str | None = None) -> None:
        """Tried, yet nothing can have been stored (refused connection, ledger down)."""
        self._add(row, False, True, error)

    def _add(self, row: ClaimedRow, keep: bool, tried: bool, error: str | None) -> None:
        attempted = row.prior_attempt if row.prior_attempt is not None else self.now
        self.released.append(
            (row.id, keep, row.prior_attempt, tried, error, attempted, row.through_before, row.head)
        )

    def finished(self, sending: set[str | None]) -> Settled | None:
        """The outcomes not handed over yet whose key is not in ``sending``; None if none."""
        parts: list[list[Any]] = []
        key_of, handed = self.key_of, self.handed
        columns: tuple[list[Any], list[Any], list[Any]] = (self.published, self.dead, self.released)
        for i, entries in enumerate(columns):
            held = self._held[i]
            fresh = entries[self._seen[i] :]
            self._seen[i] = len(entries)
            ready: list[Any] = []
            keep: list[Any] = []
            for entry in (*held, *fresh) if held else fresh:
                key = key_of.get(entry[0])
                (keep if key is not None and key in sending else ready).append(entry)
            held[:] = keep
            handed.update(entry[0] for entry in ready)
            parts.append(ready)
        if not any(parts):
            return None
        return Settled(parts[0], parts[1], parts[2])


class _Listener:
    """A connection that LISTENs on the outbox channel; reconnected when lost."""

    def __init__(self, url: str, entities: set[str]) -> None:
        self.url = url
        self.entities = entities
        self._conn: Any = None

    def _connect(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
            self._conn.execute(f"LISTEN {CHANNEL}")
        return self._conn

    def start(self) -> None:
        self._connect()

    def wait(self, timeout: float, stopping: threading.Event) -> bool:
        """Wait up to ``timeout`` s for a notification about one of our entities, or a stop.

        Waits on the socket in slices of at most 0.25 s (no query is sent meanwhile).
        True when woken by a notification (or a reconnection, which may have missed one).
        """
        import psycopg

        deadline = _monotonic() + timeout
        while not stopping.is_set():
            left = deadline - _monotonic()
            if left <= 0:
                return False
            try:
                conn = self._connect()
                for notify in conn.notifies(timeout=min(left, 0.25)):
                    if notify.payload in self.entities:
                        return True
            except psycopg.OperationalError as exc:
                logger.warning("outbox listener lost its connection (%s); reconnecting", exc)
                self.close()
                stopping.wait(min(1.0, max(left, 0.0)))
                return True
        return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _monotonic() -> float:
    import time

    return time.monotonic()


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
        self._listener: _Listener | None = None
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
            policy = retry if retry is not None else DEFAULT_RELAY_RETRY
            for target in targets:
                sender = self._sender(target, policy, max_in_flight)
                self._senders[name_key(sender.profile.name)] = sender
            self._store = RelayStore(url)
            self._listener = _Listener(url, set(self._senders))
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
        next_prune = _monotonic()
        while not self._stopping.is_set():
            if _monotonic() >= next_prune:
                self._prune()
                next_prune = _monotonic() + self.prune_interval
            claimed = self._round_with_backoff()
            if claimed == 0 and not self._stopping.is_set():
                self._release_ahead()
                wait = min(self.poll_interval, max(next_prune - _monotonic(), 0.0))
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
        if _telemetry.active() is not None:
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
        done = _Round(now=now)
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
                before = (len(done.published), len(done.dead), len(done.released))
                with _telemetry.relay_batch(
                    sender.profile.name, len(entity_rows), system=system
                ) as scope:
                    self._publish(sender, entity_rows, now, done)
                    scope.set(
                        published=len(done.published) - before[0],
                        dead=len(done.dead) - before[1],
                        released=len(done.released) - before[2],
                    )
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
                done = _Round(now=now)
                for row in rows:
                    done.release(row, tried=False)
                self._settle(Settled([], [], done.released))
        self._wait_worker()  # every settlement queued has run

    def _count(self, done: _Round) -> None:
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

    # -- one entity's rows ---------------------------------------------------------------

    def _publish(
        self, sender: IdempotentSender, rows: list[ClaimedRow], now: datetime, done: _Round
    ) -> None:
        """Send one entity's rows (in key and sequence order, as claimed) in waves."""
        profile = sender.profile
        keyed: dict[str, deque[ClaimedRow]] = {}
        unordered: list[ClaimedRow] = []
        valid: list[ClaimedRow] = []
        for row in rows:
            try:
                profile.check(row.message)
            except ValidationError as exc:
                done.dead.append((row.id, "invalid", _text(exc)))
                continue
            valid.append(row)
        conflicts = _conflicts(profile, valid)
        for row in valid:
            conflict = conflicts.get(row.id)
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
        while (keyed or unordered) and not self._stopping.is_set():
            wave = [[row] for row in unordered]
            unordered = []
            for queue in keyed.values():
                wave.append(self._chunk(sender, queue))
            failed_keys = self._send_wave(sender, wave, now, done, keyed)
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
    def _chunk(sender: IdempotentSender, queue: deque[ClaimedRow]) -> list[ClaimedRow]:
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

    def _send_wave(
        self,
        sender: IdempotentSender,
        wave: list[list[ClaimedRow]],
        now: datetime,
        done: _Round,
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
                failed |= self._send_group(sender, part, prior, now, done)
                unsent.difference_update([row.okey for row in part])
                part = []
                ready = done.finished(queued | unsent)
                if ready is not None:
                    self._submit(self._settle, ready)
        return failed

    def _send_group(
        self,
        sender: IdempotentSender,
        group: list[ClaimedRow],
        prior: datetime | None,
        now: datetime,
        done: _Round,
    ) -> set[str]:
        failed: set[str] = set()
        rows = group
        while rows:
            try:
                report = sender.send_many([r.message for r in rows], first_attempt=prior)
            except (ValidationError, PayloadConflictError) as exc:
                # Refused while planning: nothing of the call was sent. Set the named
                # message aside and send the rest.
                named = _named(exc, rows)
                if not named:
                    for row in rows:
                        done.release_untouched(row, _text(exc))
                        done.transient += 1
                        if row.okey is not None:
                            failed.add(row.okey)
                    return failed
                for row in named:
                    reason = "conflict" if isinstance(exc, PayloadConflictError) else "invalid"
                    done.dead.append((row.id, reason, _text(exc)))
                rows = [r for r in rows if r not in named]
                continue
            except SendError as exc:
                for row in rows:
                    done.release(row, tried=True, error=_text(exc))
                    done.transient += 1
                    if row.okey is not None:
                        failed.add(row.okey)
                return failed
            failed |= self._account(sender.profile, sender.retry, rows, report, prior, now, done)
            return failed
        return failed

    def _account(
        self,
        profile: EntityProfile,
        retry: RetryPolicy,
        rows: Sequence[ClaimedRow],
        report: SendReport,
        prior: datetime | None,
        now: datetime,
        done: _Round,
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
            verdict = _verdict(failure.error, profile, retry, first_attempt, self._ledger)
            if verdict is None and row.okey is not None:
                failed.add(row.okey)  # a row moved aside does not hold its key back
            if verdict is None:
                done.transient += 1
                if isinstance(failure.error, NotStoredError | LedgerError) or _storage(
                    failure.error
                ):
                    done.release_untouched(row, _text(failure.error))
                else:
                    done.release(row, tried=True, error=_text(failure.error))
            else:
                done.dead.append((row.id, verdict, _text(failure.error)))
        for queue in waiting.values():  # neither a result nor a failure: keep it pending
            for row in queue:
                done.release(row, tried=True, error="no outcome reported")
                if row.okey is not None:
                    failed.add(row.okey)
        return failed


_INDEX = re.compile(r"\bmessages\[(\d+)\]")


def _conflicts(profile: EntityProfile, rows: Sequence[ClaimedRow]) -> dict[int, str]:
    """The rows to move aside as payload conflicts, with the error to record.

    A row whose id (its entity's duplicate-detection key) was published with another body,
    while that row is kept (``retention``), conflicts with it: the broker holds the other
    body and would drop this one (or the ledger would skip it), so it is never published.
    Among the rows of one round sharing a key, the first enqueued (lowest row id) is sent
    and each later one with another body conflicts with it.
    """
    found: dict[int, str] = {}
    first: dict[Any, ClaimedRow] = {}
    for row in sorted(rows, key=lambda r: r.id):
        m = row.message
        if row.conflict_at is not None:
            found[row.id] = (
                f"PayloadConflictError: payload conflict with the row published at "
                f"{row.conflict_at.isoformat()} under message id {m.message_id!r}: the broker "
                "holds that body and would drop this one; nothing was sent"
            )
            continue
        key = profile.dedup_key(m)
        earlier = first.get(key)
        if earlier is None:
            first[key] = row
        elif earlier.message.body_bytes != m.body_bytes:
            found[row.id] = (
                f"PayloadConflictError: payload conflict with outbox row {earlier.id} (enqueued "
                f"before it under message id {m.message_id!r}, sent in the same round with "
                "another body); nothing was sent"
            )
    return found


def _named(exc: ValidationError | SendError, rows: list[ClaimedRow]) -> list[ClaimedRow]:
    """The rows a refusal of the whole call names (by message id, else by its index)."""
    mid = getattr(exc, "message_id", None)
    if mid is not None:
        return [r for r in rows if r.message.message_id == mid]
    found = _INDEX.search(str(exc))
    if found is not None and int(found.group(1)) < len(rows):
        return [rows[int(found.group(1))]]
    return []


def _storage(error: SendError) -> bool:
    """The local broker's disk-full error: nothing of the call was stored; try later."""
    return type(error).__name__ == "BrokerStorageError"


def _verdict(
    error: SendError,
    profile: EntityProfile,
    retry: RetryPolicy,
    first_attempt: datetime,
    ledger: Ledger | None,
) -> str | None:
    """Why a failed row can never be sent (it is moved aside), or None: try again later."""
    if isinstance(error, PayloadConflictError):
        return "conflict"
    if isinstance(error, NotStoredError | LedgerError) or _storage(error):
        return None
    if isinstance(error, InDoubtError):
        if not profile.duplicate_detection:
            return "in-doubt"  # nothing remembers the id: a resend could duplicate it
        window = profile.window
        if window is None:  # a count-bounded id cache (Artemis): no time limit to pass
            if ledger is not None or not isinstance(error.last_error, TransientSendError):
                # The ledger decides an unconfirmed key in doubt at once on such an entity,
                # and the backend refuses a resend beyond its cache's reach: neither changes
                # in a later round, so trying again would hold the key back for ever.
                return "in-doubt"
            return None  # retries ran out: a later round resends within the cache's reach
        deadline = first_attempt + window - retry.safety_margin
        return "in-doubt" if datetime.now(UTC) >= deadline else None
    if isinstance(error, PermanentSendError):
        return "refused"
    return None


def _text(error: BaseException) -> str:
    return redact(f"{type(error).__name__}: {error}")


def _positive(name: str, value: object) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not value > 0
        or value != value
    ):
        raise ConfigurationError(f"{name} must be a positive number of seconds", field=name)
