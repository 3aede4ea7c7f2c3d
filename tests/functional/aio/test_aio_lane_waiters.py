"""Many asyncio callers waiting for the backend's links: order, cancellation, timeouts.

The real azure-servicebus aio client sends to the emulator. A withheld acknowledgement
(the broker stores the message and never answers) keeps a link busy until the attempt
times out, so that the other callers queue for a link meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sendonce import EntityProfile, Message, RetryPolicy, aio
from sendonce.backends.local import LocalBackend
from sendonce.backends.servicebus._lanes import AsyncLanes
from sendonce.errors import AttemptNotSentError, TransientSendError, ValidationError

pytest.importorskip("proton")

from sendonce.emulator import Emulator, Fault, FaultAction

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

WINDOW = timedelta(minutes=5)
PARTS = EntityProfile("parts", partitioned=True, duplicate_detection_window=WINDOW)
ORDERS = EntityProfile("orders", duplicate_detection_window=WINDOW)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[Emulator, LocalBackend]]:
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        store.create_entity(PARTS)
        store.create_entity(ORDERS)
        with Emulator(path, poll_interval=0.02) as emulator:
            yield emulator, store


def policy(attempt_timeout: float = 1.5, max_attempts: int = 6) -> RetryPolicy:
    return RetryPolicy(
        initial_backoff=0.01,
        max_backoff=0.05,
        jitter=False,
        attempt_timeout=attempt_timeout,
        max_attempts=max_attempts,
    )


# A caller waits for a link at most its attempt timeout, then its attempt is retried. The
# withheld acknowledgement holds a link for the holder's attempt timeout (short, so the tests
# are quick); the callers that must get a link in the end are given attempts (or a timeout)
# that outlast any queue a loaded 2-core machine builds: their verdict never hangs on the load.
PATIENT = RetryPolicy(initial_backoff=0.01, max_backoff=0.05, jitter=False, attempt_timeout=60)


async def queued(backend: aio.AzureServiceBusBackend, entity: str, waiters: int) -> None:
    """Wait until ``waiters`` callers wait for a link to ``entity`` (the event, not a clock)."""
    lanes = backend._entity_lanes(entity, backend.connection_sharing)  # sends' lanes
    deadline = time.monotonic() + 60
    while len(lanes._waiters) < waiters:
        assert time.monotonic() < deadline, f"{len(lanes._waiters)} of {waiters} callers queued"
        await asyncio.sleep(0.01)


def backend_for(emulator: Emulator, lanes: int) -> aio.AzureServiceBusBackend:
    return aio.AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles={"parts": PARTS, "orders": ORDERS}, max_in_flight=lanes
    )


async def stored(store: LocalBackend, entity: str, message_id: str) -> None:
    """Wait until the broker holds ``message_id`` (the withheld transfer is in)."""
    deadline = time.monotonic() + 60
    while message_id not in store.message_ids(entity):
        assert time.monotonic() < deadline, f"{message_id} never arrived"
        await asyncio.sleep(0.02)


def test_many_waiters_keep_each_keys_call_order(broker: tuple[Emulator, LocalBackend]) -> None:
    emulator, store = broker
    # 150 callers, 3 keys, 2 links: almost every caller waits, for its key or for a link
    sent = [
        Message(f"body {i}", message_id=f"k{i % 3}-{i}", partition_key=f"k{i % 3}")
        for i in range(150)
    ]
    emulator.faults.add(Fault(FaultAction.WITHHOLD, entity="parts"))  # the queue builds up

    async def main() -> list[Any]:
        async with (
            backend_for(emulator, 2) as backend,
            # 60 attempts: a caller far down the queue may wait out many 1.5 s attempts when
            # the machine is busy (each one's wait ends with "stayed busy" and a retry)
            aio.IdempotentSender(backend, PARTS, retry=policy(max_attempts=60)) as sender,
        ):
            return await asyncio.gather(*(sender.send(m) for m in sent))

    results = asyncio.run(main())
    assert [r.message_id for r in results] == [m.message_id for m in sent]
    assert emulator.faults.pending == 0
    ids = store.message_ids("parts")
    assert Counter(ids) == {m.message_id: 1 for m in sent}  # each exactly once
    for key in ("k0", "k1", "k2"):
        order = [int(i.split("-")[1]) for i in ids if i.startswith(key)]
        assert order == sorted(order), f"{key} stored out of call order: {order}"


def test_a_cancelled_waiter_raises_sends_nothing_and_passes_its_turn_on(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    first, *waiting = [Message(f"body {i}", message_id=f"w-{i}") for i in range(6)]
    emulator.faults.add(Fault(FaultAction.WITHHOLD, entity="orders"))  # holds the one link

    async def main() -> tuple[list[Any], Any]:
        async with (
            backend_for(emulator, 1) as backend,
            aio.IdempotentSender(backend, ORDERS, retry=policy()) as holding,
            aio.IdempotentSender(backend, ORDERS, retry=PATIENT) as sender,
        ):
            holder = asyncio.ensure_future(holding.send(first))
            await stored(store, "orders", first.message_id)  # the link is busy now
            waiters = [asyncio.ensure_future(sender.send(m)) for m in waiting]
            await queued(backend, "orders", len(waiters))  # every waiter queued for the link
            waiters[1].cancel()
            waiters[3].cancel()
            outcomes = await asyncio.gather(holder, *waiters, return_exceptions=True)
            after = await sender.send(Message("after", message_id="w-after"))
            return outcomes, after

    outcomes, after = asyncio.run(main())
    cancelled = {waiting[1].message_id, waiting[3].message_id}
    for message, outcome in zip([first, *waiting], outcomes, strict=True):
        if message.message_id in cancelled:
            assert isinstance(outcome, asyncio.CancelledError)
        else:
            assert not isinstance(outcome, BaseException), outcome
            assert outcome.message_id == message.message_id
    assert after.outcome == "sent"  # the cancelled waiters kept no link
    expected = {m.message_id for m in [first, *waiting]} - cancelled | {"w-after"}
    assert Counter(store.message_ids("orders")) == dict.fromkeys(expected, 1)


def test_a_caller_whose_timeout_passes_while_waiting_for_a_link_is_not_sent(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    first = Message("first", message_id="t-first")
    late = Message("late", message_id="t-late")
    emulator.faults.add(Fault(FaultAction.WITHHOLD, entity="orders"))

    async def main() -> tuple[BaseException | None, list[Any]]:
        async with backend_for(emulator, 1) as backend:
            # 10 s: the late caller's 0.2 s wait must end while the link is still held, however
            # long a loaded machine took to open the link and store the first message
            holder = asyncio.ensure_future(backend.send("orders", [first], timeout=10))
            await stored(store, "orders", first.message_id)
            error = None
            try:
                await backend.send("orders", [late], timeout=0.2)
            except AttemptNotSentError as exc:
                error = exc
            with pytest.raises(TransientSendError):  # the withheld ack: in doubt
                await holder
            acks = await backend.send("orders", [late], timeout=60)  # the link is free again
            return error, acks

    error, acks = asyncio.run(main())
    assert isinstance(error, AttemptNotSentError)
    assert error.message_id == "t-late"
    assert "busy" in str(error) and "nothing was sent" in str(error)
    assert [a.outcome for a in acks] == ["accepted"]
    assert Counter(store.message_ids("orders")) == {"t-first": 1, "t-late": 1}


def test_a_sender_retries_a_caller_that_waited_past_its_attempt_timeout(
    broker: tuple[Emulator, LocalBackend], caplog: pytest.LogCaptureFixture
) -> None:
    emulator, store = broker
    first = Message("first", message_id="r-first")
    waiting = [Message(f"body {i}", message_id=f"r-{i}") for i in range(3)]
    # the withheld ack holds the single link for the holder's whole 4 s attempt, so the
    # others' 1 s attempts run out while they wait for it, and are retried; 1 s, not less:
    # opening the next link (CBS token and attach) took over 0.3 s on a loaded CI machine,
    # so 0.3 s attempts timed out opening it, every time
    emulator.faults.add(Fault(FaultAction.WITHHOLD, entity="orders"))
    patient = RetryPolicy(initial_backoff=0.01, max_backoff=0.05, jitter=False, attempt_timeout=4)
    hasty = RetryPolicy(
        initial_backoff=0.01, max_backoff=0.05, jitter=False, attempt_timeout=1.0, max_attempts=60
    )

    async def main() -> list[Any]:
        async with (
            backend_for(emulator, 1) as backend,
            aio.IdempotentSender(backend, ORDERS, retry=patient) as holder,
            aio.IdempotentSender(backend, ORDERS, retry=hasty) as sender,
        ):
            held = asyncio.ensure_future(holder.send(first))
            await stored(store, "orders", first.message_id)  # the link is busy now
            results = await asyncio.gather(*(sender.send(m) for m in waiting))
            return [await held, *results]

    with caplog.at_level(logging.INFO, logger="sendonce.retry"):
        results = asyncio.run(main())
    assert [r.message_id for r in results] == [m.message_id for m in [first, *waiting]]
    assert all(r.outcome == "sent" for r in results)
    assert any("stayed busy" in r.getMessage() for r in caplog.records)  # they did wait
    assert emulator.faults.pending == 0
    expected = {m.message_id: 1 for m in [first, *waiting]}
    assert Counter(store.message_ids("orders")) == expected


def test_a_lane_handed_over_as_its_waiter_is_cancelled_goes_to_the_next() -> None:
    async def main() -> tuple[bool, bool]:
        lanes: AsyncLanes[object] = AsyncLanes(1)
        assert (await lanes.take(1.0))[1]
        second = asyncio.ensure_future(lanes.take(5.0))
        third = asyncio.ensure_future(lanes.take(5.0))
        await asyncio.sleep(0)  # both queued
        lanes.cancel()  # the lane goes to the second waiter...
        second.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await second
        got = (await asyncio.wait_for(third, 5))[1]
        timed_out = not (await lanes.take(0.01))[1]  # one lane, held by the third
        return got, timed_out

    got, timed_out = asyncio.run(main())
    assert got and timed_out


def test_a_message_the_client_refuses_is_refused_before_a_link_is_opened(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker

    async def main() -> ValidationError:
        async with backend_for(emulator, 2) as backend:
            with pytest.raises(ValidationError) as info:
                await backend.send("orders", [{"body": "x"}], timeout=5)  # type: ignore[list-item]
            assert emulator.open_connections == 0  # no lane opened a link for it
            return info.value

    error = asyncio.run(main())
    assert error.field == "messages"
    assert store.message_ids("orders") == []
