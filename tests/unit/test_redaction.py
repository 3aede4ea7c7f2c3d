"""Secrets (connection-string keys, SAS signatures) never reach an error, a repr or a log line."""

from __future__ import annotations

import logging
import pickle
import traceback
from collections.abc import Callable, Iterator

import pytest

import sendonce
import sendonce.backends.local
from sendonce.backends import connect, describe_url
from sendonce.errors import REDACTED, SendOnceError, ValidationError, redact

SECRET = "c2VjcmV0S2V5VmFsdWUxMjM0NTY3ODkw"  # base64-looking, as real keys are
SIG = "Abc%2Bdef%2Fghi%3D"  # a URL-encoded SAS signature

SHAPES: dict[str, str] = {
    "connection-string": (
        f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
        f"SharedAccessKey={SECRET}"
    ),
    "connection-string-key-first": f"SharedAccessKey={SECRET};Endpoint=sb://ns/",
    "connection-string-lowercase": f"endpoint=sb://ns/;sharedaccesskeyname=k;sharedaccesskey={SECRET}",
    "connection-string-spaces": f"Endpoint=sb://ns/; SharedAccessKey = {SECRET} ;EntityPath=q",
    "connection-string-entity-after": f"Endpoint=sb://ns/;SharedAccessKey={SECRET};EntityPath=q",
    "connection-string-sas": (
        "Endpoint=sb://ns/;SharedAccessSignature=SharedAccessSignature "
        f"sr=sb%3A%2F%2Fns%2Fq&sig={SECRET}&se=1700000000&skn=send"
    ),
    "sas-token": f"SharedAccessSignature sr=sb%3A%2F%2Fns&sig={SECRET}&se=1700000000&skn=k",
    "sas-sig-first": f"SharedAccessSignature sig={SECRET}&se=1700000000&skn=k&sr=x",
    "sas-bare-query": f"sig={SECRET}&se=1700000000",
    "storage-sas-url": f"https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig={SECRET}&se=1",
    "storage-sas-url-encoded-sig": f"https://acct.blob.core.windows.net/c?sv=1&sig={SIG}",
    "sas-url-encoded-in-url": f"https://x/cb?token=sr%3Dx%26sig%3D{SECRET}%26se%3D1",
    "account-key": (
        f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={SECRET};"
        "EndpointSuffix=core.windows.net"
    ),
    "url-userinfo": f"amqps://sender:{SECRET}@ns.servicebus.windows.net/q",
    "quoted-double": f'SharedAccessKey="{SECRET}"',
    "quoted-single": f"SharedAccessKey='{SECRET}'",
    "in-a-repr": repr({"url": f"Endpoint=sb://ns/;SharedAccessKey={SECRET}"}),
    "twice": f"SharedAccessKey={SECRET};x;SharedAccessKey={SECRET}",
}


def _secret_of(shape: str) -> str:
    return SIG.split("%")[0] if shape == "storage-sas-url-encoded-sig" else SECRET


@pytest.mark.parametrize("shape", list(SHAPES))
def test_redact_masks(shape: str) -> None:
    out = redact(SHAPES[shape])
    assert _secret_of(shape) not in out, out
    assert REDACTED in out


def test_redact_keeps_what_is_useful_for_debugging() -> None:
    out = redact(SHAPES["connection-string"])
    assert out == (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=***"
    )
    token = redact(SHAPES["sas-token"])
    assert "sr=sb%3A%2F%2Fns" in token
    assert "se=1700000000" in token and "skn=k" in token
    assert redact(SHAPES["url-userinfo"]) == "amqps://sender:***@ns.servicebus.windows.net/q"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "message 'order-1.2017/payment' is in doubt after 3 attempts",
        "local:///tmp/broker.db",
        "field 'signature' is missing; design=sig",
        "Endpoint=sb://ns/;SharedAccessKeyName=send",
        "https://example.com/path?a=1&b=2",
    ],
)
def test_redact_leaves_text_without_secrets_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("shape", list(SHAPES))
def test_redact_is_idempotent(shape: str) -> None:
    once = redact(SHAPES[shape])
    assert redact(once) == once


# ---------------------------------------------------------------- every error class


def _all_error_classes() -> Iterator[type[SendOnceError]]:
    stack: list[type[SendOnceError]] = [SendOnceError]
    while stack:
        cls = stack.pop()
        yield cls
        stack.extend(cls.__subclasses__())


ERROR_CLASSES = sorted(_all_error_classes(), key=lambda c: (c.__module__, c.__name__))


def test_the_whole_tree_is_covered() -> None:
    names = {c.__name__ for c in ERROR_CLASSES}
    assert set(sendonce.errors.__all__) - {"redact", "PublishCounts"} <= names  # a protocol


def _shown(exc: BaseException) -> str:
    """Everything a user, a log handler or a traceback would show of ``exc``."""
    try:
        raise exc
    except BaseException as raised:
        formatted = "".join(traceback.format_exception(raised))
    return "\n".join([str(exc), repr(exc), repr(exc.args), formatted])


def _make(cls: type[SendOnceError]) -> Callable[[str], SendOnceError]:
    """How to construct each class with a message (a few take extra context first)."""
    if cls.__name__ in ("BrokerFileError", "BrokerStorageError"):
        return lambda text: cls("/tmp/broker.db", text)
    return cls


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("shape", ["connection-string", "sas-token", "account-key", "url-userinfo"])
def test_errors_never_show_a_secret(cls: type[SendOnceError], shape: str) -> None:
    exc = _make(cls)(f"could not open {SHAPES[shape]}: refused")
    shown = _shown(exc)
    assert SECRET not in shown
    assert "refused" in str(exc)
    assert SECRET not in exc.message


PICKLE_CASES = [pytest.param(c, id=c.__name__) for c in ERROR_CLASSES]


@pytest.mark.parametrize("cls", PICKLE_CASES)
def test_errors_survive_pickling_still_redacted(cls: type[SendOnceError]) -> None:
    """Errors cross process boundaries (multiprocessing, executors): they must unpickle."""
    exc = _make(cls)(f"could not open {SHAPES['connection-string']}")
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    assert SECRET not in _shown(copy)
    for attr in ("field", "message_id", "partition_key", "attempts"):
        assert getattr(copy, attr, None) == getattr(exc, attr, None)


def test_validation_errors_keep_their_field_after_redaction() -> None:
    exc = sendonce.ConfigurationError(f"bad url {SHAPES['connection-string']}", field="url")
    assert exc.field == "url"
    assert isinstance(exc, ValidationError)
    assert SECRET not in str(exc)


def test_send_errors_keep_their_context_after_redaction() -> None:
    exc = sendonce.InDoubtError(
        f"in doubt over {SHAPES['connection-string']}", message_id="order-1", attempts=3
    )
    assert (exc.message_id, exc.attempts) == ("order-1", 3)
    assert SECRET not in _shown(exc)


# ---------------------------------------------------------------- connect() error paths

BAD_URLS: dict[str, str] = {
    "http-with-password": f"http://user:{SECRET}@host/x",
    "key-without-endpoint": f"SharedAccessKey={SECRET}",
    "unknown-scheme-with-sas": f"ftp://host/x?sig={SECRET}",
    "local-userinfo": f"local://user:{SECRET}@host/x.db",
    "local-key-in-host": f"local://SharedAccessKey={SECRET}/x.db",
    "local-no-file": f"local:///tmp/?sig={SECRET}",
    "conn-missing-key-name": f"Endpoint=sb://ns/;SharedAccessKey={SECRET}",
    "conn-bad-endpoint": f"Endpoint=notaurl;SharedAccessKeyName=k;SharedAccessKey={SECRET}",
    "conn-empty-host": f"Endpoint=sb://;SharedAccessKeyName=k;SharedAccessKey={SECRET}",
    "conn-key-and-sas": (
        f"Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey={SECRET};"
        f"SharedAccessSignature=SharedAccessSignature sr=x&sig={SECRET}&se=1"
    ),
}


@pytest.mark.parametrize("name", list(BAD_URLS))
def test_connect_error_paths_never_show_secret(name: str, caplog: pytest.LogCaptureFixture) -> None:
    url = BAD_URLS[name]
    if url.startswith("Endpoint"):
        pytest.importorskip("azure.servicebus")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(sendonce.ConfigurationError) as ei:
        connect(url)
    assert ei.value.field in ("url", "connection_string")
    assert SECRET not in _shown(ei.value)
    assert SECRET not in caplog.text


def test_describe_url_masks_every_secret() -> None:
    for url in (*BAD_URLS.values(), SHAPES["connection-string"]):
        assert SECRET not in describe_url(url)
    assert describe_url("local:///tmp/b.db") == "local:///tmp/b.db"


def test_servicebus_backend_repr_and_logs_hide_the_key(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("azure.servicebus")
    caplog.set_level(logging.DEBUG)
    backend = connect(SHAPES["connection-string"])
    try:
        assert SECRET not in repr(backend)
        assert SECRET not in str(backend)
    finally:
        backend.close()
    assert SECRET not in caplog.text


def test_servicebus_backend_repr_hides_endpoint_userinfo(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("azure.servicebus")
    caplog.set_level(logging.DEBUG)
    backend = connect(
        f"Endpoint=sb://user:{SECRET}@ns/;SharedAccessKeyName=k;SharedAccessKey={SECRET}"
    )
    try:
        assert SECRET not in repr(backend)
    finally:
        backend.close()
    assert SECRET not in caplog.text


def test_failed_send_over_a_real_socket_never_shows_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real azure-servicebus client against a closed local port: the error path end to end."""
    pytest.importorskip("azure.servicebus")
    import socket

    from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy, SendError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey={SECRET};"
        "UseDevelopmentEmulator=true"
    )
    caplog.set_level(logging.DEBUG)
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=False, attempt_timeout=5.0)
    with IdempotentSender(url, EntityProfile("orders"), retry=retry) as sender:
        assert SECRET not in repr(sender)
        with pytest.raises(SendError) as ei:
            sender.send(Message(b"x", message_id="order-1"))
    shown = _shown(ei.value)
    assert SECRET not in shown
    assert "order-1" in str(ei.value)
    last = getattr(ei.value, "last_error", None)
    if last is not None:
        assert SECRET not in _shown(last)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("message_id", ["tenant:alice@example.com/welcome", "order:12345@shop.eu"])
def test_errors_still_name_message_ids_that_look_like_credentials(message_id: str) -> None:
    """Error messages must name the message id; only real secrets are masked."""
    exc = sendonce.InDoubtError(f"message {message_id!r} is in doubt", message_id=message_id)
    assert message_id in str(exc)
