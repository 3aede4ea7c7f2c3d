"""Every azure-servicebus exception becomes a sendonce error here, and only here.

Retryability depends on the AMQP error condition as well as the exception class:
the client raises ``ServiceBusConnectionError`` for any connection it loses,
whether the peer closed it for a network blip (``amqp:connection:forced``) or
because the credential was refused (``amqp:unauthorized-access``). So the
condition is read first, then the class.

The rule for doubt: an error is *permanent* only when the broker refused the
operation and cannot have stored the message. Anything else, including an error
we cannot classify, is *transient*: the message may have been stored, and
resending it with the same id inside the window is what makes that safe.
Reporting "not sent" for a message that may have landed would be the dangerous lie.
"""

from __future__ import annotations

import logging
from typing import Any

from azure.core.exceptions import AzureError, ClientAuthenticationError
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from ...errors import NotSentError, PermanentSendError, SendError, TransientSendError, redact
from .. import _amqp_conditions as _amqp

__all__ = [
    "PERMANENT_CONDITIONS",
    "TRANSIENT_CONDITIONS",
    "condition_of",
    "is_connection_level",
    "map_error",
]

logger = logging.getLogger("sendonce.servicebus")

# The broker refused: nothing was stored, and the same request will be refused again.
# On Service Bus a resource limit is a quota: the same send is refused until it changes.
PERMANENT_CONDITIONS: frozenset[str] = _amqp.REFUSED | {
    _amqp.RESOURCE_LIMIT,
    "amqp:link:redirect",
    "amqp:connection:redirect",
    "com.microsoft:auth-failed",
    "com.microsoft:entity-disabled",
    "com.microsoft:entity-already-exists",
    "com.microsoft:argument-error",
    "com.microsoft:argument-out-of-range",
    "com.microsoft:precondition-failed",
    "com.microsoft:message-lock-lost",
    "com.microsoft:message-not-found",
    "com.microsoft:session-lock-lost",
}

# The link, session or connection went away, or the broker asked us to come back
# later: the message may or may not have been stored.
TRANSIENT_CONDITIONS: frozenset[str] = _amqp.TRANSIENT | {
    "amqp:connection:framing-error",
    "amqp:link:transfer-limit-exceeded",
    "amqp:session:window-violation",
    "amqp:session:errant-link",
    "amqp:session:handle-in-use",
    "amqp:session:unattached-handle",
    "amqp:client-error",
    "amqp:unknown-error",
    "amqp:socket-error",
    "amqp:vendor-error",
    "com.microsoft:server-busy",
    "com.microsoft:timeout",
    "com.microsoft:container-close",
    "com.microsoft:session-cannot-be-locked",
}

_PERMANENT_CLASSES: tuple[type[BaseException], ...] = (
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    MessagingEntityDisabledError,
    MessagingEntityAlreadyExistsError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusQuotaExceededError,
    MessageNotFoundError,
    MessageLockLostError,
    SessionLockLostError,
)

_TRANSIENT_CLASSES: tuple[type[BaseException], ...] = (
    ServiceBusConnectionError,
    ServiceBusCommunicationError,
    OperationTimeoutError,
    ServiceBusServerBusyError,
    SessionCannotBeLockedError,
)

# Errors after which the cached sender's link may be dead and must be rebuilt.
_CONNECTION_CLASSES: tuple[type[BaseException], ...] = (
    ServiceBusConnectionError,
    ServiceBusCommunicationError,
    OperationTimeoutError,
    OSError,
)
_CONNECTION_CONDITIONS = frozenset(
    {
        "amqp:connection:forced",
        "amqp:connection:framing-error",
        "amqp:link:detach-forced",
        "amqp:link:stolen",
        "amqp:illegal-state",
        "amqp:session:window-violation",
        "amqp:session:errant-link",
        "amqp:session:handle-in-use",
        "amqp:session:unattached-handle",
        "amqp:socket-error",
        "amqp:unknown-error",
        "com.microsoft:container-close",
    }
)


def condition_of(exc: BaseException) -> str | None:
    """The AMQP error condition an azure-servicebus exception carries, as text."""
    raw: Any = getattr(exc, "_condition", None)
    if raw is None:
        raw = getattr(exc, "condition", None)
    if raw is None:
        return None
    value: Any = getattr(raw, "value", raw)  # an ErrorCondition enum member
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _is_permanent(exc: BaseException, condition: str | None) -> bool:
    if isinstance(exc, ServiceBusCommunicationError):
        # "amqp:not-found" here means the host did not resolve or answer: a network fault.
        return False
    if isinstance(exc, ServiceBusAuthenticationError | ServiceBusAuthorizationError):
        return True
    inner = getattr(exc, "inner_exception", None)
    if isinstance(inner, ClientAuthenticationError):
        # azure-identity could not get a token: no retry inside the window will fix that.
        return True
    if condition in PERMANENT_CONDITIONS:
        return True
    if condition in TRANSIENT_CONDITIONS:
        return False
    if isinstance(exc, _PERMANENT_CLASSES):
        return True
    if isinstance(exc, (*_TRANSIENT_CLASSES, OSError)):
        return False
    # A ValueError from the client is a refusal before anything went on the wire.
    # Anything else (unknown class and condition) is in doubt.
    return isinstance(exc, ValueError) and not isinstance(exc, ServiceBusError)


def is_connection_level(exc: BaseException) -> bool:
    """Whether the sender's link may be dead after ``exc`` (close and recreate it)."""
    if isinstance(exc, _CONNECTION_CLASSES):
        return True
    condition = condition_of(exc)
    if condition in _CONNECTION_CONDITIONS:
        return True
    # An unclassified client failure ("Handler failed: ...") leaves the handler in an unknown state.
    return type(exc) is ServiceBusError and condition is None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return redact(f"{type(exc).__name__}: {text}")


def map_error(
    exc: BaseException,
    *,
    operation: str,
    entity: str,
    message_id: str | None = None,
    partition_key: str | None = None,
    count: int = 1,
    reached: bool = True,
) -> SendError:
    """The sendonce error for an exception the client raised during ``operation``.

    ``exc`` is an azure-servicebus / azure-core exception, an ``OSError``, or a
    ``ValueError`` raised by the client before sending. The result keeps the AMQP
    condition in ``.condition``; its text is redacted. The caller raises it
    ``from None`` so the client's own (unredacted) text is not chained.
    ``reached=False`` says the failure came while opening the connection or link,
    before any transfer: nothing can have been stored, so a transient failure is a
    :class:`NotSentError`, not in doubt.
    """
    condition = condition_of(exc)
    permanent = _is_permanent(exc, condition)
    what = f"message {message_id!r}" if message_id is not None else f"{count} messages"
    if permanent:
        verdict = "the broker refused it; nothing was stored and retrying cannot help"
    elif not reached:
        verdict = "the link to the broker never opened, so nothing was sent; retrying is safe"
    else:
        # No rule words: the entity may keep a window, an id cache or no duplicate detection.
        verdict = "the outcome is in doubt: it may have been stored"
    text = f"{operation} of {what} to {entity!r} failed ({_describe(exc)}): {verdict}"
    if condition and f"condition: {condition}" not in text.lower():
        text += f" [condition {condition}]"
    cls: type[SendError] = (
        PermanentSendError if permanent else TransientSendError if reached else NotSentError
    )
    error = cls(text, message_id=message_id, partition_key=partition_key, condition=condition)
    logger.log(
        logging.WARNING if permanent else logging.INFO,
        "%s %s to %s failed: %s (condition=%s, mapped to %s)",
        operation,
        what,
        entity,
        _describe(exc),
        condition,
        cls.__name__,
    )
    return error


def is_sdk_error(exc: BaseException) -> bool:
    """Whether ``exc`` is something the client raises for a failed operation."""
    return isinstance(exc, AzureError | OSError | ValueError)
