"""The key in a connection string appears in no repr, error text or log record."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from azure.servicebus.exceptions import (
    ServiceBusAuthenticationError,
    ServiceBusConnectionError,
    ServiceBusError,
)

from sendonce import Message
from sendonce.backends import connect
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.errors import ConfigurationError, SendError

from .conftest import CONN_STR, EMULATOR_CONN_STR, SAS_CONN_STR, SAS_SIG, SECRET, FakeLink

Make = Callable[..., AzureServiceBusBackend]


def _all_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


@pytest.mark.parametrize("conn_str", [CONN_STR, EMULATOR_CONN_STR, SAS_CONN_STR])
def test_repr_shows_the_namespace_never_the_key(make_backend: Make, conn_str: str) -> None:
    backend = make_backend(conn_str)
    text = repr(backend) + str(backend)
    assert SECRET not in text and SAS_SIG not in text
    assert backend.namespace in text


@pytest.mark.parametrize(
    "leaky",
    [
        # Errors whose text carries the connection string or a SAS token, as a careless
        # layer below might produce: the mapped error must not repeat them.
        ServiceBusConnectionError(message=f"cannot connect with {CONN_STR}"),
        ServiceBusAuthenticationError(message=f"token refused: {SAS_CONN_STR}"),
        ServiceBusError(f"Handler failed: {CONN_STR}.", condition=b"amqp:internal-error"),
        OSError(f"reset while using SharedAccessKey={SECRET}"),
    ],
    ids=["connection", "authentication", "generic", "oserror"],
)
def test_mapped_errors_and_log_records_never_contain_the_secret(
    make_backend: Make, link: FakeLink, caplog: pytest.LogCaptureFixture, leaky: BaseException
) -> None:
    backend = make_backend()
    link.failures = [leaky]
    with caplog.at_level(logging.DEBUG), pytest.raises(SendError) as info:
        backend.send("orders", [Message("x", message_id="m-1")], timeout=5)
    error = info.value
    assert error.__cause__ is None and error.__suppress_context__  # the raw text is not chained
    assert SECRET not in _all_text(error)
    assert SAS_SIG not in _all_text(error)
    assert "***" in str(error)
    assert caplog.records, "the failure is logged"
    for record in caplog.records:
        text = record.getMessage() + repr(record.args)
        assert SECRET not in text and SAS_SIG not in text, record.name
    assert any(r.name == "sendonce.servicebus" for r in caplog.records)


def test_configuration_errors_never_contain_the_secret() -> None:
    broken = CONN_STR.replace("SharedAccessKeyName=RootManageSharedAccessKey;", "")
    with pytest.raises(ConfigurationError) as info:
        AzureServiceBusBackend.from_connection_string(broken)
    assert SECRET not in _all_text(info.value)


def test_the_emulator_describe_error_never_contains_the_secret(make_backend: Make) -> None:
    with pytest.raises(ConfigurationError) as info:
        make_backend(EMULATOR_CONN_STR).describe("orders")
    assert SECRET not in _all_text(info.value)


def test_a_connect_url_error_never_contains_the_secret() -> None:
    from sendonce.backends import connect

    with pytest.raises(ConfigurationError) as info:
        connect(CONN_STR.replace("Endpoint=sb://", "Endpoint=").replace("/;", ";") + ";x")
    assert SECRET not in _all_text(info.value)


def test_real_sdk_logs_during_a_failed_send_carry_no_secret(
    caplog: pytest.LogCaptureFixture, unused_port: int
) -> None:
    conn_str = EMULATOR_CONN_STR.replace("5672", str(unused_port))
    with caplog.at_level(logging.DEBUG):
        backend = AzureServiceBusBackend.from_connection_string(conn_str, link_timeout=5)
        try:
            with pytest.raises(SendError) as info:
                backend.send("orders", [Message("x", message_id="m-1")], timeout=5)
        finally:
            backend.close()
    assert SECRET not in _all_text(info.value)
    for record in caplog.records:
        assert SECRET not in record.getMessage(), record.name


@pytest.fixture
def unused_port() -> Any:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Issue 14 (11): connection strings as the client reads them, problems named precisely.


@pytest.mark.parametrize(
    ("conn_str", "named"),
    [
        ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k", "SharedAccessKey part"),
        ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey=TOPSECRET42", "KeyName part"),
        ("SharedAccessKeyName=k;SharedAccessKey=TOPSECRET42", "no Endpoint part"),
        (
            "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRET42;link_timout=5",
            "unknown part 'link_timout'",
        ),
    ],
)
def test_a_bad_connection_string_names_what_is_wrong(conn_str: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        connect(conn_str)
    assert named in str(info.value) and "TOPSECRET42" not in str(info.value)
    assert info.value.field == "connection_string"


def test_lowercase_keys_are_accepted_as_the_client_accepts_them() -> None:
    conn_str = "endpoint=sb://ns.servicebus.windows.net/;sharedaccesskeyname=k;sharedaccesskey=v"
    with connect(conn_str) as backend:
        assert backend.namespace == "ns.servicebus.windows.net"


def test_unknown_backend_options_are_refused() -> None:
    conn_str = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"
    with pytest.raises(ConfigurationError, match="unknown Service Bus backend option") as info:
        connect(conn_str, link_timout=5)
    assert info.value.field == "link_timout"
