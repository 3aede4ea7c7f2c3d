"""What runs inside a Spark task: one backend and sender per partition, and the window guard.

Backend clients are neither picklable nor thread-safe, so each task attempt
opens its own from the url. Ids come from row content only, so a re-executed
attempt (a retry or a speculative copy) resends the same ids and the broker
drops the copies -- as long as it still remembers them. The window guard
refuses a re-executed attempt that could outlive that memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from itertools import islice
from typing import TYPE_CHECKING, Any

from .._entity import EntityProfile
from .._message import MessageSpec
from .._retry import RetryPolicy
from .._sender import IdempotentSender
from ..errors import SendError
from ..ledger import LedgerOptions
from . import _telemetry
from ._collector import paused_per_item
from ._pool import Borrowed
from ._rows import BatchEncoder, ColumnPlan, columns_of_rows, encode_columns

if TYPE_CHECKING:
    from ._ledger_placement import LedgerPlacement
    from ._placement import Placement
    from ._progress import ProgressLine

__all__ = [
    "FAILURES_KEPT",
    "RESULT_SCHEMA",
    "LateReexecutionError",
    "PartitionFailedError",
    "PartitionResult",
    "TaskJob",
    "WindowGuard",
    "retry_budget",
]

FAILURES_KEPT = 10
"""Failed rows described per partition (all are counted)."""

RESULT_SCHEMA = (
    "partition int, attempt int, rows long, sent long, duplicates long, failed long, "
    "seconds double, failures array<struct<message_id:string,error:string,detail:string>>"
)
"""The rows the Arrow publishing stage returns to the driver: one per partition."""

Clock = Callable[[], float]


class LateReexecutionError(SendError):
    """A re-executed task attempt started too late to resend safely, so it refused to.

    The earlier attempt may have sent some rows as early as the job start; the
    broker forgets their ids one window later. A resend that could land after
    that would create duplicates, so the attempt fails instead.
    """


class PartitionFailedError(SendError):
    """Rows of a partition could not be sent: the task fails so Spark retries it."""


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """The outcome of one partition's (successful) task attempt."""

    partition: int
    attempt: int
    rows: int
    sent: int
    duplicates: int
    failed: int
    seconds: float = 0.0
    failures: tuple[tuple[str, str, str], ...] = ()
    """Up to ``FAILURES_KEPT`` (message id or row, error type, error text)."""


def retry_budget(retry: RetryPolicy, window: timedelta | None) -> float:
    """The longest one send can take with ``retry``: every attempt, every backoff.

    Capped by the window minus the margin, where the sender's own deadline stops it.
    """
    backoffs = sum(
        min(retry.max_backoff, retry.initial_backoff * 2.0**i)
        for i in range(retry.max_attempts - 1)
    )
    budget = retry.max_attempts * retry.attempt_timeout + backoffs
    if window is not None:
        budget = min(budget, (window - retry.safety_margin).total_seconds())
    return budget


@dataclass(frozen=True, slots=True)
class WindowGuard:
    """Refuses sends of a re-executed attempt that could land after the broker forgot ids.

    ``started`` is the job start on the driver's wall clock; the earlier attempt
    sent nothing before it, so its ids are remembered until at least
    ``started + window``. A re-executed attempt may start a send at ``now`` only
    if that send, with all its retries (``budget``), ends before that moment
    minus ``margin`` (clock skew between driver and executors).
    """

    started: float
    window: float | None
    margin: float
    budget: float
    clock: Clock = time.time
    entity: str = ""

    def check(self, *, partition: int, attempt: int) -> None:
        if self.window is None or attempt == 0:
            return
        now = self.clock()
        latest = self.started + self.window - self.margin - self.budget
        if now <= latest:
            return
        raise LateReexecutionError(
            f"task attempt {attempt} of partition {partition} "
            f"is {now - self.started:.0f}s into the job, too late to resend to entity "
            f"{self.entity!r}: its duplicate-detection window is {self.window:.0f}s, and a send "
            f"with all its retries may take {self.budget:.0f}s (plus a {self.margin:.0f}s "
            "margin), so copies sent by the earlier attempt could already be forgotten and "
            "would be duplicated. Refusing to resend. Recreate the entity with a larger "
            "duplicate_detection_window (up to 7 days) or shorten the retry policy "
            "(max_attempts, attempt_timeout); then check the queue for rows that are missing "
            "and publish again."
        )


def _task_context() -> tuple[int, int]:
    """(partition id, attempt number) of the running task.

    A speculative copy also has an attempt number above 0. (Python's TaskContext
    does not show the stage attempt: see docs/spark.md on stage re-submission.)
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # called outside a task, e.g. a direct call in a test
        return (0, 0)
    return (ctx.partitionId(), ctx.attemptNumber())


@dataclass(slots=True)
class _Tally:
    rows: int = 0
    sent: int = 0
    duplicates: int = 0
    failed: int = 0
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    def fail(self, what: str, error: BaseException) -> None:
        self.failed += 1
        if len(self.failures) < FAILURES_KEPT:
            self.failures.append((what, type(error).__name__, str(error)[:500]))


@dataclass(frozen=True)
class TaskJob:
    """Everything a task needs, shipped from the driver in the closure. Picklable."""

    url: str
    entity: EntityProfile | str
    spec: MessageSpec
    plan: ColumnPlan
    guard: WindowGuard
    retry: RetryPolicy | None = None
    after_partition: Callable[[PartitionResult], None] | None = None
    raise_on_failure: bool = False
    progress: ProgressLine | None = None
    placement: Placement | None = None
    """Set for a ``local://`` broker: checked before anything is sent."""
    keep_connection: float = 30.0
    """Seconds an executor keeps a Service Bus connection for its next task (0: never)."""
    ledger: str | None = field(default=None, repr=False)
    """The send ledger's url: each task's sender opens it (a connection is never shipped).

    Not in the repr: a PostgreSQL url may carry a password."""
    ledger_options: LedgerOptions = field(default_factory=LedgerOptions)
    """The application's ``Ledger`` choices (in_doubt, retention, pruning), whole: every
    task's ledger applies them."""
    ledger_placement: LedgerPlacement | None = None
    """Set for a SQLite ledger: checked before anything is sent."""
    trace_context: Mapping[str, str] | None = None
    """The driver's trace context (W3C ``traceparent``), so each task's span joins its trace."""

    def run(self, batches: Iterable[tuple[dict[str, list[Any]], int]]) -> PartitionResult:
        """Publish a partition given as batches of (columns, row count), in a span if traced.

        An executor is a process of its own: its provider comes from ``$SENDONCE_OTEL_SETUP``
        (docs/observability.md), and what it buffered is flushed when the task ends.
        """
        _telemetry.worker_setup()
        partition, attempt = _task_context()
        entity = self.entity if isinstance(self.entity, str) else self.entity.name
        scope = _telemetry.spark_task(entity, partition, attempt, self.trace_context)
        if scope is _telemetry.OFF:
            return self._publish(batches)
        try:
            with scope:
                result = self._publish(batches)
                scope.set(
                    rows=result.rows,
                    sent=result.sent,
                    duplicates=result.duplicates,
                    failed=result.failed,
                )
        finally:
            _telemetry.flush()
        return result

    def _publish(self, batches: Iterable[tuple[dict[str, list[Any]], int]]) -> PartitionResult:
        partition, attempt = _task_context()
        if self.placement is not None:
            self.placement.check()
        if self.ledger_placement is not None:
            self.ledger_placement.check()
        guard = self.guard
        guard.check(partition=partition, attempt=attempt)
        began = time.perf_counter()
        encoder = BatchEncoder(self.spec, self.plan)
        tally = _Tally()
        sender: IdempotentSender | None = None
        borrowed: Borrowed | None = None
        ledger = None
        healthy = False
        reporter = None if self.progress is None else self.progress.reporter(partition, attempt)
        try:
            with closing(paused_per_item(batches)) as chunks:  # see _collector
                for columns, rows in chunks:
                    if not rows:
                        continue
                    tally.rows += rows
                    encoded = encode_columns(encoder, columns, rows)
                    for what, error in encoded.errors:
                        tally.fail(what, error)
                    if encoded.messages:
                        guard.check(partition=partition, attempt=attempt)
                        if sender is None:
                            borrowed = Borrowed(self.url, self.keep_connection)
                            if self.ledger is not None:
                                ledger = self.ledger_options.open(self.ledger)
                            sender = IdempotentSender(
                                borrowed.backend, self.entity, retry=self.retry, ledger=ledger
                            )
                        report = sender.send_many(encoded.messages)
                        tally.sent += report.sent
                        tally.duplicates += report.duplicates
                        for failure in report.failures:
                            tally.fail(failure.message_id, failure.error)
                        del report  # its acks go before the collector resumes
                    del columns, encoded
                    if reporter is not None:
                        reporter.report(tally.rows, tally.sent, tally.duplicates, tally.failed)
                    if self.raise_on_failure and tally.failed:
                        break
            healthy = not tally.failed  # a failed send may have left the connection broken
        finally:
            if reporter is not None:
                reporter.close()
            if sender is not None:
                sender.close()
            if ledger is not None:
                ledger.close()
            if borrowed is not None:
                borrowed.release(healthy=healthy)
        result = PartitionResult(
            partition,
            attempt,
            tally.rows,
            tally.sent,
            tally.duplicates,
            tally.failed,
            time.perf_counter() - began,
            tuple(tally.failures),
        )
        if self.raise_on_failure and result.failed:
            what, kind, text = result.failures[0]
            raise PartitionFailedError(
                f"partition {partition} (attempt {attempt}): {result.failed} row(s) were not "
                f"sent, first {what!r}: {kind}: {text}. Failing the task so Spark retries it; "
                "the ids are deterministic, so rows already sent are dropped as duplicates."
            )
        if self.after_partition is not None:
            self.after_partition(result)
        return result

    # -- the two row paths ---------------------------------------------------------

    def arrow(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The ``mapInArrow`` function: record batches in, one result row out."""
        import pyarrow as pa

        names = self.plan.columns
        utc = {
            name for name, shape in zip(names, self.plan.shapes, strict=True) if shape == ("ts",)
        }
        # Arrow keeps timestamps as UTC instants whatever the session time zone. Dropping
        # the zone before to_pylist and attaching UTC after is ~3x faster than letting
        # pyarrow build aware datetimes, and gives equal values.
        naive = pa.timestamp("us")

        def column(batch: Any, name: str) -> list[Any]:
            values = batch.column(name)
            if name in utc:
                return [
                    None if v is None else v.replace(tzinfo=UTC)
                    for v in values.cast(naive).to_pylist()
                ]
            result: list[Any] = values.to_pylist()
            return result

        def columns() -> Iterator[tuple[dict[str, list[Any]], int]]:
            for batch in batches:
                yield ({name: column(batch, name) for name in names}, batch.num_rows)

        result = self.run(columns())
        yield pa.RecordBatch.from_pylist([_result_row(result)], schema=_result_arrow_schema())

    def rows(self, rows: Iterable[Any], *, chunk: int = 10_000) -> PartitionResult:
        """The ``foreachPartition`` path: ``Row`` objects in chunks."""

        def columns() -> Iterator[tuple[dict[str, list[Any]], int]]:
            remaining = iter(rows)
            while batch := list(islice(remaining, chunk)):  # C-speed, not a loop per row
                pair = columns_of_rows(self.plan, batch), len(batch)
                del batch  # the Rows die with their chunk, before the collector resumes
                yield pair

        return self.run(columns())


def _result_row(result: PartitionResult) -> dict[str, Any]:
    return {
        "partition": result.partition,
        "attempt": result.attempt,
        "rows": result.rows,
        "sent": result.sent,
        "duplicates": result.duplicates,
        "failed": result.failed,
        "seconds": result.seconds,
        "failures": [{"message_id": m, "error": e, "detail": d} for m, e, d in result.failures],
    }


def _result_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("partition", pa.int32()),
            ("attempt", pa.int32()),
            ("rows", pa.int64()),
            ("sent", pa.int64()),
            ("duplicates", pa.int64()),
            ("failed", pa.int64()),
            ("seconds", pa.float64()),
            (
                "failures",
                pa.list_(
                    pa.struct(
                        [
                            ("message_id", pa.string()),
                            ("error", pa.string()),
                            ("detail", pa.string()),
                        ]
                    )
                ),
            ),
        ]
    )
