"""The embedded local broker: one SQLite file, Service Bus and Artemis duplicate detection."""

from __future__ import annotations

from ._backend import LocalBackend, LocalSession, LockLostError, MessageNotFoundError
from ._received import ReceivedMessage
from ._store import BrokerFileError, BrokerStorageError

__all__ = [
    "BrokerFileError",
    "BrokerStorageError",
    "LocalBackend",
    "LocalSession",
    "LockLostError",
    "MessageNotFoundError",
    "ReceivedMessage",
]
