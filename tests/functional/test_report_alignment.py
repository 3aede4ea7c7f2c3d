"""Every input shape the sender takes, against every mix of outcomes: each result and
failure lines up with its input, in input order, and the counts add up.

Shapes: a list of ``Message``, a tuple, a generator, ``MessageColumns`` (what a Spark task
builds), and Spark ``Row`` objects through the task's own encoder (no Spark session: the
encoder runs on plain column lists, as it does inside a task). Outcomes: repeats inside the
call, keys the ledger confirmed, keys in doubt, payload conflicts with the ledger, and
failures injected by ``FaultyBackend``, with one or several transfers in flight, sync and
aio, on plain and partitioned entities with and without duplicate detection.

The expected outcome of each input comes from outside the sender: the ledger's seeded rows,
and the fault of the backend call that carried the message (``FaultyBackend.calls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import Row

import sendonce._buffer
import sendonce.aio
import sendonce.aio._sender
from property_budget import examples
from sendonce import EntityProfile, IdempotentSender, Ledger, Message, MessageSpec, RetryPolicy
from sendonce._ledger_layer import LedgerLayer
from sendonce._message import MessageFactory
from sendonce._message_columns import MessageColumns
from sendonce.aio import ThreadedBackend
from sendonce.backends import LocalBackend
from sendonce.errors import InDoubtError, PayloadConflictError, PermanentSendError
from sendonce.spark._rows import BatchEncoder, ColumnPlan, columns_of_rows, encode_columns
from sendonce.spark._task import TaskJob, WindowGuard
from sendonce.testing import Fault, FaultyBackend

SHAPES = ["list", "tuple", "generator", "columns", "spark rows"]
ENTITIES = ["plain", "plain, no dedup", "partitioned", "partitioned, no dedup"]
LEDGER_STATES = ["confirmed", "conflict", "confirmed conflict", "in doubt"]
FAULTS = [Fault.NONE, Fault.PERMANENT, Fault.BEFORE_COMMIT, Fault.AFTER_COMMIT]
PARTITION_KEYS = ["k0", "k1", "k2"]
_names = itertools.count()


@dataclass
class Case:
    shape: str
    entity: str
    ledger: bool
    keyed: bool
    ids: list[int]
    states: dict[int, str]
    faults: dict[int, Fault]
    max_in_flight: int
    max_batch_messages: int

    def message(self, n: int) -> Message:
        pk = PARTITION_KEYS[n % 3] if self.keyed else None
        return Message(b"order %d" % n, message_id=f"order-{n}", partition_key=pk)

    def profile(self) -> EntityProfile:
        return EntityProfile(
            f"e{next(_names)}",
            duplicate_detection="no dedup" not in self.entity,
            partitioned=self.entity.startswith("partitioned"),
        )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    entity = draw(st.sampled_from(ENTITIES))
    ledger = "no dedup" in entity or draw(st.booleans())
    unique = draw(st.integers(1, 150))
    first = draw(st.integers(0, 1000))
    ids = list(range(first, first + unique))
    for _ in range(draw(st.integers(0, 6))):  # repeats inside the call, anywhere
        ids.insert(draw(st.integers(0, len(ids))), draw(st.sampled_from(ids)))
    if draw(st.booleans()):
        ids = draw(st.permutations(ids))
    pool = sorted(set(ids))
    states = (
        draw(st.dictionaries(st.sampled_from(pool), st.sampled_from(LEDGER_STATES), max_size=20))
        if ledger
        else {}
    )
    faults = draw(st.dictionaries(st.sampled_from(pool), st.sampled_from(FAULTS), max_size=12))
    return Case(
        shape=draw(st.sampled_from(SHAPES)),
        entity=entity,
        ledger=ledger,
        keyed=draw(st.booleans()),
        ids=ids,
        states=states,
        faults=faults,
        max_in_flight=draw(st.sampled_from([1, 4])),
        max_batch_messages=draw(st.sampled_from([2, 5, 4500])),
    )


def shaped(case: Case, messages: list[Message]) -> Sequence[Message] | Iterator[Message]:
    """The messages in the case's input shape."""
    if case.shape == "tuple":
        return tuple(messages)
    if case.shape == "generator":
        return (m for m in messages)
    if case.shape == "columns":
        pks = None if not case.keyed else [m.partition_key for m in messages]
        columns = MessageColumns.of(
            MessageFactory(),
            [m.body for m in messages],
            [m.message_id for m in messages],
            pks,  # type: ignore[arg-type]
        )
        assert columns is not None
        return columns
    if case.shape == "spark rows":
        keyed = case.keyed
        names = ("id", "pk", "body") if keyed else ("id", "body")
        rows = [
            Row(id=m.message_id, pk=m.partition_key, body=m.body)
            if keyed
            else Row(id=m.message_id, body=m.body)
            for m in messages
        ]
        spec = MessageSpec("{id}", body="body", partition_key="{pk}" if keyed else None)
        kinds = (("id", "str"), ("pk", "str")) if keyed else (("id", "str"),)
        plan = ColumnPlan(names, (None,) * len(names), kinds, False)
        encoded = encode_columns(BatchEncoder(spec, plan), columns_of_rows(plan, rows), len(rows))
        assert not encoded.errors
        assert list(encoded.messages) == messages  # the task's messages are the case's
        return encoded.messages
    return messages


def seed(store: Ledger, profile: EntityProfile, case: Case) -> None:
    """The ledger rows an earlier run left: a day ago, so past any window."""
    day_ago = datetime.now(UTC) - timedelta(days=1)
    with Ledger(store.store, clock=lambda: day_ago) as ledger:
        layer = LedgerLayer(ledger, profile, timedelta(seconds=5), time.monotonic)
        messages = [case.message(n) for n in case.states]
        messages = [
            Message(b"another order", message_id=m.message_id, partition_key=m.partition_key)
            if "conflict" in state
            else m
            for m, state in zip(messages, case.states.values(), strict=True)
        ]
        if not messages:
            return
        keys = layer.keys(messages)
        ledger._prepare(profile.name, messages, keys, window=timedelta(0), margin=timedelta(0))
        confirmed = [k for k, s in zip(keys, case.states.values(), strict=True) if s != "in doubt"]
        ledger.confirm(profile.name, dict.fromkeys(confirmed, "sent"))


def expected_outcomes(case: Case, faulty: FaultyBackend) -> list[tuple[str, type | str]]:
    """(message id, outcome or error type) of each input, in input order."""
    fault_of: dict[str, Fault] = {}
    for call in faulty.calls:
        for mid in call.message_ids:
            assert mid not in fault_of, f"{mid} was sent twice (one attempt per transfer)"
            fault_of[mid] = call.fault
    by_fault: dict[Fault, type | str] = {
        Fault.NONE: "sent",
        Fault.PERMANENT: PermanentSendError,
        Fault.BEFORE_COMMIT: InDoubtError,
        Fault.AFTER_COMMIT: InDoubtError,
    }
    by_state: dict[str, type | str] = {
        "confirmed": "duplicate",
        "conflict": PayloadConflictError,
        "confirmed conflict": PayloadConflictError,
        "in doubt": InDoubtError,
    }
    first: dict[int, type | str] = {}
    expected: list[tuple[str, type | str]] = []
    for n in case.ids:
        mid = f"order-{n}"
        if n in first:  # a repeat shares its first copy's fate
            outcome = first[n] if isinstance(first[n], type) else "duplicate"
        elif n in case.states:
            outcome = by_state[case.states[n]]
            assert mid not in fault_of, f"{mid} was decided by the ledger, yet sent"
        else:
            outcome = by_fault[fault_of[mid]]
        first.setdefault(n, outcome)
        expected.append((mid, outcome))
    return expected


def check(
    case: Case, report: Any, faulty: FaultyBackend, broker: LocalBackend, entity: str
) -> None:
    expected = expected_outcomes(case, faulty)
    messages = [case.message(n) for n in case.ids]
    pairs = zip(messages, expected, strict=True)
    entries = [(m.message_id, m.partition_key, outcome) for m, (_, outcome) in pairs]
    results = [e for e in entries if isinstance(e[2], str)]
    failures = [e for e in entries if isinstance(e[2], type)]
    got_failures = [(f.message_id, f.partition_key, type(f.error)) for f in report.failures]
    assert got_failures == failures  # each failure lines up with its input, in input order
    assert all(f.error.message_id == f.message_id for f in report.failures)
    assert report.sent + report.duplicates + report.failed == len(case.ids) == report.total
    assert report.failed == len(failures)
    assert report.sent == sum(1 for *_, o in results if o == "sent")
    got_results = [(r.message_id, r.partition_key, r.outcome) for r in report.results]
    assert got_results == results  # each result lines up with its input, in input order
    firsts = dict.fromkeys(case.ids)  # the first copy of each key, in input order
    from_ledger = [f"order-{n}" for n in firsts if case.states.get(n) == "confirmed"]
    assert sorted(report.from_ledger) == sorted(from_ledger)  # in the transfers' order
    stored = Counter(broker.message_ids(entity))
    carried = {
        mid: call.fault for call in faulty.calls for mid in call.message_ids
    }  # what reached the broker: every call but the refused and never-committed ones
    assert stored == Counter(
        mid for mid, fault in carried.items() if fault in (Fault.NONE, Fault.AFTER_COMMIT)
    )


def script(case: Case) -> Any:
    """A transfer's fault is the one drawn for its first message (whatever the order)."""
    faults = {f"order-{n}": fault for n, fault in case.faults.items()}

    def fault(index: int, entity: str, messages: Sequence[Message]) -> Fault:
        return faults.get(messages[0].message_id, Fault.NONE)

    return fault


ONE_ATTEMPT = RetryPolicy(max_attempts=1, jitter=False)
PROPERTY = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Kept:
    """The shared broker, for a wrapper that closes what it wraps (``ThreadedBackend``)."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBackend, Ledger]]:
    """One broker file and one ledger for every example (each uses fresh entities)."""
    root = tmp_path_factory.mktemp("alignment")
    with LocalBackend(root / "broker.db") as broker, Ledger(f"sqlite://{root / 'l.db'}") as ledger:
        yield broker, ledger


@PROPERTY
@given(case=cases())
def test_sync_reports_line_up_with_their_input(
    case: Case, peers: tuple[LocalBackend, Ledger]
) -> None:
    broker, ledger = peers
    profile = case.profile()
    broker.create_entity(profile)
    if case.ledger:
        seed(ledger, profile, case)
    faulty = FaultyBackend(broker, script(case))
    with IdempotentSender(
        faulty,
        profile,
        retry=ONE_ATTEMPT,
        ledger=ledger if case.ledger else None,
        max_in_flight=case.max_in_flight,
        max_batch_messages=case.max_batch_messages,
    ) as sender:
        report = sender.send_many(shaped(case, [case.message(n) for n in case.ids]))
    check(case, report, faulty, broker, profile.name)


@PROPERTY
@given(case=cases(), slices=st.sampled_from([None, 1, 2, 5]))
def test_aio_reports_line_up_with_their_input(
    case: Case, slices: int | None, peers: tuple[LocalBackend, Ledger]
) -> None:
    """``slices``: the aio sender reads, plans and accounts that many messages (transfers)
    between two turns of its event loop, instead of thousands: every input planned in
    steps."""
    broker, ledger = peers
    profile = case.profile()
    broker.create_entity(profile)
    if case.ledger:
        seed(ledger, profile, case)
    faulty = FaultyBackend(Kept(broker), script(case))

    async def scenario() -> Any:
        async with (
            ThreadedBackend(faulty) as backend,
            sendonce.aio.IdempotentSender(
                backend,
                profile,
                retry=ONE_ATTEMPT,
                ledger=ledger if case.ledger else None,
                max_in_flight=case.max_in_flight,
                max_batch_messages=case.max_batch_messages,
            ) as sender,
        ):
            return await sender.send_many(shaped(case, [case.message(n) for n in case.ids]))

    with (
        mock.patch.multiple(
            sendonce.aio._sender, READ_SLICE=slices, PLAN_SLICE=slices, ACCOUNT_SLICE=slices
        )
        if slices
        else contextlib.nullcontext()
    ):
        report = asyncio.run(scenario())
    check(case, report, faulty, broker, profile.name)


def streamed(case: Case, first: int, budget: int) -> Case:
    """The case as a generator streamed in chunks (the first of ``first`` messages, each
    next one of twice as many, each within ``budget`` bytes as ``sendonce._buffer``
    counts them), without the repeats whose first copy is in an earlier chunk (such a
    repeat is sent again, like a repeat in a later call: docs/index.md, "Big inputs")."""
    ids: list[int] = []
    chunk_of: dict[int, int] = {}
    chunk, count, used, limit = 0, 0, 0, first
    for n in case.ids:
        if count >= limit or used >= budget:  # the chunk is full: the next one starts
            chunk, count, used, limit = chunk + 1, 0, 0, limit * 2
        if chunk_of.setdefault(n, chunk) != chunk:
            continue
        ids.append(n)
        count += 1
        used += case.message(n).size + sendonce._buffer.MESSAGE_FOOTPRINT
    return dataclasses.replace(case, ids=ids, shape="generator")


@PROPERTY
@given(
    case=cases(),
    first=st.sampled_from([1, 3, 8]),
    aio=st.booleans(),
    budget=st.sampled_from([None, 64 * 1024]),
)
def test_streamed_reports_line_up_with_their_input(
    case: Case, first: int, aio: bool, budget: int | None, peers: tuple[LocalBackend, Ledger]
) -> None:
    """A generator streamed through the bounded buffer in many small chunks (the first of
    ``first`` messages, each next one twice as big; ``budget``: a 64 KiB buffer, ~60 of
    these messages): every outcome of the property above still lines up with the input,
    through the chunks' packed reports, sync and aio."""
    first = first if budget is None else 64
    case = streamed(case, first, budget or sendonce._buffer.DEFAULT_MAX_BUFFER_BYTES)
    broker, ledger = peers
    profile = case.profile()
    broker.create_entity(profile)
    if case.ledger:
        seed(ledger, profile, case)
    faulty = FaultyBackend(Kept(broker), script(case))
    options: dict[str, Any] = {
        "retry": ONE_ATTEMPT,
        "ledger": ledger if case.ledger else None,
        "max_in_flight": case.max_in_flight,
        "max_batch_messages": case.max_batch_messages,
    }
    if budget is not None:
        options["max_buffer_bytes"] = budget
    inputs = shaped(case, [case.message(n) for n in case.ids])

    async def scenario() -> Any:
        async with (
            ThreadedBackend(faulty) as backend,
            sendonce.aio.IdempotentSender(backend, profile, **options) as sender,
        ):
            return await sender.send_many(inputs)

    with mock.patch.object(sendonce._buffer, "FIRST_CHUNK", first):
        if aio:
            report = asyncio.run(scenario())
        else:
            with IdempotentSender(faulty, profile, **options) as sender:
                report = sender.send_many(inputs)
    check(case, report, faulty, broker, profile.name)


def test_a_spark_task_rerun_over_a_superset_sends_exactly_the_new_rows(
    peers: tuple[LocalBackend, Ledger],
) -> None:
    """The task's own path (rows -> columns -> ``MessageColumns`` -> sender with a ledger),
    without Spark: yesterday's 1,500 rows, the same again, then today's 2,000 (a superset).
    Every re-run used to die in the report's ordering (``KeyError``), so Spark retried it."""
    broker, ledger = peers
    profile = EntityProfile(f"e{next(_names)}", duplicate_detection=False)
    broker.create_entity(profile)
    spec = MessageSpec("order-{id}", body="body")
    plan = ColumnPlan(("id", "body"), (None, None), (("id", "int"),), False)
    job = TaskJob(
        f"local://{broker.path}",
        profile,
        spec,
        plan,
        WindowGuard(started=time.time(), window=None, margin=0.0, budget=0.0),
        ledger=ledger.url,
    )

    def rows(n: int) -> list[Row]:
        return [Row(id=i, body=b"order %d" % i) for i in range(n)]

    first, again, superset = (job.rows(rows(n), chunk=700) for n in (1500, 1500, 2000))
    assert (first.sent, first.duplicates, first.failed) == (1500, 0, 0)
    assert (again.sent, again.duplicates, again.failed) == (0, 1500, 0)
    assert (superset.sent, superset.duplicates, superset.failed) == (500, 1500, 0)
    assert Counter(broker.message_ids(profile.name)) == {f"order-{i}": 1 for i in range(2000)}
