"""sendonce: idempotent message publishing.

Deterministic business-derived message ids, safe retries of in-doubt sends
inside the broker's duplicate-detection window, partition and session key
rules checked before anything is sent, and exactly-once Spark publishing.

``__all__`` is the short list a producer needs: build messages, describe the
entity, send (with a ledger when a crash must not leave doubt), and the errors a
caller catches. More is importable from here without a warning (``SendFailure``,
``Transaction``, ``SubscriptionProfile``, every class of :mod:`sendonce.errors`);
backends, Spark, the outbox and the asyncio senders have their own modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._entity import EntityProfile
from ._ids import MessageIdTemplate, content_message_id
from ._message import Message, MessageSpec
from ._retry import RetryPolicy
from ._sender import IdempotentSender, SendReport, SendResult
from ._sender import SendFailure as SendFailure  # importable here, outside the short list
from ._sender import Transaction as Transaction
from ._subscription import SubscriptionProfile as SubscriptionProfile
from .errors import AttemptNotSentError as AttemptNotSentError
from .errors import ConfigurationError as ConfigurationError
from .errors import (
    InDoubtError,
    LedgerError,
    NeverSentError,
    PayloadConflictError,
    PermanentSendError,
    SendError,
    SendOnceError,
    TransientSendError,
    ValidationError,
    _deprecated,
)
from .errors import KeyRuleError as KeyRuleError
from .errors import MessageIdError as MessageIdError
from .errors import MessageSizeError as MessageSizeError
from .errors import PublishFailedError as PublishFailedError
from .ledger import Ledger

if TYPE_CHECKING:  # deprecated spellings: at run time each goes through __getattr__ and warns
    from .backends.local import LockLostError as LockLostError
    from .backends.local import NoSessionAvailableError as NoSessionAvailableError
    from .backends.local import SessionCannotBeLockedError as SessionCannotBeLockedError
    from .backends.local import SessionLockLostError as SessionLockLostError
    from .errors import NotSentError as NotSentError
    from .errors import NotStoredError as NotStoredError

__all__ = [
    "EntityProfile",
    "IdempotentSender",
    "InDoubtError",
    "Ledger",
    "LedgerError",
    "Message",
    "MessageIdTemplate",
    "MessageSpec",
    "NeverSentError",
    "PayloadConflictError",
    "PermanentSendError",
    "RetryPolicy",
    "SendError",
    "SendOnceError",
    "SendReport",
    "SendResult",
    "TransientSendError",
    "ValidationError",
    "content_message_id",
]

# The receive side's errors that were importable from here (the package's own names:
# MessageNotFoundError never was).
_MOVED_FROM_HERE = frozenset(
    {
        "LockLostError",
        "SessionLockLostError",
        "SessionCannotBeLockedError",
        "NoSessionAvailableError",
    }
)


def __getattr__(name: str) -> Any:
    """Old spellings, each with a ``DeprecationWarning`` (see :mod:`sendonce.errors`)."""
    if name in ("NotSentError", "NotStoredError") or name in _MOVED_FROM_HERE:
        return _deprecated(__name__, name, depth=2)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The one place the version is set: pyproject.toml reads it (dynamic version) into the metadata.
__version__ = "0.1.0.dev0"
