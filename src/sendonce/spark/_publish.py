"""publish, partition_publisher, batch_publisher and the report they return."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .._entity import EntityProfile
from .._message import MessageSpec
from .._retry import RetryPolicy
from .._sender import IdempotentSender
from ..errors import ConfigurationError, PublishFailedError
from ..ledger import InDoubtPolicy, Ledger, LedgerOptions
from . import _telemetry
from ._ledger_placement import LedgerPlacement, check_ledger_fits
from ._placement import Placement
from ._progress import ProgressBoard, driver_host
from ._rows import ColumnPlan
from ._schema import (
    ConflictingRowsError,
    SchemaError,
    check_backend_fits,
    find_conflicts,
    is_local_master,
    master_of,
    plan_for,
    quoted,
    resolve_local_url,
)
from ._task import (
    RESULT_SCHEMA,
    LateReexecutionError,
    PartitionFailedError,
    PartitionResult,
    TaskJob,
    WindowGuard,
    retry_budget,
)

__all__ = [
    "BatchPublisher",
    "ConflictingRowsError",
    "LateReexecutionError",
    "PartitionFailedError",
    "PartitionPublisher",
    "PartitionResult",
    "PublishFailedError",
    "PublishFailure",
    "PublishReport",
    "SchemaError",
    "batch_publisher",
    "check_backend_fits",
    "is_local_master",
    "partition_publisher",
    "publish",
]

Clock = Callable[[], float]
AfterPartition = Callable[[PartitionResult], None]


@dataclass(frozen=True, slots=True)
class PublishFailure:
    """One row that was not sent: its message id (or a description), the error type and text."""

    message_id: str
    error: str
    detail: str


@dataclass(frozen=True, slots=True)
class PublishReport:
    """Exact counts of a :func:`publish` call, from each partition's successful attempt.

    A retried attempt sees the copies its failed predecessor sent as
    duplicates, so ``sent + duplicates`` (``delivered``) is the number of rows
    now on the broker from this call; ``sent`` alone depends on retries.
    """

    entity: str
    partitions: tuple[PartitionResult, ...]
    complete: bool = True
    """False on the report of a failed job: counts confirmed before it failed, at least."""
    rerun: str = field(default="", repr=False, compare=False)
    """How long publishing the same rows again is safe (said by :meth:`raise_for_failures`)."""

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    @property
    def sent(self) -> int:
        return sum(p.sent for p in self.partitions)

    @property
    def duplicates(self) -> int:
        return sum(p.duplicates for p in self.partitions)

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self.partitions)

    @property
    def delivered(self) -> int:
        """Rows confirmed on the broker: sent now or found there already."""
        return self.sent + self.duplicates

    @property
    def attempts(self) -> dict[int, int]:
        """Partition -> attempts it took (1 when its first attempt succeeded)."""
        return {p.partition: p.attempt + 1 for p in self.partitions}

    @property
    def failures(self) -> list[PublishFailure]:
        """A few failed rows per partition (all are counted in ``failed``)."""
        return [PublishFailure(*f) for p in self.partitions for f in p.failures]

    def raise_for_failures(self) -> None:
        """Raise :class:`PublishFailedError` naming a few failed rows, if any failed."""
        if not self.failed:
            return
        shown = "; ".join(f"{f.message_id!r}: {f.error}: {f.detail}" for f in self.failures[:3])
        raise PublishFailedError(
            f"{self.failed} of {self.rows} row(s) were not sent to {self.entity!r}, e.g. {shown}. "
            + (self.rerun or _WITHIN_THE_WINDOW),
            report=self,
        )

    def __repr__(self) -> str:
        return (
            f"PublishReport(entity={self.entity!r}, rows={self.rows}, sent={self.sent}, "
            f"duplicates={self.duplicates}, failed={self.failed}, "
            f"partitions={len(self.partitions)}, complete={self.complete})"
        )


# -- what a re-run guarantees ------------------------------------------------------------

_WITHIN_THE_WINDOW = (
    "Publishing the same rows again is safe only within the entity's duplicate-detection "
    "window counted from this run's first sends (rows already on the broker are dropped as "
    "duplicates); after it the broker may have forgotten them, and a re-run could send them "
    "twice without anything noticing. Pass ledger= to make a re-run safe for good."
)


def rerun_advice(profile: EntityProfile, started: float, retry: RetryPolicy, ledger: bool) -> str:
    """Whether, and until when, publishing the same rows again lands each row once.

    Without a ledger only the broker's memory protects a re-run, and it forgets: the
    window counts from the first sends, which came after ``started`` (driver wall time).
    """
    if ledger:
        return (
            "Publishing the same rows again with the same ledger is safe whenever you do it: "
            "rows the ledger confirmed are skipped, and a row it cannot vouch for is reported "
            "in doubt, not resent."
        )
    window = profile.window
    if window is None:
        return (
            "Publishing the same rows again is safe only while the broker's duplicate-id cache "
            f"(id_cache_size {profile.id_cache_size}) still holds this run's ids, that is "
            "until that many newer ids have been sent to the entity; after that a re-run could "
            "send rows twice without anything noticing. Pass ledger= to make a re-run safe "
            "for good."
        )
    until = datetime.fromtimestamp(started, UTC) + window - retry.safety_margin
    return (
        f"Publishing the same rows again is safe until {until:%Y-%m-%d %H:%M:%S} UTC (one "
        f"duplicate-detection window, {window}, after this run began, less the "
        f"{retry.safety_margin} safety margin), if the re-run has sent everything by then: "
        "rows already on the broker are dropped as duplicates. After that the broker may have "
        "forgotten them, and a re-run could send them twice without anything noticing. Pass "
        "ledger= to make a re-run safe for good."
    )


# -- shared set-up on the driver ------------------------------------------------------


def _check_url(url: object) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("url must be a non-empty backend url string", field="url")
    return resolve_local_url(url.strip())


@dataclass(frozen=True, slots=True)
class _LedgerPlan:
    """What every task opens its own ledger with: an absolute url and the options, whole."""

    url: str = field(repr=False)  # a PostgreSQL url may carry a password
    options: LedgerOptions
    placement: LedgerPlacement | None = None
    """Where the driver saw a SQLite ledger's file: every task checks it is there too."""


def _ledger_plan(ledger: object, master: str | None = None) -> _LedgerPlan | None:
    """The ledger as executors will open it (connections are never shipped).

    A url is opened once on the driver, so a bad url or an unreachable server fails
    before any task runs (and the PostgreSQL table exists before executors race). The
    url shipped is the store's own: a relative SQLite path made absolute here, so every
    executor opens the driver's file whatever its working directory.
    """
    if ledger is None:
        return None
    if isinstance(ledger, Ledger):
        return _planned(ledger, master)
    if isinstance(ledger, str):
        with Ledger(ledger) as opened:
            return _planned(opened, master)
    raise ConfigurationError("ledger must be a sendonce.Ledger or a ledger url", field="ledger")


def _planned(ledger: Ledger, master: str | None) -> _LedgerPlan:
    check_ledger_fits(ledger, master)
    return _LedgerPlan(ledger.url, ledger.options, LedgerPlacement.of(ledger))


def _profile(
    url: str,
    entity: EntityProfile | str,
    retry: RetryPolicy,
    ledger: _LedgerPlan | None = None,
) -> EntityProfile:
    """The entity's profile, resolved on the driver (the guard needs its window).

    Opening a sender also creates the entity on a backend that can (the local
    broker), once, before the executors race to do it. With a ledger the driver
    opens the very sender every task will open (same url, same ledger options), so
    whatever would make each task fail (retention against the entity's window, a
    store gone) fails here once, before any task runs.
    """
    if not isinstance(entity, EntityProfile | str) or not entity:
        raise ConfigurationError(
            "entity must be an EntityProfile or a non-empty entity name", field="entity"
        )
    with contextlib.ExitStack() as stack:
        opened = None if ledger is None else stack.enter_context(ledger.options.open(ledger.url))
        # With a ledger an entity without duplicate detection is fine: the ledger decides.
        sender = stack.enter_context(IdempotentSender(url, entity, retry=retry, ledger=opened))
        if opened is not None:
            opened.check_entity(sender.profile)
        return sender.profile


KEEP_CONNECTIONS = 30.0
"""Default seconds an executor keeps its Service Bus connection open for its next task."""


def _keep(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ConfigurationError(
            "keep_connections must be a number of seconds >= 0", field="keep_connections"
        )
    return float(seconds)


def _retry(retry: RetryPolicy | None) -> RetryPolicy:
    if retry is None:
        return RetryPolicy()
    if not isinstance(retry, RetryPolicy):
        raise ConfigurationError("retry must be a sendonce.RetryPolicy", field="retry")
    return retry


def _guard(
    profile: EntityProfile, retry: RetryPolicy, clock: Clock, ledger: _LedgerPlan | None = None
) -> WindowGuard:
    # With a ledger a late re-execution is safe: the ledger skips confirmed rows and
    # reports unconfirmed ones past the window as in doubt instead of resending them.
    window = None if ledger is not None else profile.window
    return WindowGuard(
        started=clock(),
        window=None if window is None else window.total_seconds(),
        margin=retry.safety_margin.total_seconds(),
        budget=retry_budget(retry, window),
        clock=clock,
        entity=profile.name,
    )


# -- publish ------------------------------------------------------------------------------


def publish(
    df: Any,
    url: str,
    entity: EntityProfile | str,
    spec: MessageSpec,
    *,
    retry: RetryPolicy | None = None,
    check_conflicts: bool = True,
    after_partition: AfterPartition | None = None,
    clock: Clock = time.time,
    keep_connections: float = KEEP_CONNECTIONS,
    ledger: Ledger | str | None = None,
) -> PublishReport:
    """Publish every row of ``df`` as one message, exactly once; returns exact counts.

    Runs on the driver. Before any send: checks ``spec`` against ``df.schema``
    (:class:`SchemaError` naming the column), that no id column is null and no
    two rows with different payloads share an id (:class:`ConflictingRowsError`;
    one distributed aggregation, skipped with ``check_conflicts=False``), and
    that a ``local://`` url is not used on a cluster. Then each partition is
    published by its own sender on the executors; a Service Bus connection is
    reused by the next task of the same Python worker and closed after
    ``keep_connections`` idle seconds (0: one connection per partition).

    If the Spark job fails, raises :class:`~sendonce.PublishFailedError` chained
    to Spark's error, whose ``.report`` counts the rows confirmed before.

    ``after_partition(result)`` runs on the executor after a partition is
    published (metrics, or failing the attempt in fault tests). ``clock`` (wall
    time, seconds) times the window guard; injectable for tests.

    ``ledger`` (a :class:`~sendonce.Ledger` or its url) makes a re-run safe beyond the
    window: executors open it from its url, rows it confirmed are not resent (counted as
    duplicates), and the window guard lets late re-executions through (docs/ledger.md).
    """
    if getattr(df, "isStreaming", False):
        raise ConfigurationError(
            "publish() takes a batch DataFrame; for a streaming one use "
            "writeStream.foreachBatch(batch_publisher(...))",
            field="df",
        )
    url = _check_url(url)
    master = master_of(df.sparkSession)
    check_backend_fits(url, master)
    retry = _retry(retry)
    plan = plan_for(df.schema, spec)
    ledger_plan = _ledger_plan(ledger, master)
    profile = _profile(url, entity, retry, ledger_plan)
    if check_conflicts:
        find_conflicts(df, spec, plan, profile)
    board = _progress_board(df.sparkSession)
    guard = _guard(profile, retry, clock, ledger_plan)
    rerun = rerun_advice(profile, guard.started, retry, ledger_plan is not None)
    job = TaskJob(
        url,
        profile,
        spec,
        plan,
        guard,
        retry,
        after_partition=after_partition,
        progress=None if board is None else board.line,
        placement=Placement.of(url),
        keep_connection=_keep(keep_connections),
        trace_context=_telemetry.carrier(),
        **_ledger_fields(ledger_plan),
    )
    selected = df.select(*[quoted(c) for c in plan.columns])
    try:
        rows = selected.mapInArrow(job.arrow, RESULT_SCHEMA).collect()
    except Exception as exc:
        raise _job_failed(profile.name, board, exc, rerun) from exc
    finally:
        if board is not None:
            board.close()
    return PublishReport(profile.name, tuple(sorted(map(_result, rows), key=_order)), rerun=rerun)


def _ledger_fields(plan: _LedgerPlan | None) -> dict[str, Any]:
    if plan is None:
        return {}
    return {
        "ledger": plan.url,
        "ledger_options": plan.options,
        "ledger_placement": plan.placement,
    }


def _progress_board(session: Any) -> ProgressBoard | None:
    """A listener for the tasks' running counts, on the address executors reach the driver by.

    None when this process cannot listen there (a remote Spark Connect server).
    """
    host = driver_host(session)
    if host is None:
        return None
    try:
        return ProgressBoard(host)
    except OSError:
        return None


_SPARK_SUMMARY = re.compile(r"Task \S+ in stage \S+ failed \d+ times?")
_PYTHON_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception)): (.+)$", re.M)


def _why(exc: BaseException) -> str:
    """A short account of Spark's error: which task gave up, and the last Python error."""
    text = str(exc)
    parts = []
    summary = _SPARK_SUMMARY.search(text)
    if summary:
        parts.append(summary.group(0))
    errors = [m for m in _PYTHON_ERROR.finditer(text) if "py4j" not in m.group(0).lower()]
    if errors:
        parts.append(f"{errors[-1].group(1)}: {errors[-1].group(2)[:1000]}")
    return "; ".join(parts) or f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _job_failed(
    entity: str, board: ProgressBoard | None, exc: BaseException, rerun: str
) -> PublishFailedError:
    if board is None:
        return PublishFailedError(
            f"publishing to {entity!r} failed ({_why(exc)}); how many rows were confirmed "
            "before the failure is unknown (the executors could not report to this process). "
            + rerun
        )
    board.settle()
    report = PublishReport(entity, board.results(), complete=False, rerun=rerun)
    return PublishFailedError(
        f"publishing to {entity!r} failed ({_why(exc)}); before the failure "
        f"{report.delivered} row(s) were confirmed on the broker ({report.sent} sent, "
        f"{report.duplicates} already there) from {len(report.partitions)} partition(s). " + rerun,
        report=report,
    )


def _order(result: PartitionResult) -> int:
    return result.partition


def _result(row: Any) -> PartitionResult:
    failures = tuple((f["message_id"], f["error"], f["detail"]) for f in (row["failures"] or []))
    return PartitionResult(
        row["partition"],
        row["attempt"],
        row["rows"],
        row["sent"],
        row["duplicates"],
        row["failed"],
        row["seconds"],
        failures,
    )


# -- foreachPartition ---------------------------------------------------------------------


class PartitionPublisher:
    """The callable for ``df.foreachPartition``: publishes the rows, raises if any failed.

    Raising fails the task so Spark retries it; that is safe because ids are
    deterministic. Picklable: it carries only the url, the profile, the spec and
    the guard, and opens its backend inside the task.
    """

    def __init__(self, job: TaskJob) -> None:
        self.job = job

    def __call__(self, rows: Iterable[Any]) -> None:
        self.job.rows(rows)

    def __repr__(self) -> str:
        return f"PartitionPublisher(entity={self.job.guard.entity!r})"


def _active_master() -> str | None:
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    except Exception:
        return None
    return None if spark is None else master_of(spark)


def partition_publisher(
    url: str,
    entity: EntityProfile | str,
    spec: MessageSpec,
    *,
    retry: RetryPolicy | None = None,
    schema: Any = None,
    after_partition: AfterPartition | None = None,
    clock: Clock = time.time,
    keep_connections: float = KEEP_CONNECTIONS,
    ledger: Ledger | str | None = None,
) -> PartitionPublisher:
    """A picklable callable for ``df.foreachPartition`` that publishes each row once.

    Create it right before the job: the window guard counts from its creation.
    Pass ``schema=df.schema`` to check the spec against the columns on the
    driver and to read each column by its type (without it, naive datetimes
    are read as ``timestamp`` values, and ``timestamp_ntz`` columns cannot be
    told apart). Any failed row fails the task, so Spark retries it.
    """
    url = _check_url(url)
    master = _active_master()
    check_backend_fits(url, master)
    retry = _retry(retry)
    if not isinstance(spec, MessageSpec):
        raise ConfigurationError("spec must be a sendonce.MessageSpec", field="spec")
    if schema is not None:
        plan = plan_for(schema, spec)
    else:
        whole = not isinstance(spec.body, str)
        columns = () if whole else tuple(spec.fields)
        plan = ColumnPlan(columns, (None,) * len(columns), (), whole, dynamic=True)
    ledger_plan = _ledger_plan(ledger, master)
    profile = _profile(url, entity, retry, ledger_plan)
    job = TaskJob(
        url,
        profile,
        spec,
        plan,
        _guard(profile, retry, clock, ledger_plan),
        retry,
        after_partition=after_partition,
        raise_on_failure=True,
        placement=Placement.of(url),
        keep_connection=_keep(keep_connections),
        trace_context=_telemetry.carrier(),
        **_ledger_fields(ledger_plan),
    )
    return PartitionPublisher(job)


# -- foreachBatch ---------------------------------------------------------------------------


class BatchPublisher:
    """The callable for Structured Streaming ``foreachBatch``: ``fn(batch_df, batch_id)``.

    Each micro-batch is published with :func:`publish` (driver checks, Arrow
    stage, its own window guard starting with the batch) and any failed row
    raises, failing the query before the batch is committed. A restart from the
    checkpoint replays the batch under the same ids, so nothing lands twice.
    """

    def __init__(
        self,
        url: str,
        entity: EntityProfile | str,
        spec: MessageSpec,
        *,
        retry: RetryPolicy | None,
        check_conflicts: bool,
        after_partition: AfterPartition | None,
        on_batch: Callable[[int, PublishReport], None] | None,
        clock: Clock,
        keep_connections: float = KEEP_CONNECTIONS,
        ledger: str | None = None,
        ledger_options: LedgerOptions | None = None,
    ) -> None:
        self.ledger = ledger
        # A Ledger's choices travel whole with its url: each batch reopens it with them.
        self.ledger_options = ledger_options or LedgerOptions()
        self.url = url
        self.entity = entity
        self.spec = spec
        self.retry = retry
        self.check_conflicts = check_conflicts
        self.after_partition = after_partition
        self.on_batch = on_batch
        self.clock = clock
        self.keep_connections = keep_connections

    @property
    def ledger_in_doubt(self) -> InDoubtPolicy:
        """The ledger's ``in_doubt`` choice, applied to every batch."""
        return self.ledger_options.in_doubt

    @property
    def ledger_retention(self) -> timedelta | None:
        """The ledger's retention, applied to every batch."""
        return self.ledger_options.retention

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        with contextlib.ExitStack() as stack:
            ledger = None
            if self.ledger is not None:
                ledger = stack.enter_context(self.ledger_options.open(self.ledger))
            report = publish(
                batch_df,
                self.url,
                self.entity,
                self.spec,
                retry=self.retry,
                check_conflicts=self.check_conflicts,
                after_partition=self.after_partition,
                clock=self.clock,
                keep_connections=self.keep_connections,
                ledger=ledger,
            )
        report.raise_for_failures()
        if self.on_batch is not None:
            self.on_batch(batch_id, report)

    def __repr__(self) -> str:
        name = self.entity if isinstance(self.entity, str) else self.entity.name
        return f"BatchPublisher(entity={name!r})"


def batch_publisher(
    url: str,
    entity: EntityProfile | str,
    spec: MessageSpec,
    *,
    retry: RetryPolicy | None = None,
    check_conflicts: bool = True,
    after_partition: AfterPartition | None = None,
    on_batch: Callable[[int, PublishReport], None] | None = None,
    clock: Clock = time.time,
    keep_connections: float = KEEP_CONNECTIONS,
    ledger: Ledger | str | None = None,
) -> BatchPublisher:
    """A picklable ``fn(batch_df, batch_id)`` for ``writeStream.foreachBatch``.

    ``on_batch(batch_id, report)`` runs on the driver after a batch is published.
    """
    url = _check_url(url)
    _retry(retry)
    if not isinstance(spec, MessageSpec):
        raise ConfigurationError("spec must be a sendonce.MessageSpec", field="spec")
    ledger_plan = _ledger_plan(ledger, _active_master())
    return BatchPublisher(
        url,
        entity,
        spec,
        retry=retry,
        check_conflicts=check_conflicts,
        after_partition=after_partition,
        on_batch=on_batch,
        clock=clock,
        keep_connections=_keep(keep_connections),
        ledger=None if ledger_plan is None else ledger_plan.url,
        ledger_options=None if ledger_plan is None else ledger_plan.options,
    )
