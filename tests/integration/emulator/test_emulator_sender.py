"""IdempotentSender over AzureServiceBusBackend against the emulator, with injected faults.

Every in-doubt fault must end with each business message in the queue exactly
once; a refusal must not be retried; a fault that outlives the window deadline
must raise InDoubtError naming the message.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _emulator_helpers import EVENTS, ORDERS, SHORT_WINDOW, FakeTime

from sendonce import (
    IdempotentSender,
    InDoubtError,
    Message,
    PermanentSendError,
    RetryPolicy,
)
from sendonce.backends import AzureServiceBusBackend, connect
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator, Fault, FaultAction

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


@pytest.fixture
def backend(emulator: Emulator) -> Iterator[AzureServiceBusBackend]:
    b = AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles={"orders": ORDERS, "short": SHORT_WINDOW}
    )
    yield b
    b.close()


def policy(fake_time: FakeTime, **options: object) -> RetryPolicy:
    defaults: dict[str, object] = {"max_attempts": 5, "attempt_timeout": 5.0, "jitter": False}
    defaults.update(options)
    return RetryPolicy(sleep=fake_time.sleep, clock=fake_time.clock, **defaults)  # type: ignore[arg-type]


def orders(n: int, prefix: str = "order") -> list[Message]:
    return [Message(f"body {i}", message_id=f"{prefix}-{i}") for i in range(n)]


def test_plain_sends_and_batches(
    backend: AzureServiceBusBackend, store: LocalBackend, fake_time: FakeTime
) -> None:
    with IdempotentSender(backend, "orders", retry=policy(fake_time)) as sender:
        result = sender.send(Message("one", message_id="a-1"))
        report = sender.send_many(orders(20))
    assert result.outcome == "sent" and result.attempts == 1
    assert report.sent == 20 and report.failed == 0
    assert store.message_ids("orders") == ["a-1", *[f"order-{i}" for i in range(20)]]


@pytest.mark.parametrize(
    "action",
    [
        FaultAction.DROP_AFTER_COMMIT,
        FaultAction.DETACH_AFTER_COMMIT,
        FaultAction.WITHHOLD,
        FaultAction.SERVER_BUSY,
        FaultAction.DROP_BEFORE_COMMIT,
    ],
)
def test_each_fault_ends_with_every_message_exactly_once(
    emulator: Emulator,
    backend: AzureServiceBusBackend,
    store: LocalBackend,
    fake_time: FakeTime,
    action: FaultAction,
) -> None:
    messages = orders(6)
    emulator.faults.add(Fault(action, entity="orders"))  # strikes the first transfer
    retry = policy(fake_time, attempt_timeout=1.0)  # a withheld disposition costs 1 s
    with IdempotentSender(backend, "orders", retry=retry) as sender:
        single = sender.send(messages[0])
        emulator.faults.add(Fault(action, entity="orders"))  # and the first batch
        report = sender.send_many(messages[1:])
    assert single.attempts == 2
    assert report.failed == 0 and report.sent + report.duplicates == 5
    assert emulator.faults.pending == 0
    assert store.message_ids("orders") == [m.message_id for m in messages]


@pytest.mark.parametrize(
    "action",
    [
        FaultAction.DROP_AFTER_COMMIT,
        FaultAction.DETACH_AFTER_COMMIT,
        FaultAction.WITHHOLD,
        FaultAction.SERVER_BUSY,
    ],
)
def test_schedule_survives_each_fault(
    emulator: Emulator,
    backend: AzureServiceBusBackend,
    store: LocalBackend,
    fake_time: FakeTime,
    action: FaultAction,
) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    emulator.faults.add(Fault(action, operation="schedule"))
    withheld = action is FaultAction.WITHHOLD
    # A withheld answer costs the attempt timeout: 1 s there; elsewhere one no loaded machine
    # reaches. After a 1 s attempt withheld, a busy machine may time out another one.
    retry = policy(fake_time, attempt_timeout=1.0 if withheld else 60.0, max_attempts=30)
    with IdempotentSender(backend, "orders", retry=retry) as sender:
        result = sender.schedule(Message("later", message_id="sch-1"), at)
    assert result.outcome == "scheduled"
    assert result.attempts >= 2 if withheld else result.attempts == 2
    assert store.message_ids("orders") == ["sch-1"]
    (stored,) = store.peek("orders", max_messages=5)
    assert stored.scheduled_enqueue_time is not None
    assert abs(stored.scheduled_enqueue_time - at) < timedelta(milliseconds=1)


def test_topic_sends_reach_every_subscription_once(
    emulator: Emulator, store: LocalBackend, fake_time: FakeTime
) -> None:
    backend = AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles={"events": EVENTS}
    )
    emulator.faults.add(Fault(FaultAction.DROP_AFTER_COMMIT, entity="events"))
    with backend, IdempotentSender(backend, "events", retry=policy(fake_time)) as sender:
        report = sender.send_many(orders(4, "evt"))
    assert report.failed == 0
    expected = [f"evt-{i}" for i in range(4)]
    assert store.message_ids("events", subscription="a") == expected
    assert store.message_ids("events", subscription="b") == expected


def test_unauthorized_is_permanent_and_not_retried(
    emulator: Emulator, backend: AzureServiceBusBackend, store: LocalBackend, fake_time: FakeTime
) -> None:
    emulator.faults.add(FaultAction.UNAUTHORIZED)
    sender = IdempotentSender(backend, "orders", retry=policy(fake_time))
    with sender, pytest.raises(PermanentSendError) as info:
        sender.send(Message("x", message_id="u-1"))
    assert info.value.message_id == "u-1"
    assert emulator.transfers("orders") == 1  # no retry reached the broker
    assert fake_time.slept == []
    assert store.message_ids("orders") == []


def test_fault_outliving_the_window_raises_in_doubt(
    emulator: Emulator, backend: AzureServiceBusBackend, store: LocalBackend, fake_time: FakeTime
) -> None:
    # window 20 s - margin 5 s = 15 s of retrying; each (fake) backoff costs 8 s
    emulator.faults.add(*[Fault(FaultAction.DROP_AFTER_COMMIT, entity="short")] * 10)
    retry = policy(fake_time, max_attempts=10, initial_backoff=8.0, max_backoff=8.0)
    sender = IdempotentSender(backend, "short", retry=retry)
    with sender, pytest.raises(InDoubtError) as info:
        sender.send(Message("x", message_id="late-1"))
    error = info.value
    assert error.message_id == "late-1"
    assert error.attempts == emulator.transfers("short") == 2
    assert store.message_ids("short") == ["late-1"]  # it did land: in doubt, not lost


def test_connect_url_and_local_backend_share_the_id_space(
    emulator: Emulator, broker_path: Path, fake_time: FakeTime
) -> None:
    """The same ids through local:// and through the emulator land once in total."""
    ids = [f"shared-{i}" for i in range(10)]
    local_url = f"local://{broker_path}"
    with IdempotentSender(local_url, "orders", retry=policy(fake_time)) as sender:
        first = sender.send_many([Message("v", message_id=i) for i in ids[:6]])
    assert first.sent == 6
    remote = connect(emulator.connection_string, profiles={"orders": ORDERS})
    with IdempotentSender(remote, "orders", retry=policy(fake_time)) as sender:
        second = sender.send_many([Message("v", message_id=i) for i in ids])
    remote.close()
    assert second.failed == 0  # Service Bus reports duplicates as accepted
    with LocalBackend(broker_path) as store:
        assert store.message_ids("orders") == ids
        again = store.send("orders", [Message("v", message_id=i) for i in ids[6:]], timeout=5)
    assert [a.outcome for a in again] == ["duplicate"] * 4


def test_concurrent_producers_with_overlapping_ids_store_each_once(
    emulator: Emulator, store: LocalBackend
) -> None:
    """Two producers (as two Spark task attempts would) send the same ids at once."""
    ids = [f"dup-{i}" for i in range(40)]
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            backend = AzureServiceBusBackend.from_connection_string(
                emulator.connection_string, profiles={"orders": ORDERS}
            )
            with backend, IdempotentSender(backend, "orders") as sender:
                for i in ids:
                    sender.send(Message("same body", message_id=i))
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=produce) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert store.message_ids("orders") == ids
