"""Several transfers in flight through the real azure-servicebus client, sync and aio.

The backend lends up to ``max_in_flight`` sender links at once; the sender keeps one
transfer per partition key in flight. Faults strike one lane while the others carry
transfers: a link detached after the broker stored the message, an acknowledgement
that never comes, a connection dropped. Each business message must end up stored
exactly once, and the messages of one key in input order (the broker file is read
back in sequence order).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _emulator_helpers import emulated

from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy, aio
from sendonce.backends.local import LocalBackend
from sendonce.backends.servicebus import AzureServiceBusBackend

pytest.importorskip("proton")

from sendonce.emulator import Emulator, Fault, FaultAction

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(180)]

PARTS = EntityProfile("parts", partitioned=True, duplicate_detection_window=timedelta(minutes=5))
ORDERS = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=5))
KEYS = 6
LANES = 4


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[Emulator, LocalBackend]]:
    with emulated(tmp_path, PARTS, ORDERS) as both:
        yield both


def keyed(n: int, tag: str = "m") -> list[Message]:
    return [
        Message(f"body {i}", message_id=f"{tag}{i % KEYS}-{i}", partition_key=f"k{i % KEYS}")
        for i in range(n)
    ]


def policy() -> RetryPolicy:
    # A withheld ack holds a lane for the 1.5 s attempt; a caller waits for a lane at most one
    # attempt, then retries. 60 attempts: on a busy machine a caller far down the queue may wait
    # out many (each "stayed busy", nothing sent); its verdict must not hang on the load.
    return RetryPolicy(
        initial_backoff=0.01, max_backoff=0.05, jitter=False, attempt_timeout=1.5, max_attempts=60
    )


def faults_among_lanes(emulator: Emulator, entity: str) -> None:
    """Let the lanes fill, then fail one transfer at a time while the others are in flight."""
    emulator.faults.add(
        *[Fault(FaultAction.NONE, entity=entity)] * 8,
        Fault(FaultAction.DETACH_AFTER_COMMIT, entity=entity),
        *[Fault(FaultAction.NONE, entity=entity)] * 6,
        Fault(FaultAction.WITHHOLD, entity=entity),  # stored, the ack never comes
        *[Fault(FaultAction.NONE, entity=entity)] * 6,
        Fault(FaultAction.DROP_AFTER_COMMIT, entity=entity),
        *[Fault(FaultAction.NONE, entity=entity)] * 4,
        Fault(FaultAction.DROP_BEFORE_COMMIT, entity=entity),
    )


def lanes_were_open_at_once(emulator: Emulator, backend: Any = None) -> bool:
    """Several lanes open together: links on the process's one shared connection (sharing
    on), else one client connection per lane (one link each)."""
    if backend is not None and backend.connection_sharing:
        from sendonce.backends.servicebus._connection import registered

        [shared] = registered()
        return emulator.open_connections == 1 and len(shared._links) > 1
    return emulator.open_connections > 1


def all_links_closed(emulator: Emulator) -> bool:
    """Every lane closed (the broker sees the connections go, a moment later)."""
    import time

    deadline = time.monotonic() + 60
    while emulator.open_connections and time.monotonic() < deadline:
        time.sleep(0.02)
    return emulator.open_connections == 0


def assert_once_and_in_key_order(store: LocalBackend, entity: str, sent: list[Message]) -> None:
    stored = store.message_ids(entity)
    assert Counter(stored) == Counter(m.message_id for m in sent)  # each exactly once
    by_key: dict[str, list[int]] = {}
    for message_id in stored:
        key, index = message_id.split("-")
        by_key.setdefault(key, []).append(int(index))
    for key, indexes in by_key.items():
        assert indexes == sorted(indexes), f"key {key} stored out of input order: {indexes}"


@pytest.mark.parametrize("sharing", [True, False], ids=["shared", "per-lane"])
def test_sync_send_many_with_lanes_in_flight_survives_faults_on_one_lane(
    broker: tuple[Emulator, LocalBackend], sharing: bool
) -> None:
    emulator, store = broker
    sent = keyed(90)
    faults_among_lanes(emulator, "parts")
    with (
        AzureServiceBusBackend.from_connection_string(
            emulator.connection_string,
            profiles={"parts": PARTS},
            max_in_flight=LANES,
            connection_sharing=sharing,
        ) as backend,
        IdempotentSender(backend, PARTS, retry=policy()) as sender,
    ):
        report = sender.send_many(sent)
        assert lanes_were_open_at_once(emulator, backend)
    assert all_links_closed(emulator)  # closing the backend closed every lane
    assert report.failed == 0, report.failures
    assert report.sent + report.duplicates == len(sent)
    assert [r.message_id for r in report.results] == [m.message_id for m in sent]
    assert emulator.faults.pending == 0  # every fault struck
    assert_once_and_in_key_order(store, "parts", sent)


def test_aio_send_many_with_lanes_in_flight_survives_faults_on_one_lane(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    sent = keyed(90, "a")
    faults_among_lanes(emulator, "parts")

    async def main() -> Any:
        async with (
            aio.AzureServiceBusBackend.from_connection_string(
                emulator.connection_string, profiles={"parts": PARTS}, max_in_flight=LANES
            ) as backend,
            aio.IdempotentSender(backend, PARTS, retry=policy()) as sender,
        ):
            report = await sender.send_many(sent)
            assert lanes_were_open_at_once(emulator, backend)
            return report

    report = asyncio.run(main())
    assert all_links_closed(emulator)
    assert report.failed == 0, report.failures
    assert report.sent + report.duplicates == len(sent)
    assert [r.message_id for r in report.results] == [m.message_id for m in sent]
    assert emulator.faults.pending == 0
    assert_once_and_in_key_order(store, "parts", sent)


def test_concurrent_aio_sends_share_the_lanes_and_land_once(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    sent = [Message(f"body {i}", message_id=f"c-{i}") for i in range(60)]
    faults_among_lanes(emulator, "orders")

    async def main() -> list[Any]:
        async with (
            aio.AzureServiceBusBackend.from_connection_string(
                emulator.connection_string, profiles={"orders": ORDERS}, max_in_flight=LANES
            ) as backend,
            aio.IdempotentSender(backend, ORDERS, retry=policy()) as sender,
        ):
            results = await asyncio.gather(*(sender.send(m) for m in sent))
            assert lanes_were_open_at_once(emulator, backend)
            return results

    results = asyncio.run(main())
    assert all_links_closed(emulator)
    assert [r.message_id for r in results] == [m.message_id for m in sent]
    assert emulator.faults.pending == 0
    assert Counter(store.message_ids("orders")) == {m.message_id: 1 for m in sent}


@pytest.mark.parametrize("sharing", [True, False], ids=["shared", "per-lane"])
def test_threads_share_one_sync_backend_and_land_once(
    broker: tuple[Emulator, LocalBackend], sharing: bool
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    emulator, store = broker
    sent = [Message(f"body {i}", message_id=f"t-{i}") for i in range(60)]
    faults_among_lanes(emulator, "orders")
    with (
        AzureServiceBusBackend.from_connection_string(
            emulator.connection_string,
            profiles={"orders": ORDERS},
            max_in_flight=LANES,
            connection_sharing=sharing,
        ) as backend,
        IdempotentSender(backend, ORDERS, retry=policy()) as sender,
        ThreadPoolExecutor(8) as pool,
    ):
        results = list(pool.map(sender.send, sent))
        assert lanes_were_open_at_once(emulator, backend)
    assert all_links_closed(emulator)
    assert [r.message_id for r in results] == [m.message_id for m in sent]
    assert emulator.faults.pending == 0
    assert Counter(store.message_ids("orders")) == {m.message_id: 1 for m in sent}


def test_concurrent_schedules_use_the_lanes_and_are_stored_once(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    from datetime import UTC, datetime

    emulator, store = broker
    at = datetime.now(UTC) + timedelta(hours=1)
    sent = [Message(f"later {i}", message_id=f"s-{i}") for i in range(24)]
    emulator.faults.add(
        *[Fault(FaultAction.NONE, entity="orders", operation="schedule")] * 6,
        Fault(FaultAction.DROP_AFTER_COMMIT, entity="orders", operation="schedule"),
    )

    async def main() -> list[Any]:
        async with (
            aio.AzureServiceBusBackend.from_connection_string(
                emulator.connection_string, profiles={"orders": ORDERS}, max_in_flight=LANES
            ) as backend,
            aio.IdempotentSender(backend, ORDERS, retry=policy()) as sender,
        ):
            results = await asyncio.gather(*(sender.schedule(m, at) for m in sent))
            assert lanes_were_open_at_once(emulator)
            return results

    results = asyncio.run(main())
    assert all(r.outcome == "scheduled" for r in results)
    assert emulator.faults.pending == 0
    assert Counter(store.message_ids("orders")) == {m.message_id: 1 for m in sent}
    assert store.count("orders") == 0  # all scheduled for later
