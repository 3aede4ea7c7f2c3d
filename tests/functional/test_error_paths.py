"""Every send error, on every surface, ends in a report that names each message.

A batch whose transfer fails is reported once per message: each failure is a copy
of the transfer's error naming its own message. That copy once re-called each
class's constructor and crashed (``TypeError``) for classes whose constructor
differs (``NeverSentError``: a batch to an unreachable namespace). The property
below runs over the whole error tree as the package defines it today, so a class
added later is covered without anyone remembering to add it here.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import socket
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import sendonce
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends import Ack
from sendonce.backends.local import LocalBackend
from sendonce.errors import (
    AttemptNotSentError,
    InDoubtError,
    NeverSentError,
    PermanentSendError,
    SendError,
    TransientSendError,
)

ORDERS = EntityProfile("orders")


def _import_everything() -> None:
    """Import every module of the package so every error class is defined."""
    for info in pkgutil.walk_packages(sendonce.__path__, "sendonce."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue


def _subclasses(base: type[SendError]) -> Iterator[type[SendError]]:
    for cls in base.__subclasses__():
        yield cls
        yield from _subclasses(cls)


_import_everything()
_BASES = (TransientSendError, PermanentSendError)
BACKEND_ERRORS = sorted(
    {cls for base in _BASES for cls in (base, *_subclasses(base))},
    key=lambda c: c.__qualname__,
)
"""Every class the Backend protocol lets a backend raise, found in the package itself."""


def _instance(cls: type[SendError]) -> SendError:
    """An instance of ``cls``, whatever its constructor asks for."""
    args = [
        f"{name} of the test"
        for name, param in inspect.signature(cls).parameters.items()
        if param.default is param.empty
        and param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)
    ]
    return cls(*args)


class RaisingBackend:
    """A real local broker whose transfers all fail with one given error (nothing stored)."""

    def __init__(self, inner: LocalBackend, error: SendError) -> None:
        self.inner = inner
        self.error = error
        self.calls = 0

    def describe(self, entity: str) -> EntityProfile:
        return self.inner.describe(entity)

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        self.calls += 1
        raise self.error

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        self.calls += 1
        raise self.error

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> RaisingBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRaisingBackend:
    """The same for the asyncio sender."""

    def __init__(self, inner: RaisingBackend) -> None:
        self.inner = inner

    async def describe(self, entity: str) -> EntityProfile:
        return self.inner.describe(entity)

    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        await asyncio.sleep(0)
        return self.inner.send(entity, messages, timeout=timeout, atomic=atomic)

    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        return self.inner.schedule(entity, messages, at, timeout=timeout)

    async def close(self) -> None:
        self.inner.close()

    async def __aenter__(self) -> AsyncRaisingBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _local_broker(tmp_path: Path) -> LocalBackend:
    local = LocalBackend(tmp_path / "broker.db")
    local.create_entity(ORDERS)
    return local


def _retry() -> RetryPolicy:
    return RetryPolicy(
        max_attempts=2,
        initial_backoff=0.0,
        jitter=False,
        sleep=lambda _s: None,
        async_sleep=_no_sleep,
        attempt_timeout=5.0,
    )


async def _no_sleep(_seconds: float) -> None:
    return None


def _messages(count: int) -> list[Message]:
    return [Message(f"body {i}", message_id=f"order-{i}") for i in range(count)]


def _expected_type(cls: type[SendError]) -> type[SendError]:
    """What the sender reports after its retries: the error itself, or what it becomes."""
    if issubclass(cls, AttemptNotSentError):
        return NeverSentError  # nothing can have been stored: not in doubt
    if issubclass(cls, TransientSendError):
        return InDoubtError
    return cls


def _check_report(report: Any, messages: list[Message], cls: type[SendError]) -> None:
    assert report.failed == len(messages)
    assert report.sent == report.duplicates == 0
    assert [f.message_id for f in report.failures] == [m.message_id for m in messages]
    for failure, message in zip(report.failures, messages, strict=True):
        error = failure.error
        assert isinstance(error, _expected_type(cls))
        assert error.message_id == message.message_id  # each failure names its own message
        assert message.message_id in str(error)


def test_the_property_covers_the_classes_backends_raise() -> None:
    names = {cls.__name__ for cls in BACKEND_ERRORS}
    assert {"AttemptNotSentError", "NeverSentError", "BrokerStorageError"} <= names


@pytest.mark.parametrize("cls", BACKEND_ERRORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("count", [1, 2, 5])
def test_sync_batch_reports_every_error_class(
    tmp_path: Path, cls: type[SendError], count: int
) -> None:
    messages = _messages(count)
    with (
        _local_broker(tmp_path) as local,
        IdempotentSender(RaisingBackend(local, _instance(cls)), ORDERS, retry=_retry()) as sender,
    ):
        report = sender.send_many(messages)
        _check_report(report, messages, cls)
        with pytest.raises(_expected_type(cls)) as raised:
            sender.send(Message("single", message_id="single-1"))
        assert raised.value.message_id == "single-1"
        assert local.count("orders") == 0  # nothing was stored


@pytest.mark.parametrize("cls", BACKEND_ERRORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("count", [1, 3])
def test_aio_batch_reports_every_error_class(
    tmp_path: Path, cls: type[SendError], count: int
) -> None:
    from sendonce.aio import IdempotentSender as AsyncSender

    messages = _messages(count)

    async def main() -> None:
        with _local_broker(tmp_path) as local:
            backend = AsyncRaisingBackend(RaisingBackend(local, _instance(cls)))
            async with AsyncSender(backend, ORDERS, retry=_retry()) as sender:
                report = await sender.send_many(messages)
                _check_report(report, messages, cls)
                with pytest.raises(_expected_type(cls)) as raised:
                    await sender.send(Message("single", message_id="single-1"))
                assert raised.value.message_id == "single-1"
            assert local.count("orders") == 0

    asyncio.run(main())


def test_per_message_copies_keep_type_attributes_and_cause() -> None:
    for cls in BACKEND_ERRORS:
        original = _instance(cls)
        original.__cause__ = OSError("the cause")
        copy = original.for_message("order-7", "pk")
        assert type(copy) is cls
        assert (copy.message_id, copy.partition_key) == ("order-7", "pk")
        assert copy.condition == original.condition
        assert copy.__cause__ is original.__cause__
        assert "order-7" in str(copy) and str(original) in str(copy)
        named = ("message_id", "partition_key")
        kept = {k: v for k, v in vars(copy).items() if k not in named}
        assert kept == {k: v for k, v in vars(original).items() if k not in named}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _unreachable_namespace() -> str:
    return (
        f"Endpoint=sb://127.0.0.1:{_closed_port()};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=c2VjcmV0LWtleS1vZi10aGUtdGVzdA==;UseDevelopmentEmulator=true"
    )


@pytest.mark.emulator
def test_batch_to_an_unreachable_namespace_is_reported_not_crashed() -> None:
    """The real azure-servicebus client on a refused socket: each message not stored."""
    pytest.importorskip("azure.servicebus")
    from sendonce.backends import connect

    url = _unreachable_namespace()
    messages = _messages(3)
    with connect(url) as backend, IdempotentSender(backend, ORDERS, retry=_retry()) as sender:
        report = sender.send_many(messages)
        _check_report(report, messages, AttemptNotSentError)
        for failure in report.failures:
            assert "c2VjcmV0" not in str(failure.error)  # the key never leaks
        with pytest.raises(NeverSentError):
            sender.send(Message("single", message_id="single-1"))


@pytest.mark.emulator
def test_aio_batch_to_an_unreachable_namespace_is_reported_not_crashed() -> None:
    pytest.importorskip("azure.servicebus")
    from sendonce.aio import IdempotentSender as AsyncSender
    from sendonce.aio import connect as aio_connect

    url = _unreachable_namespace()
    messages = _messages(3)

    async def main() -> None:
        async with (
            aio_connect(url) as backend,
            AsyncSender(backend, ORDERS, retry=_retry()) as sender,
        ):
            report = await sender.send_many(messages)
            _check_report(report, messages, AttemptNotSentError)
            with pytest.raises(NeverSentError):
                await sender.send(Message("single", message_id="single-1"))

    asyncio.run(main())


@pytest.mark.parametrize("backend", [None, 42, object()], ids=["None", "int", "object"])
def test_a_sender_without_a_backend_names_the_field(backend: Any) -> None:
    from sendonce import ConfigurationError
    from sendonce.aio import IdempotentSender as AsyncSender

    for cls in (IdempotentSender, AsyncSender):
        with pytest.raises(ConfigurationError) as raised:
            cls(backend, ORDERS)
        assert raised.value.field == "backend"
