"""The receive side's errors: what settling, session locks and deferral raise.

They belong to the local broker's receive side (``sendonce.backends.local``), not to
publishing: a producer never sees them. Until 0.1 they were importable from ``sendonce``
and ``sendonce.errors``; those spellings still work for a deprecation period and warn
(see :mod:`sendonce.errors`). The emulator maps them to Service Bus's conditions.
"""

from __future__ import annotations

from ...errors import SendOnceError

__all__ = [
    "LockLostError",
    "MessageNotFoundError",
    "NoSessionAvailableError",
    "SessionCannotBeLockedError",
    "SessionLockLostError",
]


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


class MessageNotFoundError(SendOnceError):
    """A message asked for by sequence number is not there: a deferred one to receive, or a
    scheduled one to cancel (unknown, cancelled, or enqueued already)."""
