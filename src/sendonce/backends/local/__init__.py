"""The embedded local broker: one SQLite file, Service Bus and Artemis duplicate detection.

Its receive side's errors live here too (:class:`LockLostError`,
:class:`SessionLockLostError`, :class:`SessionCannotBeLockedError`,
:class:`NoSessionAvailableError`, :class:`MessageNotFoundError`): a producer never sees them.
"""

from __future__ import annotations

from ._backend import LocalBackend, LocalSession
from ._errors import (
    LockLostError,
    MessageNotFoundError,
    NoSessionAvailableError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from ._received import ReceivedMessage
from ._store import BrokerFileError, BrokerStorageError

__all__ = [
    "BrokerFileError",
    "BrokerStorageError",
    "LocalBackend",
    "LocalSession",
    "LockLostError",
    "MessageNotFoundError",
    "NoSessionAvailableError",
    "ReceivedMessage",
    "SessionCannotBeLockedError",
    "SessionLockLostError",
]
