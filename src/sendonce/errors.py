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
│   │   └── AttemptNotSentError                           — this attempt stored nothing; retried
│   ├── PermanentSendError                                — refused; retrying cannot help
│   │   ├── NeverSentError                                — gave up, nothing stored: resend any time
│   │   └── BrokerStorageError [sendonce.backends.local]  — disk full: nothing of the call stored
│   ├── InDoubtError                                      — retries ran out inside the window
│   ├── PayloadConflictError                              — same id, different body
│   ├── LedgerError                                       — the ledger cannot be read or written
│   ├── PublishFailedError                                — a Spark publish missed rows (.report)
│   ├── LateReexecutionError [sendonce.spark]             — a late task retry refused to resend
│   └── PartitionFailedError [sendonce.spark]             — rows failed: Spark retries the task
├── LockLostError [sendonce.backends.local]               — settled after the lock was lost
│   └── SessionLockLostError [sendonce.backends.local]    — the receiver lost its session
├── SessionCannotBeLockedError [sendonce.backends.local]  — another receiver holds the session
├── NoSessionAvailableError (also TimeoutError) [sendonce.backends.local] — no session in time
└── MessageNotFoundError [sendonce.backends.local]        — no such deferred message

Why the names: ``AttemptNotSentError`` is one attempt's failure, transient (the sender
retries it; nothing can have been stored), and ``NeverSentError`` is the final outcome when
every attempt failed that way (permanent for this call, yet not in doubt: resend at any
time). Their first spellings, ``NotSentError`` and ``NotStoredError``, sounded alike and
meant opposite things. The receive side's errors belong to the local broker, whose receive
side alone raises them; a producer never sees them.

Old spellings still work for a deprecation period (to be removed in 0.2), each with a
``DeprecationWarning``: ``NotSentError``, ``NotStoredError``, and the receive side's errors
from here or from ``sendonce``. The package's own modules still using an old spelling get no
warning (their owners move them); a user's code does.

This module is on the ground floor: it imports nothing from the rest of the
package at import time, so every other module can import it; the one exception is the
redirect of a deprecated receive-side name, imported on access only. The Spark report is
typed here by the :class:`PublishCounts` protocol for that reason.
"""

from __future__ import annotations

import re
import sys
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, Self

__all__ = [
    "AttemptNotSentError",
    "ConfigurationError",
    "InDoubtError",
    "KeyRuleError",
    "LedgerError",
    "MessageIdError",
    "MessageSizeError",
    "NeverSentError",
    "PayloadConflictError",
    "PermanentSendError",
    "PublishCounts",
    "PublishFailedError",
    "SendError",
    "SendOnceError",
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


class AttemptNotSentError(TransientSendError):
    """One attempt sent nothing: the connection was refused, the link never opened, the
    broker file stayed locked, or the broker released the transfer unstored.

    Nothing can have been stored, so the message is not in doubt and retrying is safe:
    the sender retries it. When every attempt ends this way the sender reports
    :class:`NeverSentError`. (Its old name ``NotSentError`` still works and warns.)
    """


class NeverSentError(PermanentSendError):
    """The sender gave up and no attempt sent the message (each was an
    :class:`AttemptNotSentError`).

    Nothing was stored: the message is not in doubt (compare :class:`InDoubtError`), and
    sending it again at any time, once the broker is reachable, is safe. Permanent only in
    that this call's retries are spent. (Its old name ``NotStoredError`` still works and warns.)
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


# -- deprecated spellings ----------------------------------------------------------------------

if TYPE_CHECKING:  # what type checkers see; at run time each goes through __getattr__ and warns
    NotSentError = AttemptNotSentError
    NotStoredError = NeverSentError

_RENAMED: dict[str, str] = {
    "NotSentError": "AttemptNotSentError",
    "NotStoredError": "NeverSentError",
}
"""Old name -> new name, in this module (and in ``sendonce``)."""

_MOVED: dict[str, str] = {
    "LockLostError": "sendonce.backends.local",
    "SessionLockLostError": "sendonce.backends.local",
    "SessionCannotBeLockedError": "sendonce.backends.local",
    "NoSessionAvailableError": "sendonce.backends.local",
    "MessageNotFoundError": "sendonce.backends.local",
}
"""Name -> its new home, for the receive side's errors that lived here."""


def _deprecated(module: str, name: str, *, depth: int = 2) -> Any:
    """The object an old spelling ``module.name`` stands for, with a ``DeprecationWarning``.

    Raises ``AttributeError`` for a name that was never here. ``depth`` is the frame of
    the code that asked, from this function: a caller inside sendonce is not warned (its
    owner migrates it), nor is the import system's probe of ``from sendonce import name``
    (the import itself warns right after, once).
    """
    if name in _RENAMED:
        new_name = _RENAMED[name]
        value = globals()[new_name]
        advice = f"{module}.{name} is deprecated: use {module}.{new_name}, the same class"
    elif name in _MOVED:
        from .backends import local  # on access only: the one import above the ground floor

        value = getattr(local, name)
        advice = f"{module}.{name} is deprecated: import it from {_MOVED[name]}, the same class"
    else:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    caller = str(sys._getframe(depth).f_globals.get("__name__", ""))
    if not (caller.startswith("sendonce.") or caller == "importlib._bootstrap"):
        advice += "; the old name goes in 0.2"
        warnings.warn(advice, DeprecationWarning, stacklevel=depth + 1)
    return value


def __getattr__(name: str) -> Any:
    return _deprecated(__name__, name, depth=2)
