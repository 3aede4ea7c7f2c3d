"""Publish Spark DataFrames so each row lands as exactly one message.

Ids come from row content (a :class:`~sendonce.MessageSpec`), never from
partition or attempt numbers, so a failed task attempt, its retry and a
speculative copy all send the same ids, and the broker's duplicate detection
keeps one copy. What can be checked before any task runs -- the spec against
the schema, id column types, null ids, rows with different payloads sharing an
id, a one-machine broker on a cluster -- is checked on the driver.

- :func:`publish` -- the driver call: checks, publishes on the executors through
  an Arrow stage (``mapInArrow``), returns exact counts.
- :func:`partition_publisher` -- for ``df.foreachPartition(...)``.
- :func:`batch_publisher` -- for Structured Streaming ``foreachBatch(...)``.

All three work on classic and Spark Connect sessions. See ``docs/spark.md``.
"""

from ._publish import (
    BatchPublisher,
    PartitionPublisher,
    PublishFailedError,
    PublishFailure,
    PublishReport,
    batch_publisher,
    partition_publisher,
    publish,
)
from ._schema import ConflictingRowsError, SchemaError, check_backend_fits, is_local_master
from ._task import LateReexecutionError, PartitionFailedError, PartitionResult

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
