"""The transfer seam (docs/engine.md): base classes, capabilities, the default ``submit``,
the wrappers forwarding through the base, and the one registry of url schemes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sendonce import EntityProfile, Message
from sendonce.aio import AsyncBackend, ThreadedBackend
from sendonce.aio import connect as aio_connect
from sendonce.aio._connect import OPENERS
from sendonce.backends import (
    Ack,
    Backend,
    Capabilities,
    LocalBackend,
    capabilities_of,
    connect,
    submit_of,
)
from sendonce.backends._url import SCHEMES
from sendonce.errors import ConfigurationError, TransientSendError
from sendonce.testing import Fault, FaultyBackend

ORDERS = EntityProfile("orders")


@pytest.fixture
def local(tmp_path: Path) -> LocalBackend:
    backend = LocalBackend(tmp_path / "broker.db")
    backend.create_entity(ORDERS)
    return backend


def outcomes(acks: list[Ack]) -> list[str]:
    return [a.outcome for a in acks]


def msg(i: int) -> Message:
    return Message(f"body {i}", message_id=f"order-{i}")


class Gated(Backend):
    """A backend whose sends wait for ``release``: a transfer caught on its way."""

    capabilities = Capabilities(messaging_system="gated")

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.started = threading.Event()
        self.release = threading.Event()
        self.sent: list[str] = []

    def describe(self, entity: str) -> EntityProfile:
        return self.inner.describe(entity)

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        self.started.set()
        assert self.release.wait(30)
        self.sent += [m.message_id for m in messages]
        return self.inner.send(entity, messages, timeout=timeout, atomic=atomic)

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        return self.inner.schedule(entity, messages, at, timeout=timeout)

    def close(self) -> None:
        self._stop_submissions()
        self.inner.close()


class Duck:
    """A backend written against the old protocol: no base class, attributes probed."""

    max_in_flight = 3
    messaging_system = "duck"
    supports_atomic = True

    def describe(self, entity: str) -> EntityProfile:
        return ORDERS

    def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> list[Ack]:
        return [Ack("accepted") for _ in messages]

    def schedule(self, entity: str, messages: Sequence[Message], at: Any, **kw: Any) -> list[Ack]:
        return [Ack("accepted") for _ in messages]

    def close(self) -> None:
        pass


class Forwarding:
    """A test wrapper forwarding what it lacks to an inner backend (``__getattr__``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> list[Ack]:
        self.seen += 1
        return list(self.inner.send(entity, messages, **kw))


def test_capabilities_replace_the_attribute_probes(local: LocalBackend) -> None:
    assert local.capabilities == Capabilities(
        messaging_system="sendonce_local", atomic_groups=True, reports_duplicates=True
    )
    assert (local.max_in_flight, local.messaging_system) == (1, "sendonce_local")
    assert capabilities_of(local) is local.capabilities
    with pytest.raises(ConfigurationError) as info:
        Capabilities(max_in_flight=0)
    assert info.value.field == "max_in_flight"


def test_a_duck_typed_backend_still_is_a_backend_and_its_attributes_are_read() -> None:
    duck = Duck()
    assert isinstance(duck, Backend)
    assert not isinstance(object(), Backend)
    assert capabilities_of(duck) == Capabilities(3, "duck", atomic_groups=True)
    assert submit_of(duck) is None  # the engine adapts its send


def test_a_forwarding_wrapper_never_lends_the_inner_submit(local: LocalBackend) -> None:
    wrapper = Forwarding(local)
    assert submit_of(wrapper) is None  # its own send must see every transfer
    assert capabilities_of(wrapper).native_submit is False
    assert submit_of(local) is not None


def test_the_default_submit_sends_on_the_backends_pool(local: LocalBackend) -> None:
    futures = [local.submit("orders", [msg(i)], timeout=5) for i in range(3)]
    assert [outcomes(f.result(30)) for f in futures] == [["accepted"]] * 3
    again = local.submit("orders", [msg(0)], timeout=5).result(30)
    assert outcomes(again) == ["duplicate"]
    assert sorted(local.message_ids("orders")) == ["order-0", "order-1", "order-2"]


def test_a_submission_cancels_only_before_it_is_sent(local: LocalBackend) -> None:
    gated = Gated(local)
    running = gated.submit("orders", [msg(1)], timeout=5)
    assert gated.started.wait(30)
    queued = gated.submit("orders", [msg(2)], timeout=5)  # one thread: it waits
    assert running.cancel() is False  # its send runs: bytes may have left
    assert queued.cancel() is True  # never handed over: nothing sent
    gated.release.set()
    assert outcomes(running.result(30)) == ["accepted"]
    assert queued.cancelled()
    assert local.message_ids("orders") == ["order-1"] and gated.sent == ["order-1"]
    with gated:
        pass
    with pytest.raises(ConfigurationError) as info:
        gated.submit("orders", [msg(3)], timeout=5)
    assert info.value.field == "backend"


def test_faulty_backend_forwards_through_the_base_and_faults_submissions(
    local: LocalBackend,
) -> None:
    faulty = FaultyBackend(local, [Fault.AFTER_COMMIT])
    assert isinstance(faulty, Backend)
    assert faulty.capabilities == local.capabilities  # (native_submit already False)
    assert (faulty.messaging_system, faulty.max_in_flight) == ("sendonce_local", 1)
    with pytest.raises(TransientSendError):
        faulty.submit("orders", [msg(1)], timeout=5).result(30)
    assert local.message_ids("orders") == ["order-1"]  # stored, then the ack lost
    assert outcomes(faulty.submit("orders", [msg(1)], timeout=5).result(30)) == ["duplicate"]
    assert [c.fault for c in faulty.calls] == [Fault.AFTER_COMMIT, Fault.NONE]
    with faulty:
        pass


def test_threaded_backend_submits_on_its_worker_and_cancels_only_before(
    local: LocalBackend,
) -> None:
    gated = Gated(local)
    threaded = ThreadedBackend(gated)
    assert threaded.capabilities == gated.capabilities
    assert threaded.messaging_system == "gated"

    async def main() -> None:
        running = threaded.submit("orders", [msg(1)], timeout=5)
        await asyncio.to_thread(gated.started.wait, 30)
        queued = threaded.submit("orders", [msg(2)], timeout=5)
        assert running.cancel() is False and not running.cancelled()
        assert queued.cancel() is True
        gated.release.set()
        assert outcomes(await running) == ["accepted"]
        assert queued.cancelled()
        await threaded.close()
        with pytest.raises(ConfigurationError):
            threaded.submit("orders", [msg(3)], timeout=5)

    asyncio.run(main())
    assert gated.sent == ["order-1"]


class Slow(AsyncBackend):
    """An async backend whose sends wait for an event."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []

    async def describe(self, entity: str) -> EntityProfile:
        return ORDERS

    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        self.started += [m.message_id for m in messages]
        await self.release.wait()
        return [Ack("accepted") for _ in messages]

    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        raise AssertionError("not called")

    async def close(self) -> None:
        pass


def test_the_async_default_submit_refuses_to_cancel_once_sending() -> None:
    async def main() -> None:
        async with Slow() as slow:
            never = slow.submit("orders", [msg(1)], timeout=5)
            assert never.cancel() is True  # before its task ran: never sent
            sending = slow.submit("orders", [msg(2)], timeout=5)
            while not slow.started:
                await asyncio.sleep(0)
            assert sending.cancel() is False
            slow.release.set()
            assert await sending == [Ack("accepted")]
            assert slow.started == ["order-2"]
            assert isinstance(slow, AsyncBackend)

    asyncio.run(main())


def test_both_connects_read_one_registry_of_schemes(tmp_path: Path) -> None:
    assert [s.name for s in SCHEMES] == ["local", "servicebus", "artemis"]
    assert set(OPENERS) == {s.name for s in SCHEMES}  # an aio opener for each
    for opener in (connect, aio_connect):
        with pytest.raises(ConfigurationError) as info:
            opener("ftp://nowhere/x")
        assert str(info.value).startswith(
            "unrecognised backend url 'ftp://nowhere/x': expected local:///path/broker.db, a "
            "Service Bus connection string (Endpoint=sb://...) or an Artemis url (amqp://user:"
        )
    url = f"local://{tmp_path}/b.db"
    with connect(url) as sync_backend:
        assert isinstance(sync_backend, LocalBackend)

    async def main() -> None:
        async with aio_connect(url) as backend:
            assert isinstance(backend, ThreadedBackend)

    asyncio.run(main())
