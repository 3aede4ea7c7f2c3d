"""Transfers in flight (sync): several at once over the real local broker, order per key kept.

The broker is wrapped by :class:`Overlap`, which holds each transfer until a number of
them are inside the broker at once: a sender that sends one at a time can never get
there (the test then fails), and no timing is measured.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sendonce import (
    ConfigurationError,
    EntityProfile,
    IdempotentSender,
    InDoubtError,
    Message,
    PermanentSendError,
    RetryPolicy,
)
from sendonce.backends import LocalBackend
from sendonce.testing import Fault, FaultyBackend

PARTITIONED = EntityProfile("orders", partitioned=True)  # with duplicate detection
PLAIN = EntityProfile("plain")


class Overlap:
    """A broker that proves transfers overlap and that no key is in flight twice.

    Each transfer waits (up to ``patience`` s) until ``parties`` transfers have been
    inside at once; after that, transfers pass straight through.
    """

    def __init__(self, inner: Any, parties: int, patience: float = 10.0) -> None:
        self.inner = inner
        self.parties = parties
        self.patience = patience
        self.reached = threading.Event()
        self._lock = threading.Lock()
        self.inside: Counter[object] = Counter()
        self.now = 0
        self.peak = 0
        self.overlapping_keys: list[object] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _enter(self, messages: Sequence[Message]) -> object:
        first = messages[0]
        key = (first.partition_key, first.session_id)
        with self._lock:
            if key != (None, None) and self.inside[key]:
                self.overlapping_keys.append(key)
            self.inside[key] += 1
            self.now += 1
            self.peak = max(self.peak, self.now)
            if self.now >= self.parties:
                self.reached.set()
        self.reached.wait(self.patience)
        return key

    def _leave(self, key: object) -> None:
        with self._lock:
            self.inside[key] -= 1
            self.now -= 1

    def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> Any:
        key = self._enter(messages)
        try:
            return self.inner.send(entity, messages, **kw)
        finally:
            self._leave(key)

    def schedule(self, entity: str, messages: Sequence[Message], at: Any, **kw: Any) -> Any:
        key = self._enter(messages)
        try:
            return self.inner.schedule(entity, messages, at, **kw)
        finally:
            self._leave(key)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBackend]:
    with LocalBackend(tmp_path / "broker.db") as backend:
        yield backend


@pytest.fixture
def retry() -> RetryPolicy:
    return RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)


def keyed(count: int, keys: int) -> list[Message]:
    return [
        Message(f"body {i}", message_id=f"order-{i}", partition_key=f"customer-{i % keys}")
        for i in range(count)
    ]


def per_key(ids: Sequence[str], messages: Sequence[Message]) -> dict[str | None, list[str]]:
    key_of = {m.message_id: m.partition_key for m in messages}
    lanes: dict[str | None, list[str]] = defaultdict(list)
    for message_id in ids:
        lanes[key_of[message_id]].append(message_id)
    return dict(lanes)


def test_a_partitioned_dedup_entity_has_several_transfers_in_flight_in_order_per_key(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    """One message per transfer there: 16 keys run side by side, each key in input order."""
    overlap = Overlap(broker, parties=4)
    messages = keyed(80, keys=16)
    with IdempotentSender(overlap, PARTITIONED, retry=retry, max_in_flight=8) as sender:
        report = sender.send_many(messages)
    assert overlap.reached.is_set() and overlap.peak <= 8
    assert overlap.overlapping_keys == []
    assert report.sent == 80 and report.failed == 0
    assert [r.message_id for r in report.results] == [m.message_id for m in messages]
    stored = broker.message_ids("orders")
    assert Counter(stored) == Counter(m.message_id for m in messages)
    assert per_key(stored, messages) == per_key([m.message_id for m in messages], messages)


def test_unkeyed_transfers_on_a_plain_entity_run_side_by_side(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    overlap = Overlap(broker, parties=3)
    messages = [Message(f"body {i}", message_id=f"order-{i}") for i in range(60)]
    with IdempotentSender(
        overlap, PLAIN, retry=retry, max_in_flight=4, max_batch_messages=5
    ) as sender:
        report = sender.send_many(messages)
    assert overlap.reached.is_set() and overlap.peak <= 4
    assert report.sent == 60
    assert [r.message_id for r in report.results] == [m.message_id for m in messages]
    assert sorted(broker.message_ids("plain")) == sorted(m.message_id for m in messages)


def test_the_default_limit_is_the_backends(broker: LocalBackend, retry: RetryPolicy) -> None:
    class Wide(Overlap):
        max_in_flight = 6

    overlap = Wide(broker, parties=6)
    with IdempotentSender(overlap, PARTITIONED, retry=retry) as sender:
        assert sender.max_in_flight == 6
        assert sender.send_many(keyed(24, keys=12)).sent == 24
    assert overlap.reached.is_set() and overlap.peak <= 6
    with IdempotentSender(broker, PARTITIONED, retry=retry) as sender:
        assert sender.max_in_flight == 1  # a backend that says nothing: one at a time


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_a_bad_max_in_flight_names_the_field(broker: LocalBackend, bad: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        IdempotentSender(broker, PLAIN, max_in_flight=bad)  # type: ignore[arg-type]
    assert raised.value.field == "max_in_flight"
    assert broker.entities() == []  # refused before the entity was even created


def test_concurrent_sends_from_threads_overlap_but_never_on_one_key(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    """8 threads on one sender: no sender-wide lock across a transfer; one key at a time."""
    overlap = Overlap(broker, parties=4)
    messages = keyed(64, keys=4)
    sender = IdempotentSender(overlap, PARTITIONED, retry=retry)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(part: list[Message]) -> None:
        for message in part:
            result = sender.send(message)
            with lock:
                outcomes.append(result.outcome)

    threads = [threading.Thread(target=worker, args=(messages[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sender.close()
    assert overlap.reached.is_set()
    assert overlap.overlapping_keys == []
    assert outcomes == ["sent"] * 64
    assert Counter(broker.message_ids("orders")) == Counter(m.message_id for m in messages)


def test_two_senders_on_one_backend_share_the_key_order(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    overlap = Overlap(broker, parties=2)
    first = IdempotentSender(overlap, PARTITIONED, retry=retry, max_in_flight=4)
    second = IdempotentSender(overlap, PARTITIONED, retry=retry, max_in_flight=4)
    messages = keyed(40, keys=2)
    threads = [
        threading.Thread(target=first.send_many, args=(messages[:20],)),
        threading.Thread(target=second.send_many, args=(messages[20:],)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlap.overlapping_keys == []
    assert Counter(broker.message_ids("orders")) == Counter(m.message_id for m in messages)


def test_faults_on_some_lanes_leave_every_message_once_and_the_report_in_input_order(
    broker: LocalBackend, retry: RetryPolicy
) -> None:
    """Ack lost, dropped before commit, refused: per transfer, while others are in flight."""
    first_try: set[str] = set()
    plan = {"order-3": Fault.AFTER_COMMIT, "order-8": Fault.BEFORE_COMMIT}

    def script(index: int, entity: str, messages: Sequence[Message]) -> Fault:
        message_id = messages[0].message_id
        if message_id == "order-13":
            return Fault.PERMANENT
        if message_id in plan and message_id not in first_try:
            first_try.add(message_id)
            return plan[message_id]
        return Fault.NONE

    faulty = FaultyBackend(Overlap(broker, parties=4), script)
    messages = keyed(32, keys=8)
    with IdempotentSender(faulty, PARTITIONED, retry=retry, max_in_flight=8) as sender:
        report = sender.send_many(messages)
    assert report.sent == 31 and report.failed == 1
    assert isinstance(report.failures[0].error, PermanentSendError)
    assert report.failures[0].message_id == "order-13"
    expected = [m.message_id for m in messages if m.message_id != "order-13"]
    assert [r.message_id for r in report.results] == expected
    stored = broker.message_ids("orders")
    assert Counter(stored) == Counter(expected)
    assert per_key(stored, messages) == per_key(expected, messages)


def test_in_doubt_on_one_lane_is_reported_while_the_others_are_sent(
    broker: LocalBackend,
) -> None:
    retry = RetryPolicy(max_attempts=2, initial_backoff=0, jitter=False, sleep=lambda s: None)

    def script(index: int, entity: str, messages: Sequence[Message]) -> Fault:
        return Fault.AFTER_COMMIT if messages[0].message_id == "order-5" else Fault.NONE

    faulty = FaultyBackend(broker, script)
    messages = keyed(20, keys=10)
    with IdempotentSender(faulty, PARTITIONED, retry=retry, max_in_flight=8) as sender:
        report = sender.send_many(messages)
    assert report.in_doubt == ["order-5"]
    assert isinstance(report.failures[0].error, InDoubtError)
    assert report.sent == 19
    assert Counter(broker.message_ids("orders")) == Counter(m.message_id for m in messages)
