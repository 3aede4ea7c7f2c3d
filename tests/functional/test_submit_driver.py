"""The engine drives transfers through a backend's native ``submit`` (docs/engine.md).

Over a backend whose ``submit`` hands a transfer to one I/O thread and returns a future,
a call with 16 transfers in flight has one thread of its own, the one that submits (a
backend without one gets a thread per transfer in flight: the control proving the count
can fail); a key still has one transfer in
flight at a time, in input order; a transfer whose first attempt fails is retried with the
same ids and lands once; a Ctrl-C cancels what the backend has not written (nothing
stored) and lets the written one end; and a property test runs input shapes x faults
through the streamed path and checks each message against the real broker file.

Real peers: the local broker (a SQLite file) behind the I/O thread; faults injected by
``sendonce.testing.FaultyBackend`` (what no real broker does on demand).
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _interrupts import sigint_default
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends import Ack, Backend, Capabilities, LocalBackend, capabilities_of
from sendonce.errors import PermanentSendError
from sendonce.ledger import InDoubtRule, Ledger
from sendonce.testing import Fault, FaultyBackend

PARTITIONED = EntityProfile("orders", partitioned=True)
QUICK = RetryPolicy(sleep=lambda _: None, initial_backoff=0, jitter=False)


class Looped(Backend):
    """A backend with a native ``submit``: every transfer is a future that one I/O thread
    completes (as Artemis' event loop does); ``send`` waits on its own submission.

    It notes the threads alive at each submission that were not alive when it was made
    (a thread another test of the same worker left behind is not this call's), how many
    transfers are outstanding (most at once, and per key), and holds the first transfer
    until ``hold_until`` transfers are outstanding when that is set."""

    capabilities = Capabilities(max_in_flight=16, messaging_system="looped", native_submit=True)

    def __init__(self, inner: Backend, *, hold_until: int | None = None) -> None:
        self.inner = inner
        self.hold_until = hold_until
        self.full = threading.Event()
        self.release = threading.Event()
        self.holding = threading.Event()
        self.futures: list[Future[list[Ack]]] = []
        self.threads: set[str] = set()
        self._preexisting = set(threading.enumerate())  # other tests' leftovers
        self.outstanding = 0
        self.most = 0
        self.keys: Counter[str | None] = Counter()
        self.overlap: list[str | None] = []  # keys seen with two transfers outstanding
        self.order: dict[str | None, list[str]] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._io = threading.Thread(target=self._loop, name="looped-io", daemon=True)
        self._io.start()

    def submit(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> Future[list[Ack]]:
        future: Future[list[Ack]] = Future()
        key = messages[0].partition_key
        with self._lock:
            self.threads.update(
                t.name for t in threading.enumerate() if t not in self._preexisting
            )
            self.futures.append(future)
            self.outstanding += 1
            self.most = max(self.most, self.outstanding)
            self.keys[key] += 1
            if key is not None and self.keys[key] > 1:
                self.overlap.append(key)
            self.order.setdefault(key, []).extend(m.message_id for m in messages)
            full = self.hold_until is not None and self.outstanding >= self.hold_until
        future.add_done_callback(lambda _: self._ended(key))
        self._queue.put((future, entity, messages, timeout))
        if full:
            self.full.set()
        return future

    def _ended(self, key: str | None) -> None:
        with self._lock:
            self.outstanding -= 1
            self.keys[key] -= 1

    def _loop(self) -> None:
        first = True
        while (item := self._queue.get()) is not None:
            future, entity, messages, timeout = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it was written: nothing sent
            if first and self.hold_until is not None:
                first = False
                self.holding.set()
                self.full.wait(60)
                self.release.wait(60)
            try:
                acks = self.inner.send(entity, messages, timeout=timeout)
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(acks)

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        return self.submit(entity, messages, timeout=timeout).result()

    def describe(self, entity: str) -> EntityProfile:
        return self.inner.describe(entity)

    def schedule(self, entity: str, messages: Sequence[Message], at: Any, *, timeout: float) -> Any:
        return self.inner.schedule(entity, messages, at, timeout=timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._io.join(10)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(tmp_path / "broker.db")
    backend.create_entity(PARTITIONED)
    yield backend
    backend.close()


def keyed(count: int, keys: int) -> list[Message]:
    return [
        Message(f"order {i}", message_id=f"order-{i}", partition_key=f"k{i % keys}")
        for i in range(count)
    ]


def engine_threads(names: set[str]) -> set[str]:
    """The threads the sender's engine makes (its pools are named ``sendonce...``)."""
    return {name for name in names if name.startswith("sendonce")}


def test_sixteen_transfers_in_flight_through_a_native_submit_cost_no_thread(
    local: LocalBackend,
) -> None:
    backend = Looped(local, hold_until=16)
    backend.release.set()  # hold the first transfer only until 16 are outstanding
    try:
        assert capabilities_of(backend).native_submit
        before = threading.active_count()
        with IdempotentSender(backend, PARTITIONED, max_batch_messages=1, max_in_flight=16) as s:
            report = s.send_many(keyed(200, 50))
        assert report.failed == 0
        assert backend.most == 16  # 16 transfers outstanding at once...
        # ...and one thread of the engine's: the call's submitting thread, not one each.
        assert engine_threads(backend.threads) == {"sendonce-call"}
        assert threading.active_count() <= before
        assert sorted(local.message_ids("orders")) == sorted(f"order-{i}" for i in range(200))
    finally:
        backend.close()


def test_a_backend_without_native_submit_gets_a_thread_per_transfer_in_flight(
    local: LocalBackend,
) -> None:
    """The control: the count above can fail (the adapter's threads are named alike)."""
    seen: set[str] = set()

    class Counted(FaultyBackend):
        def send(self, entity: str, messages: Sequence[Message], **kwargs: Any) -> list[Ack]:
            seen.update(t.name for t in threading.enumerate())
            return super().send(entity, messages, **kwargs)

    backend = Counted(local)
    with IdempotentSender(backend, PARTITIONED, max_batch_messages=1, max_in_flight=16) as s:
        assert s.send_many(keyed(64, 32)).failed == 0
    assert len(engine_threads(seen)) > 1


def test_a_key_has_one_transfer_outstanding_in_input_order(local: LocalBackend) -> None:
    backend = Looped(local)
    try:
        messages = keyed(300, 7)
        with IdempotentSender(backend, PARTITIONED, max_batch_messages=3, max_in_flight=8) as s:
            assert s.send_many(messages).failed == 0
        assert backend.overlap == []
        for key, ids in backend.order.items():
            assert ids == [m.message_id for m in messages if m.partition_key == key]
        assert backend.most > 1
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("fault", "in_doubt"), [(Fault.AFTER_COMMIT, True), (Fault.BEFORE_COMMIT, True)]
)
def test_a_failed_first_attempt_is_retried_with_the_same_ids_and_lands_once(
    local: LocalBackend, fault: Fault, in_doubt: bool
) -> None:
    faulty = FaultyBackend(local, [Fault.NONE, fault, Fault.NONE, fault])
    backend = Looped(faulty)
    try:
        with IdempotentSender(
            backend, PARTITIONED, max_batch_messages=5, max_in_flight=4, retry=QUICK
        ) as s:
            report = s.send_many(keyed(40, 4))
        assert report.failed == 0
        assert Counter(local.message_ids("orders")) == Counter(f"order-{i}" for i in range(40))
        retried = [r for r in report.results if r.attempts == 2]
        assert retried  # the faulted transfers, resent with the same ids
        failed_ids = {i for c in faulty.calls if c.fault is fault for i in c.message_ids}
        assert {r.message_id for r in retried} == failed_ids
    finally:
        backend.close()


def test_a_refused_transfer_is_reported_and_the_others_land(local: LocalBackend) -> None:
    faulty = FaultyBackend(local, [Fault.NONE, Fault.PERMANENT])
    backend = Looped(faulty)
    try:
        with IdempotentSender(backend, PARTITIONED, max_batch_messages=5, max_in_flight=4) as s:
            report = s.send_many(keyed(20, 4))
        refused = {i for c in faulty.calls if c.fault is Fault.PERMANENT for i in c.message_ids}
        assert {f.message_id for f in report.failures} == refused
        assert all(isinstance(f.error, PermanentSendError) for f in report.failures)
        stored = set(local.message_ids("orders"))
        assert stored == {f"order-{i}" for i in range(20)} - refused
    finally:
        backend.close()


@pytest.mark.parametrize("with_ledger", [False, True])
def test_ctrl_c_cancels_what_the_backend_has_not_written_and_frees_the_keys(
    local: LocalBackend, tmp_path: Path, with_ledger: bool
) -> None:
    backend = Looped(local, hold_until=4)
    messages = keyed(12, 4)
    interrupted = threading.Event()

    def interrupt() -> None:
        backend.holding.wait(60)
        backend.full.wait(60)  # four outstanding: one held on the I/O thread, three queued
        main = threading.main_thread().ident
        assert main is not None
        signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, where the call waits
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the engine cancels the three not yet written
            if sum(f.cancelled() for f in backend.futures) == 3:
                break
            time.sleep(0.01)
        interrupted.set()
        backend.release.set()

    try:
        ledger = Ledger(f"sqlite://{tmp_path / 'ledger.db'}") if with_ledger else None
        with IdempotentSender(
            backend, PARTITIONED, max_batch_messages=1, max_in_flight=4, ledger=ledger
        ) as s:
            helper = threading.Thread(target=interrupt)
            with sigint_default():
                helper.start()
                with pytest.raises(KeyboardInterrupt):
                    s.send_many(messages)
            helper.join(30)
            assert interrupted.is_set()
            cancelled = [f for f in backend.futures if f.cancelled()]
            assert len(cancelled) == 3
            assert len(local.message_ids("orders")) == 1  # only the written transfer landed
            if ledger is not None:  # the cancelled three were released, never left in doubt
                unconfirmed = ledger.keys_in_doubt("orders", InDoubtRule("none"))
                assert {u.key.message_id for u in unconfirmed} <= {"order-0"}
            # Every key's turn was given back: the whole call again lands each message once.
            backend.hold_until = None
            assert s.send_many(messages).failed == 0
        assert Counter(local.message_ids("orders")) == Counter(m.message_id for m in messages)
        if ledger is not None:
            assert ledger.keys_in_doubt("orders", InDoubtRule("none")) == []
            ledger.close()
    finally:
        backend.release.set()
        backend.close()


FAULTS = [Fault.NONE, Fault.BEFORE_COMMIT, Fault.AFTER_COMMIT, Fault.PERMANENT]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ids=st.lists(st.integers(0, 60), min_size=1, max_size=80),
    keys=st.sampled_from([0, 1, 3]),
    faults=st.dictionaries(st.integers(0, 60), st.sampled_from(FAULTS), max_size=10),
    shape=st.sampled_from(["list", "generator"]),
    batch=st.sampled_from([1, 3, 50]),
    in_flight=st.sampled_from([1, 4, 16]),
    budget=st.sampled_from([64, 3000, None]),
    ledger=st.booleans(),
)
def test_input_shapes_by_outcomes_over_the_streamed_native_path(
    tmp_path_factory: pytest.TempPathFactory,
    ids: list[int],
    keys: int,
    faults: dict[int, Fault],
    shape: str,
    batch: int,
    in_flight: int,
    budget: int | None,
    ledger: bool,
) -> None:
    """Each position of the report names its input message; a sent or duplicate message
    is stored exactly once, a failed one is not stored and was refused by the broker (with
    or without a ledger)."""
    root = tmp_path_factory.mktemp("prop")
    local = LocalBackend(root / "broker.db")
    local.create_entity(PARTITIONED)
    first_calls: set[tuple[str, ...]] = set()

    def script(index: int, entity: str, messages: Sequence[Message]) -> Fault:
        called = tuple(m.message_id for m in messages)
        if called in first_calls:
            return Fault.NONE  # a retry of the same transfer goes through
        first_calls.add(called)
        return faults.get(int(messages[0].message_id.split("-")[1]), Fault.NONE)

    faulty = FaultyBackend(local, script)
    backend = Looped(faulty)

    def message(n: int) -> Message:
        key = f"k{n % keys}" if keys else None
        return Message(f"order {n}", message_id=f"order-{n}", partition_key=key)

    messages = [message(n) for n in ids]
    options: dict[str, Any] = {} if budget is None else {"max_buffer_bytes": budget * 1024}
    if ledger:  # the write-ahead run around the flights: intents, confirmations, releases
        options["ledger"] = f"sqlite://{root / 'ledger.db'}"
    try:
        with IdempotentSender(
            backend,
            PARTITIONED,
            max_batch_messages=batch,
            max_in_flight=in_flight,
            retry=QUICK,
            **options,
        ) as s:
            given_in = iter(messages) if shape == "generator" else messages
            report = s.send_many(given_in)
        stored = Counter(local.message_ids("orders"))
        assert report.total == len(messages)
        refused = {i for c in faulty.calls if c.fault is Fault.PERMANENT for i in c.message_ids}
        failed = {f.message_id for f in report.failures}
        # In input order, every position once: a repeat shares its first copy's fate.
        assert [r.message_id for r in report.results] == [
            m.message_id for m in messages if m.message_id not in failed
        ]
        assert [f.message_id for f in report.failures] == [
            m.message_id for m in messages if m.message_id in failed
        ]
        for result in report.results:
            assert stored[result.message_id] == 1
        for failure in report.failures:
            assert isinstance(failure.error, PermanentSendError)
            assert failure.message_id in refused
            assert stored[failure.message_id] == 0
        assert set(stored) <= {m.message_id for m in messages}
        assert all(count == 1 for count in stored.values())
    finally:
        backend.close()
        with contextlib.suppress(Exception):
            local.close()


def test_a_call_off_the_main_thread_submits_from_its_own_thread(local: LocalBackend) -> None:
    """Ctrl-C lands only in the main thread, so a call from another thread submits itself:
    no thread of the engine's at all."""
    backend = Looped(local)
    reports = []
    try:
        with IdempotentSender(backend, PARTITIONED, max_batch_messages=1, max_in_flight=8) as s:
            worker = threading.Thread(target=lambda: reports.append(s.send_many(keyed(80, 8))))
            worker.start()
            worker.join(60)
        assert [r.failed for r in reports] == [0]
        assert engine_threads(backend.threads) == set()
        assert backend.most > 1 and backend.overlap == []
        assert sorted(local.message_ids("orders")) == sorted(f"order-{i}" for i in range(80))
    finally:
        backend.close()
