"""sendonce: idempotent message publishing.

Deterministic business-derived message ids, safe retries of in-doubt sends
inside the broker's duplicate-detection window, partition and session key
rules checked before anything is sent, and exactly-once Spark publishing.
"""

from __future__ import annotations

from ._entity import EntityProfile
from ._ids import MessageIdTemplate, content_message_id
from ._message import Message, MessageSpec
from ._retry import RetryPolicy
from ._sender import IdempotentSender, SendFailure, SendReport, SendResult, Transaction
from ._subscription import SubscriptionProfile
from .errors import (
    ConfigurationError,
    InDoubtError,
    KeyRuleError,
    LedgerError,
    LockLostError,
    MessageIdError,
    MessageSizeError,
    NoSessionAvailableError,
    NotSentError,
    NotStoredError,
    PayloadConflictError,
    PermanentSendError,
    PublishFailedError,
    SendError,
    SendOnceError,
    SessionCannotBeLockedError,
    SessionLockLostError,
    TransientSendError,
    ValidationError,
)
from .ledger import Ledger

__all__ = [
    "ConfigurationError",
    "EntityProfile",
    "IdempotentSender",
    "InDoubtError",
    "KeyRuleError",
    "Ledger",
    "LedgerError",
    "LockLostError",
    "Message",
    "MessageIdError",
    "MessageIdTemplate",
    "MessageSizeError",
    "MessageSpec",
    "NoSessionAvailableError",
    "NotSentError",
    "NotStoredError",
    "PayloadConflictError",
    "PermanentSendError",
    "PublishFailedError",
    "RetryPolicy",
    "SendError",
    "SendFailure",
    "SendOnceError",
    "SendReport",
    "SendResult",
    "SessionCannotBeLockedError",
    "SessionLockLostError",
    "SubscriptionProfile",
    "Transaction",
    "TransientSendError",
    "ValidationError",
    "content_message_id",
]

# The one place the version is set: pyproject.toml reads it (dynamic version) into the metadata.
__version__ = "0.1.0.dev0"
