"""sendonce.aio.connect(url), RetryPolicy.acall and the async backends' configuration checks."""

from __future__ import annotations

import asyncio
import pickle
from datetime import timedelta
from pathlib import Path

import pytest
from _aio_helpers import FakeTime

from sendonce import (
    ConfigurationError,
    EntityProfile,
    InDoubtError,
    Message,
    PermanentSendError,
    RetryPolicy,
    TransientSendError,
)
from sendonce.aio import AzureServiceBusBackend, ThreadedBackend, connect
from sendonce.backends.local import LocalBackend

KEY = "c2VjcmV0LWtleQ=="
CONN = (
    f"Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={KEY}"
)


def test_local_url_gives_a_threaded_local_backend(tmp_path: Path) -> None:
    async def main() -> None:
        async with connect(f"local://{tmp_path / 'b.db'}") as backend:
            assert isinstance(backend, ThreadedBackend)
            assert isinstance(backend.inner, LocalBackend)
            await backend.create_entity(EntityProfile("orders"))
            assert (await backend.describe("orders")).name == "orders"
            assert backend.supports_atomic is not False  # groups allowed

    asyncio.run(main())


def test_connection_string_gives_the_async_service_bus_backend() -> None:
    async def main() -> None:
        backend = connect(CONN)
        assert isinstance(backend, AzureServiceBusBackend)
        assert KEY not in repr(backend)
        assert backend.namespace == "example.servicebus.windows.net"
        with pytest.raises(TypeError, match="pickled"):
            pickle.dumps(backend)
        await backend.close()
        with pytest.raises(ConfigurationError, match="closed"):
            await backend.send("orders", [_m()], timeout=1.0)

    asyncio.run(main())


def _m() -> Message:
    return Message("x", message_id="m-1")


@pytest.mark.parametrize(
    ("url", "options", "field"),
    [
        ("", {}, "url"),
        (f"mqtt://user:{KEY}@host", {}, "url"),
        (f"amqp://user:{KEY}@host:5672/orders", {}, "url"),
        (CONN, {"retry_total": 3}, "retry_total"),
        (CONN, {"link_timeout": float("inf")}, "timeout"),
        (CONN, {"max_batch_size": 10}, "max_batch_size"),
        (CONN, {"kinds": {"orders": "stream"}}, "kinds"),
        (CONN, {"profiles": {"orders": EntityProfile("other")}}, "profiles"),
        ("Endpoint=sb://;SharedAccessKey", {}, "connection_string"),
    ],
)
def test_bad_urls_and_options_name_the_field_and_hide_the_key(
    url: str, options: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        connect(url, **options)
    assert info.value.field == field
    assert KEY not in str(info.value)


def test_an_amqp_url_gives_the_artemis_backend_without_its_password_in_the_repr() -> None:
    backend = connect(f"amqp://user:{KEY}@127.0.0.1:5672")
    assert type(backend).__name__ == "ThreadedBackend"
    assert type(backend.inner).__name__ == "ArtemisBackend"  # type: ignore[attr-defined]
    assert KEY not in repr(backend)
    asyncio.run(backend.close())


def test_acall_mirrors_call(fake_time: FakeTime) -> None:
    policy = RetryPolicy(
        max_attempts=3,
        jitter=False,
        sleep=fake_time.sleep,
        async_sleep=fake_time.async_sleep,
        clock=fake_time.clock,
    )
    outcomes: list[BaseException | str] = [TransientSendError("lost"), "ok"]
    timeouts: list[float] = []

    async def attempt(timeout: float) -> str:
        timeouts.append(timeout)
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    done = asyncio.run(policy.acall(attempt, window=None, message_id="m"))
    assert (done.value, done.attempts, done.in_doubt_before) == ("ok", 2, True)
    assert timeouts == [30.0, 30.0] and fake_time.slept == [0.5]

    async def always_transient(timeout: float) -> str:
        raise TransientSendError("lost")

    with pytest.raises(InDoubtError, match="all 3 attempts") as info:
        asyncio.run(policy.acall(always_transient, window=None, message_id="m"))
    assert info.value.attempts == 3

    async def refused(timeout: float) -> str:
        raise PermanentSendError("no")

    with pytest.raises(PermanentSendError):
        asyncio.run(policy.acall(refused, window=None, message_id="m"))


def test_acall_lets_cancellation_through_unretried(fake_time: FakeTime) -> None:
    policy = RetryPolicy(async_sleep=fake_time.async_sleep, clock=fake_time.clock)
    calls = 0

    async def attempt(timeout: float) -> str:
        nonlocal calls
        calls += 1
        raise asyncio.CancelledError()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(policy.acall(attempt, window=None, message_id="m"))
    assert calls == 1


def test_policy_with_async_sleep_pickles_and_checks_it() -> None:
    policy = pickle.loads(pickle.dumps(RetryPolicy()))
    assert policy.async_sleep is asyncio.sleep
    with pytest.raises(ConfigurationError) as info:
        RetryPolicy(async_sleep=1.0)  # type: ignore[arg-type]
    assert info.value.field == "async_sleep"


class _FakeAdmin:
    """Stands in for the async administration REST API (no real peer in tests)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.closed = False

    async def get_queue(self, name: str, **bounds: object) -> object:
        from azure.core.exceptions import ResourceNotFoundError

        self.calls.append(("queue", name))
        raise ResourceNotFoundError("no such queue")

    async def get_topic(self, name: str, **bounds: object) -> object:
        from types import SimpleNamespace

        self.calls.append(("topic", name))
        return SimpleNamespace(
            duplicate_detection_history_time_window=timedelta(minutes=3),
            requires_duplicate_detection=True,
            enable_partitioning=True,
            max_message_size_in_kilobytes=1024,
        )

    async def close(self) -> None:
        self.closed = True


def test_describe_reads_the_administration_api_once() -> None:
    admin = _FakeAdmin()

    async def main() -> EntityProfile:
        async with AzureServiceBusBackend.from_connection_string(
            CONN, admin_client=admin
        ) as backend:
            first = await backend.describe("events")
            assert await backend.describe("events") is first  # cached
            return first

    profile = asyncio.run(main())
    assert admin.calls == [("queue", "events"), ("topic", "events")]
    assert admin.closed
    assert profile.kind == "topic" and profile.partitioned
    assert profile.duplicate_detection_window == timedelta(minutes=3)
    assert profile.max_message_size == 1024 * 1024
