"""The AMQP error conditions Service Bus answers with, and how store failures map to them."""

from __future__ import annotations

import uuid

from proton import Condition, symbol

from ..errors import (
    ConfigurationError,
    MessageSizeError,
    PermanentSendError,
    SendError,
    SendOnceError,
    SessionLockLostError,
    TransientSendError,
    ValidationError,
)

__all__ = [
    "ARGUMENT_ERROR",
    "DECODE_ERROR",
    "DETACH_FORCED",
    "INTERNAL_ERROR",
    "LOCK_LOST",
    "MESSAGE_NOT_FOUND",
    "MESSAGE_SIZE",
    "NOT_FOUND",
    "NOT_IMPLEMENTED",
    "RESOURCE_LIMIT",
    "SERVER_BUSY",
    "SESSION_CANNOT_BE_LOCKED",
    "SESSION_LOCK_LOST",
    "TIMEOUT",
    "UNAUTHORIZED",
    "ManagementError",
    "condition",
    "describe",
    "is_missing_entity",
    "lost",
    "store_condition",
]

SERVER_BUSY = "com.microsoft:server-busy"
UNAUTHORIZED = "amqp:unauthorized-access"
NOT_FOUND = "amqp:not-found"
NOT_IMPLEMENTED = "amqp:not-implemented"
DETACH_FORCED = "amqp:link:detach-forced"
MESSAGE_SIZE = "amqp:link:message-size-exceeded"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
ARGUMENT_ERROR = "com.microsoft:argument-error"
DECODE_ERROR = "amqp:decode-error"
INTERNAL_ERROR = "amqp:internal-error"
LOCK_LOST = "com.microsoft:message-lock-lost"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
TIMEOUT = "com.microsoft:timeout"
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"


class ManagementError(Exception):
    """A ``$management`` request refused with a status code and a condition."""

    def __init__(self, status: int, condition: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.condition = condition
        self.description = description


def condition(name: str, description: str) -> Condition:
    """An error condition as Service Bus sends it (the client crashes without an info map)."""
    return Condition(name, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})


def describe(exc: BaseException) -> str:
    """A short text for an exception, fit for an error description."""
    text = str(exc) or type(exc).__name__
    return text[:500]


def lost(exc: BaseException) -> str:
    """The lock-lost condition for a failed settlement (a session's or a message's)."""
    return SESSION_LOCK_LOST if isinstance(exc, SessionLockLostError) else LOCK_LOST


def is_missing_entity(exc: BaseException) -> bool:
    """The store's refusal of an entity or subscription that does not exist (any more)."""
    field = getattr(exc, "field", None)
    return (
        isinstance(exc, ConfigurationError)
        and field in ("entity", "subscription")
        and ("does not exist" in str(exc) or "has no subscription" in str(exc))
    )


def store_condition(exc: BaseException) -> Condition:
    """The AMQP error condition Service Bus would use for a store failure."""
    named = getattr(exc, "condition", None)
    if isinstance(exc, SendError) and isinstance(named, str) and named:
        return condition(named, describe(exc))
    if isinstance(exc, MessageSizeError):
        return condition(MESSAGE_SIZE, describe(exc))
    if is_missing_entity(exc):
        return condition(NOT_FOUND, describe(exc))
    if isinstance(exc, ValidationError):
        return condition(ARGUMENT_ERROR, describe(exc))
    if isinstance(exc, TransientSendError):
        return condition(SERVER_BUSY, describe(exc))
    if isinstance(exc, PermanentSendError):
        return condition(NOT_FOUND, describe(exc))
    if isinstance(exc, SendOnceError):
        return condition(INTERNAL_ERROR, describe(exc))
    return condition(INTERNAL_ERROR, f"{type(exc).__name__}: {describe(exc)}")
