"""Exception mapping: class and AMQP condition decide transient (in doubt) or permanent."""

from __future__ import annotations

import logging

import pytest
from azure.core.exceptions import ClientAuthenticationError
from azure.servicebus._pyamqp.error import (
    AMQPConnectionError,
    AMQPLinkError,
    AMQPSessionError,
    AuthenticationException,
    ErrorCondition,
    MessageSendFailed,
)
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
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
)

from sendonce.backends.servicebus._errors import (
    PERMANENT_CONDITIONS,
    TRANSIENT_CONDITIONS,
    condition_of,
    is_connection_level,
    map_error,
)
from sendonce.errors import PermanentSendError, TransientSendError

T, P = TransientSendError, PermanentSendError

CLASS_TABLE = [
    # (exception, expected, connection-level)
    (ServiceBusConnectionError(), T, True),
    (OperationTimeoutError(), T, True),
    (ServiceBusServerBusyError(), T, False),
    (ServiceBusCommunicationError(), T, True),
    (MessageSizeExceededError(), P, False),
    (MessagingEntityNotFoundError(), P, False),
    (ServiceBusAuthorizationError(), P, False),
    (ServiceBusAuthenticationError(), P, False),
    (ServiceBusQuotaExceededError(), P, False),
    (MessagingEntityDisabledError(), P, False),
    (ServiceBusError("Handler failed: boom."), T, True),  # unknown: in doubt
    (ConnectionResetError(104, "Connection reset by peer"), T, True),
]


@pytest.mark.parametrize(
    ("exc", "expected", "connection_level"),
    CLASS_TABLE,
    ids=[type(e).__name__ for e, _, _ in CLASS_TABLE],
)
def test_each_exception_class_maps_by_its_meaning(
    exc: BaseException, expected: type, connection_level: bool
) -> None:
    error = map_error(exc, operation="send", entity="orders", message_id="m-1")
    assert type(error) is expected
    assert error.message_id == "m-1"
    assert "'orders'" in str(error) and "'m-1'" in str(error)
    assert is_connection_level(exc) is connection_level


CONDITION_TABLE = [
    ("amqp:internal-error", T),
    ("com.microsoft:server-busy", T),
    ("com.microsoft:timeout", T),
    ("amqp:link:detach-forced", T),
    ("amqp:connection:forced", T),
    ("amqp:connection:framing-error", T),
    ("amqp:link:stolen", T),
    ("amqp:session:window-violation", T),
    ("com.microsoft:container-close", T),
    ("amqp:unauthorized-access", P),
    ("com.microsoft:auth-failed", P),
    ("amqp:resource-limit-exceeded", P),
    ("amqp:link:message-size-exceeded", P),
    ("amqp:not-found", P),
    ("amqp:not-allowed", P),
    ("amqp:decode-error", P),
    ("com.microsoft:entity-disabled", P),
    ("com.microsoft:argument-error", P),
    ("com.microsoft:some-future-condition", T),  # unknown: in doubt
]


@pytest.mark.parametrize(("condition", "expected"), CONDITION_TABLE)
def test_a_generic_service_bus_error_maps_by_its_condition(condition: str, expected: type) -> None:
    exc = ServiceBusError("The service said no.", condition=condition.encode())
    error = map_error(exc, operation="send", entity="orders", message_id="m-1")
    assert type(error) is expected
    assert error.condition == condition


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (ErrorCondition.UnauthorizedAccess, P),
        (ErrorCondition.ResourceLimitExceeded, P),
        (ErrorCondition.ConnectionCloseForced, T),
        (ErrorCondition.InternalError, T),
    ],
)
def test_the_condition_wins_over_the_class(condition: ErrorCondition, expected: type) -> None:
    # The client raises ServiceBusConnectionError for any lost connection, whatever the cause.
    exc = ServiceBusConnectionError(message="connection closed", condition=condition)
    error = map_error(exc, operation="send", entity="orders")
    assert type(error) is expected
    assert error.condition == condition.value.decode()


# What the client itself turns AMQP errors into (its real mapping code), then ours.
AMQP_TABLE = [
    (
        AMQPConnectionError(ErrorCondition.ConnectionCloseForced, description="forced"),
        T,
        "amqp:connection:forced",
    ),
    (AMQPConnectionError(ErrorCondition.SocketError, description="reset"), T, "amqp:socket-error"),
    (
        AMQPLinkError(ErrorCondition.LinkDetachForced, description="detached"),
        T,
        "amqp:link:detach-forced",
    ),
    (
        AMQPSessionError(ErrorCondition.SessionErrantLink, description="errant"),
        T,
        "amqp:session:errant-link",
    ),
    (AMQPLinkError(ErrorCondition.NotFound, description="no such entity"), P, "amqp:not-found"),
    (AMQPConnectionError(ErrorCondition.NotFound, description="no such host"), T, "amqp:not-found"),
    (
        AMQPLinkError(ErrorCondition.UnauthorizedAccess, description="no Send claim"),
        P,
        "amqp:unauthorized-access",
    ),
    (
        AMQPLinkError(ErrorCondition.ResourceLimitExceeded, description="quota"),
        P,
        "amqp:resource-limit-exceeded",
    ),
    (
        AMQPLinkError(ErrorCondition.LinkMessageSizeExceeded, description="too big"),
        P,
        "amqp:link:message-size-exceeded",
    ),
    (
        MessageSendFailed(b"com.microsoft:server-busy", description="busy"),
        T,
        "com.microsoft:server-busy",
    ),
    (
        MessageSendFailed(b"com.microsoft:timeout", description="timeout"),
        T,
        "com.microsoft:timeout",
    ),
    (MessageSendFailed(ErrorCondition.InternalError, description="oops"), T, "amqp:internal-error"),
    (
        MessageSendFailed(b"com.microsoft:entity-disabled", description="disabled"),
        P,
        "com.microsoft:entity-disabled",
    ),
    (
        MessageSendFailed(ErrorCondition.ClientError, description="Send timed out"),
        T,
        "amqp:client-error",
    ),
    (
        AuthenticationException(ErrorCondition.ClientError, description="token refused"),
        P,
        "amqp:client-error",
    ),
]


@pytest.mark.parametrize(
    ("amqp_error", "expected", "condition"),
    AMQP_TABLE,
    ids=[f"{type(e).__name__}-{c}" for e, _, c in AMQP_TABLE],
)
def test_amqp_errors_through_the_clients_own_mapping(
    amqp_error: Exception, expected: type, condition: str
) -> None:
    sb_error = PyamqpTransport.create_servicebus_exception(logging.getLogger("t"), amqp_error)
    assert isinstance(sb_error, ServiceBusError)
    error = map_error(sb_error, operation="send", entity="orders", message_id="m-1")
    assert type(error) is expected, (type(sb_error).__name__, condition)
    assert error.condition == condition


def test_a_credential_that_cannot_get_a_token_is_permanent() -> None:
    inner = ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")
    exc = ServiceBusError(message=f"Handler failed: {inner}.", error=inner)
    assert type(map_error(exc, operation="send", entity="q")) is PermanentSendError


def test_a_client_side_value_error_is_permanent() -> None:
    exc = ValueError("The handler has already been shutdown.")
    assert type(map_error(exc, operation="send", entity="q")) is PermanentSendError


def test_condition_tables_are_disjoint_and_cover_the_clients_no_retry_list() -> None:
    from azure.servicebus._pyamqp.error import RetryPolicy

    assert not PERMANENT_CONDITIONS & TRANSIENT_CONDITIONS
    known = PERMANENT_CONDITIONS | TRANSIENT_CONDITIONS
    for condition in RetryPolicy.no_retry:
        assert condition.value.decode() in known
    for condition in ErrorCondition:
        assert condition.value.decode() in known, condition


def test_condition_of_reads_bytes_enums_and_text() -> None:
    assert condition_of(ServiceBusError("x", condition=ErrorCondition.InternalError)) == (
        "amqp:internal-error"
    )
    assert condition_of(ServiceBusError("x", condition=b"com.microsoft:timeout")) == (
        "com.microsoft:timeout"
    )
    assert condition_of(ServiceBusError("x")) is None
    assert condition_of(OSError("x")) is None


def test_a_batch_error_names_the_count_and_no_single_id() -> None:
    error = map_error(ServiceBusConnectionError(), operation="send", entity="q", count=7)
    assert error.message_id is None
    assert "7 messages" in str(error)
