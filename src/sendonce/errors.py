"""The exception tree of sendonce.

Every error a caller can see is one of these. ``ValidationError`` means nothing
was sent; ``SendError`` subclasses say what is known about the broker's state.
Messages pass through :func:`redact` so a secret can never leak into a log line
or a traceback.

The tree (``also`` names another base; ``[module]`` is where a class is imported
from when it is not in this module; tests check this drawing against the classes):

SendOnceError                                             — the base; its text is always redacted
├── ValidationError (also ValueError)                     — bad input; nothing was sent
│   ├── MessageIdError                                    — an id cannot be built or is refused
│   ├── KeyRuleError                                      — partition key / session id rules
│   ├── MessageSizeError                                  — over the size limit or property quotas
│   ├── ConfigurationError                                — window out of range, unsafe setup
│   │   └── BrokerFileError [sendonce.backends.local]     — not a broker file, damaged, moved
│   ├── SchemaError [sendonce.spark]                      — the DataFrame cannot feed the spec
│   └── ConflictingRowsError [sendonce.spark]             — rows with different bodies, one id
├── SendError                                             — carries the message id when known
│   ├── TransientSendError                                — may or may not be stored; retried
│   │   └── NotSentError                                  — never reached the broker
│   ├── PermanentSendError                                — refused; retrying cannot help
│   │   ├── NotStoredError                                — every attempt failed before the broker
│   │   └── BrokerStorageError [sendonce.backends.local]  — disk full: nothing of the call stored
│   ├── InDoubtError                                      — retries ran out inside the window
│   ├── PayloadConflictError                              — same id, different body
│   ├── LedgerError                                       — the ledger cannot be read or written
│   ├── PublishFailedError                                — a Spark publish missed rows (.report)
│   ├── LateReexecutionError [sendonce.spark]             — a late task retry refused to resend
│   └── PartitionFailedError [sendonce.spark]             — rows failed: Spark retries the task
├── LockLostError                                         — settled after the lock was lost
│   └── SessionLockLostError                              — the receiver lost its session
├── SessionCannotBeLockedError                            — another receiver holds the session
├── NoSessionAvailableError (also TimeoutError)           — no session within max_wait_time
└── MessageNotFoundError [sendonce.backends.local]        — no such deferred message

This module is on the ground floor: it imports nothing from the rest of the
package, so every other module can import it. The Spark report is typed here by
the :class:`PublishCounts` protocol for that reason.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Protocol, Self

__all__ = [
    "ConfigurationError",
    "InDoubtError",
    "KeyRuleError",
    "LedgerError",
    "LockLostError",
    "MessageIdError",
    "MessageSizeError",
    "NoSessionAvailableError",
    "NotSentError",
    "NotStoredError",
    "PayloadConflictError",
    "PermanentSendError",
    "PublishCounts",
    "PublishFailedError",
    "SendError",
    "SendOnceError",
    "SessionCannotBeLockedError",
    "SessionLockLostError",
    "TransientSendError",
    "ValidationError",
    "redact",
]

# SharedAccessKey=..., SharedAccessSignature=..., sig=... (SAS token), AccountKey=...,
# and any password in a URL's userinfo.
_SECRET_PATTERNS = [
    re.compile(r"(?i)(SharedAccessKey\s*=\s*[\"']?)[^;\s\"']+"),
    re.compile(r"(?i)(SharedAccessSignature\s*=\s*[\"']?)[^;\"']+"),
    re.compile(r"(?i)(AccountKey\s*=\s*[\"']?)[^;\s\"']+"),
    re.compile(r"(?i)((?<![A-Za-z0-9_])sig=)[^&\s\"';]+"),
    re.compile(r"(?i)((?<![A-Za-z0-9_])sig%3D)[^&\s\"';%]+(?:%[0-9A-F]{2}[^&\s\"';%]*)*"),
    re.compile(r"(?i)(%26sig%3D)[^&\s\"';%]+(?:%[0-9A-F]{2}[^&\s\"';%]*)*"),
    re.compile(r"(?i)(://[^/\s:@]*:)[^@/\s]+(?=@)"),  # user:password@ (user may be empty)
]
REDACTED = "***"


def redact(text: str) -> str:
    """Return ``text`` with connection-string keys and SAS signatures masked."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


class SendOnceError(Exception):
    """Base of every sendonce error. Its message is always redacted."""

    def __init__(self, message: str, *args: Any) -> None:
        super().__init__(redact(message), *args)

    @property
    def message(self) -> str:
        """The (redacted) error text."""
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return self.message


class ValidationError(SendOnceError, ValueError):
    """Bad input: the SDK refused it before anything was sent."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class MessageIdError(ValidationError):
    """A message id could not be built or is not acceptable to the broker."""


class KeyRuleError(ValidationError):
    """A partition key or session id breaks the entity's rules."""


class MessageSizeError(ValidationError):
    """A message is larger than the entity accepts, or a property over Service Bus's quotas."""


class ConfigurationError(ValidationError):
    """An unsafe or impossible setup: window out of range, no duplicate detection."""


class SendError(SendOnceError):
    """A send did not complete normally. Carries the message id when one is known."""

    def __init__(
        self,
        message: str,
        *,
        message_id: str | None = None,
        partition_key: str | None = None,
        condition: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.partition_key = partition_key
        self.condition = condition

    def for_message(
        self, message_id: str, partition_key: str | None, *, text: str | None = None
    ) -> Self:
        """A copy of this error naming one message of the transfer that failed.

        A batch's failure is reported once per message. The copy is made without calling
        the class again (constructors differ across the tree), so every subclass keeps its
        type and attributes (attempts, last error, condition) and its cause.
        """
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.args = (redact(text or f"message {message_id!r}: {self.message}"), *self.args[1:])
        clone.message_id = message_id
        clone.partition_key = partition_key
        clone.__cause__ = self.__cause__
        clone.__suppress_context__ = self.__suppress_context__
        return clone


class TransientSendError(SendError):
    """The send may or may not have been committed; retrying with the same id is safe."""


class PermanentSendError(SendError):
    """The broker refused the send; retrying cannot help."""


class NotSentError(TransientSendError):
    """The send never reached the broker: the connection was refused or the link never opened.

    Nothing can have been stored, so the message is not in doubt; retrying is safe.
    """


class NotStoredError(PermanentSendError):
    """Every attempt failed before reaching the broker (see :class:`NotSentError`).

    Nothing was stored: the message is not in doubt, and sending it again at any
    time (after the broker is reachable) is safe.
    """

    def __init__(
        self,
        message: str,
        *,
        message_id: str | None = None,
        partition_key: str | None = None,
        attempts: int = 0,
        elapsed: timedelta = timedelta(0),
        last_error: BaseException | None = None,
    ) -> None:
        super().__init__(
            message,
            message_id=message_id,
            partition_key=partition_key,
            condition="sendonce:not-sent",
        )
        self.attempts = attempts
        self.elapsed = elapsed
        self.last_error = last_error


class PayloadConflictError(SendError):
    """The same message id was sent earlier with a different body.

    The broker would silently drop the second body, so this is an error, not a duplicate.
    """


class InDoubtError(SendError):
    """Retries ran out before the duplicate-detection deadline.

    The message may have been committed or not; only this message id is in doubt.
    Resending it is safe only while the broker still remembers the id.
    """

    def __init__(
        self,
        message: str,
        *,
        message_id: str | None = None,
        partition_key: str | None = None,
        attempts: int = 0,
        elapsed: timedelta = timedelta(0),
        last_error: BaseException | None = None,
    ) -> None:
        super().__init__(message, message_id=message_id, partition_key=partition_key)
        self.attempts = attempts
        self.elapsed = elapsed
        self.last_error = last_error


class LedgerError(SendError):
    """The send ledger could not be read or written (or its file is not a ledger).

    Messages whose intent could not be recorded were not sent; messages sent but
    not confirmed stay unconfirmed intents, decided on the next run (see docs/ledger.md).
    """


class PublishCounts(Protocol):
    """The counts of a Spark publish, as ``sendonce.spark.PublishReport`` carries them.

    A protocol, so that this module types ``PublishFailedError.report`` without
    importing Spark. The object is a ``PublishReport``, with its partitions and failures.
    """

    @property
    def entity(self) -> str:
        """The queue or topic published to."""
        ...

    @property
    def complete(self) -> bool:
        """False when the job failed: the counts are those confirmed before, at least."""
        ...

    @property
    def rows(self) -> int:
        """Rows counted by the partitions that reported."""
        ...

    @property
    def sent(self) -> int:
        """Rows sent by this call."""
        ...

    @property
    def duplicates(self) -> int:
        """Rows the broker already had."""
        ...

    @property
    def failed(self) -> int:
        """Rows that could not be sent."""
        ...

    @property
    def delivered(self) -> int:
        """Rows confirmed on the broker: sent now or found there already."""
        ...


class PublishFailedError(SendError):
    """A Spark publish did not deliver every row; ``.report`` says how far it got.

    Raised by ``sendonce.spark.publish`` when the Spark job fails (chained to
    Spark's error; ``.report.complete`` is False and its counts are the rows
    confirmed before the failure, at least) and by ``PublishReport.raise_for_failures``
    when some rows failed. Publishing the same rows again is safe until the
    duplicate-detection window of the first attempt ends (the message gives the
    time: rows already on the broker are dropped as duplicates), and for good
    with a ledger (``ledger=``: rows it confirmed are skipped). ``.report`` is
    None when nothing is known (for instance on a Spark Connect server whose
    executors cannot reach this process).
    """

    def __init__(self, message: str, *, report: PublishCounts | None = None) -> None:
        super().__init__(message)
        self.report = report


# -- receiving from the local broker ---------------------------------------------------------


class LockLostError(SendOnceError):
    """A peek-lock settlement came too late: the lock expired or the message is gone."""


class SessionLockLostError(LockLostError):
    """The receiver no longer holds its session: the lock expired or the session was closed.

    Service Bus's ``SessionLockLostError``. Its messages' locks went with it; another
    receiver may hold the session now. Accept the session again to go on.
    """

    def __init__(self, message: str, *, entity: str = "", session_id: str = "") -> None:
        super().__init__(message)
        self.entity = entity
        self.session_id = session_id


class SessionCannotBeLockedError(SendOnceError):
    """The session asked for is locked by another receiver (another handle or process).

    Service Bus's ``SessionCannotBeLockedError`` (``com.microsoft:session-cannot-be-locked``):
    a session is locked to one receiver at a time.
    """

    def __init__(self, message: str, *, entity: str = "", session_id: str = "") -> None:
        super().__init__(message)
        self.entity = entity
        self.session_id = session_id


class NoSessionAvailableError(SendOnceError, TimeoutError):
    """No unlocked session with an available message came within ``max_wait_time``.

    What Service Bus answers a ``NEXT_AVAILABLE_SESSION`` receiver (the client raises
    ``OperationTimeoutError``).
    """

    def __init__(self, message: str, *, entity: str = "") -> None:
        super().__init__(message)
        self.entity = entity
