"""A big ``send_many`` input never holds the event loop up (before: a 200k-row generator
stalled every other task for seconds while the call read and planned all of it).

The call reads a generator and validates its input a slice at a time, letting other tasks
run between slices. A list is validated whole before anything is sent; a generator is
streamed a chunk at a time (``sendonce._buffer``), each chunk validated before anything of
it is sent. Shown by
behaviour, never by timing: another task runs (and can cancel the call) while the
generator has yielded a small part of its rows, and while the input is being planned,
before anything reaches the broker; a cancellation there sends nothing and leaves nothing
in the ledger. Errors are the sync sender's own, for the same input; a concurrent call that
sends one of the ids with another body while the big call is planned is a conflict.

Real peers: the local broker (a SQLite file), the SQLite ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sendonce.aio._sender as aio_sender
from property_budget import examples
from sendonce import EntityProfile, IdempotentSender, Ledger, Message
from sendonce._message import MessageFactory
from sendonce._message_columns import MessageColumns
from sendonce._sender_core import _Planning
from sendonce.aio import IdempotentSender as AsyncSender
from sendonce.aio import ThreadedBackend
from sendonce.backends.local import LocalBackend
from sendonce.errors import MessageSizeError, PayloadConflictError, SendError, ValidationError
from sendonce.ledger import Key

NO_DEDUP = EntityProfile("audit", duplicate_detection=False, partitioned=True)


class Rows:
    """A generator of ``count`` rows that counts how many it has yielded."""

    def __init__(self, count: int, bad: dict[int, Any] | None = None) -> None:
        self.count, self.bad = count, bad or {}
        self.yielded = 0
        self.exhausted = False

    def __iter__(self) -> Iterator[Message]:
        for i in range(self.count):
            self.yielded += 1
            yield self.bad.get(i) or Message(f'{{"row": {i}}}', message_id=f"row-{i}")
        self.exhausted = True


class Watched(ThreadedBackend):
    """The local broker's backend, counting the transfers the sender starts."""

    transfers = 0

    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> Any:
        self.transfers += 1
        return await super().send(entity, messages, timeout=timeout, atomic=atomic)


def stored(db: Path, entity: str) -> list[str]:
    with LocalBackend(db) as broker:
        return broker.message_ids(entity)


def ledger_keys(url: str, count: int) -> dict[Key, Any]:
    """What the ledger holds for the rows' keys (on the partitioned entity)."""
    keys = [Key(*NO_DEDUP.dedup_key(m)) for m in Rows(count)]
    with Ledger(url) as ledger:
        return ledger.lookup("audit", keys)


@pytest.mark.parametrize("when", ["while reading", "while planning"])
def test_another_task_runs_and_cancels_before_the_input_is_all_planned(
    tmp_path: Path, when: str
) -> None:
    """A partitioned entity without duplicate detection, a ledger, 16 in flight: the test's own
    task gets its turns while the call reads the generator and while it plans, and cancels
    it there. Nothing was sent and nothing was written to the ledger: no key in doubt, and
    the re-run sends each row once."""
    db, url, count = tmp_path / "broker.db", f"sqlite://{tmp_path / 'ledger.db'}", 12_000
    rows = Rows(count)
    seen: list[int] = []  # rows yielded at each of the test task's turns

    async def cancelled() -> None:
        async with (
            Watched(LocalBackend(db)) as backend,
            AsyncSender(backend, NO_DEDUP, ledger=url, max_in_flight=16) as sender,
        ):
            if when == "while planning":  # a list: planned whole, a slice at a time
                task = asyncio.ensure_future(sender.send_many(list(rows)))
                await asyncio.sleep(0)  # one turn of the loop: the call plans its first slice
                await asyncio.sleep(0)  # and gives the loop a turn before it plans the next
                seen.append(rows.yielded)
            else:  # a generator: the first chunk is read a slice at a time
                task = asyncio.ensure_future(sender.send_many(rows))
                while not rows.yielded:
                    await asyncio.sleep(0)  # one turn of the loop
                    seen.append(rows.yielded)
            assert not task.done() and backend.transfers == 0
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert backend.transfers == 0

    asyncio.run(cancelled())
    # Before, the first turn came after all 12,000 rows were read and planned.
    if when == "while reading":
        assert 0 < seen[0] <= count // 20
        assert rows.yielded < count  # the rest of the generator is never read
    assert stored(db, "audit") == []
    assert ledger_keys(url, count) == {}  # no intent: nothing in doubt, nothing to release
    with IdempotentSender(f"local:{db}", NO_DEDUP, ledger=url) as again:
        report = again.send_many(Rows(count))
    assert (report.sent, report.failed) == (count, 0)
    assert sorted(stored(db, "audit")) == sorted(f"row-{i}" for i in range(count))


@pytest.mark.parametrize(
    "profile",
    [EntityProfile("orders"), NO_DEDUP],
    ids=["unkeyed, duplicate detection", "partitioned, no duplicate detection"],
)
def test_the_loop_turns_while_a_big_input_is_planned_and_every_row_lands_once(
    tmp_path: Path, profile: EntityProfile
) -> None:
    """Both planning paths (the bulk one reads whole slices; a partitioned entity takes
    each message on its own): turns of the loop between the generator's end and the
    first transfer, then every row sent once, the report in input order."""
    # (With a ledger the same turns come, and its first intent write gives more: the
    # cancellation test above covers that case.)
    db, count = tmp_path / "broker.db", 12_000
    rows = Rows(count)
    planning_turns = 0

    async def send() -> Any:
        nonlocal planning_turns
        async with (  # no ledger: its first write would give the loop turns of its own
            Watched(LocalBackend(db)) as backend,
            AsyncSender(
                backend, profile, max_in_flight=4, require_duplicate_detection=False
            ) as sender,
        ):
            task = asyncio.ensure_future(sender.send_many(list(rows)))  # planned whole
            while not task.done():
                await asyncio.sleep(0)
                planning_turns += rows.exhausted and not backend.transfers
            return await task

    report = asyncio.run(send())
    assert planning_turns >= 2  # before: none (the call planned everything in one go)
    assert [r.message_id for r in report.results] == [f"row-{i}" for i in range(count)]
    assert sorted(stored(db, profile.name)) == sorted(f"row-{i}" for i in range(count))


def _late_mistakes() -> list[tuple[str, dict[int, Any], type[SendError]]]:
    too_big = Message("x" * 300_000, message_id="big")  # over the entity's 256 KB
    return [
        ("not a Message at the end", {4999: "not a message"}, ValidationError),
        ("too big for the entity", {4000: too_big}, MessageSizeError),
        ("same id, other body", {4500: Message("other", message_id="row-3")}, PayloadConflictError),
    ]


@pytest.mark.parametrize(
    ("bad", "error"),
    [pytest.param(bad, error, id=name) for name, bad, error in _late_mistakes()],
)
def test_a_mistake_late_in_a_big_list_is_the_sync_senders_error_and_nothing_is_sent(
    tmp_path: Path, bad: dict[int, Any], error: type[SendError]
) -> None:
    """Planned a slice at a time, a list is still all validated before anything is
    sent: the same error (type, field, words) as the sync sender's, for the same input."""
    db, profile = tmp_path / "broker.db", EntityProfile("orders")
    with IdempotentSender(f"local:{db}", profile) as sync, pytest.raises(error) as expected:
        sync.send_many(list(Rows(5000, bad)))
    turns = 0

    async def send() -> None:
        nonlocal turns
        async with (
            Watched(LocalBackend(db)) as backend,
            AsyncSender(backend, profile) as sender,
        ):
            task = asyncio.ensure_future(sender.send_many(list(Rows(5000, bad))))
            while not task.done():
                await asyncio.sleep(0)
                turns += 1
            try:
                await task
            finally:
                assert backend.transfers == 0

    with pytest.raises(error) as got:
        asyncio.run(send())
    assert type(got.value) is type(expected.value)
    field = getattr(expected.value, "field", None)  # a ValidationError names the field
    assert (str(got.value), getattr(got.value, "field", None)) == (str(expected.value), field)
    assert f"messages[{next(iter(bad))}]" in str(got.value)  # names the late index
    assert turns > 5000 // aio_sender.PLAN_SLICE  # other tasks ran meanwhile
    assert stored(db, "orders") == []


@pytest.mark.parametrize(
    ("bad", "error"),
    [pytest.param(bad, error, id=name) for name, bad, error in _late_mistakes()],
)
def test_a_mistake_late_in_a_big_generator_stops_the_call_at_its_chunk(
    tmp_path: Path, bad: dict[int, Any], error: type[SendError]
) -> None:
    """A generator is streamed a chunk at a time: a mistake raises the sync sender's
    error before anything of its chunk is sent; the chunks before it were sent, each row
    once, and the error says so (its ``sent_before`` is their report, in input order)."""
    db, profile = tmp_path / "broker.db", EntityProfile("orders")
    with IdempotentSender(f"local:{db}", profile) as sync, pytest.raises(error) as expected:
        sync.send_many(Rows(5000, bad))
    sent = expected.value.sent_before  # type: ignore[attr-defined]
    first = stored(db, "orders")
    index = next(iter(bad))
    assert sent.total == len(first) < index and sent.failed == 0
    assert [r.message_id for r in sent.results] == [f"row-{i}" for i in range(sent.total)]
    assert sorted(first) == sorted(f"row-{i}" for i in range(sent.total))
    assert f"messages[{index}]" in str(expected.value)
    assert f"messages[0:{sent.total}]" in str(expected.value)

    async def send() -> None:
        async with AsyncSender(ThreadedBackend(LocalBackend(db)), profile) as sender:
            await sender.send_many(Rows(5000, bad))

    with pytest.raises(error) as got:
        asyncio.run(send())
    assert type(got.value) is type(expected.value)
    assert str(got.value) == str(expected.value)  # the second run's are the broker's duplicates
    again = got.value.sent_before  # type: ignore[attr-defined]
    assert again.total == sent.total and again.duplicates + again.sent == sent.total
    assert sorted(stored(db, "orders")) == sorted(first)  # each row once: the broker's window


def test_an_id_sent_with_another_body_while_a_big_call_is_planned_is_a_conflict(
    tmp_path: Path,
) -> None:
    """Task B sends row-0 with another body while task A's call, which holds row-0 in its
    first slice (already checked), plans the rest: A's call is refused whole (it would
    have been silently dropped by the broker), and B's copy is the only one stored."""
    db, count = tmp_path / "broker.db", 10_000
    rows = Rows(count)
    rival = Message("another body", message_id="row-0")

    async def race() -> None:
        async with (
            ThreadedBackend(LocalBackend(db)) as backend,
            AsyncSender(backend, EntityProfile("orders")) as sender,
        ):
            task = asyncio.ensure_future(sender.send_many(list(rows)))  # planned whole
            await asyncio.sleep(0)  # A plans its first slice (row-0 checked), then B runs
            assert not task.done()
            assert (await sender.send(rival)).outcome == "sent"
            with pytest.raises(PayloadConflictError, match=r"row-0.*messages\[0\].*another call"):
                await task

    asyncio.run(race())
    assert stored(db, "orders") == ["row-0"]
    with LocalBackend(db) as broker:
        assert [m.body for m in broker.receive("orders", max_messages=10)] == [b"another body"]


# -- planning a slice at a time is planning in one go -------------------------------------


ENTITIES = {
    "plain": EntityProfile("plain", max_message_size=2048),
    "partitioned": EntityProfile("partitioned", partitioned=True, max_message_size=2048),
    "partitioned, no dedup": EntityProfile(
        "nodedup", partitioned=True, duplicate_detection=False, max_message_size=2048
    ),
    "sessions": EntityProfile("sessions", sessions=True, max_message_size=2048),
}


def _message(n: int, body: str, keyed: bool) -> Message:
    key = f"k{n % 3}" if keyed else None
    return Message(body.encode(), message_id=f"m{n}", partition_key=key, session_id=key)


@st.composite
def inputs(draw: st.DrawFn) -> tuple[str, list[Any], list[Message], int, int]:
    """(entity, the call's input, a call remembered before it, step size, batch cap).

    Half the inputs have the bulk path's shape (over 64 unkeyed messages, distinct ids,
    none over the size the entity checks), maybe with one thing at any position that
    leaves it (a repeat, the same id with another body, a key, a message too big, not a
    message), which sends planning back to the message-by-message path at whichever
    step it shows."""
    if draw(st.booleans()):
        entity, keyed = "plain", False
        ids = list(range(draw(st.integers(65, 200))))
        sizes = [1, 300]
    else:
        entity = draw(st.sampled_from(sorted(ENTITIES)))
        keyed = entity == "sessions" or draw(st.booleans())
        ids = draw(st.lists(st.integers(0, 400), max_size=200, unique=draw(st.booleans())))
        sizes = [1, 300, 2100]  # 2100: over the entity's limit
    items: list[Any] = [_message(n, "a" * draw(st.sampled_from(sizes)), keyed) for n in ids]
    odd = draw(st.sampled_from([None, "repeat", "other body", "key", "too big", "foreign"]))
    if items and odd is not None:
        at = draw(st.integers(0, len(items) - 1))
        copied = items[draw(st.integers(0, len(items) - 1))]
        items.insert(
            at,
            {
                "repeat": copied,
                "other body": Message(b"b", message_id=copied.message_id),
                "key": _message(1000, "a", True),
                "too big": _message(1001, "a" * 2100, keyed),
                "foreign": "not a message",
            }[odd],
        )
    earlier = [_message(n, "a", keyed) for n in draw(st.sets(st.integers(0, 400), max_size=8))]
    return entity, items, earlier, draw(st.integers(1, 70)), draw(st.integers(1, 50))


def planned(sender: IdempotentSender, items: list[Any], step: int | None) -> Any:
    """The plan (ids per transfer, positions, repeats, reordered, ids seen), or the error."""
    try:
        if step is None:
            plan = sender._plan(items, what="messages")
        else:
            planning = _Planning(sender, items, "messages", True)
            while planning.step(step):
                pass
            plan = planning.result()
    except (ValidationError, PayloadConflictError) as exc:
        return type(exc), str(exc), getattr(exc, "field", None)
    batches = [[m.message_id for m in batch] for batch in plan.batches]
    return batches, [list(p) for p in plan.positions], plan.repeats, plan.reordered, plan.seen


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    with LocalBackend(tmp_path_factory.mktemp("planning") / "broker.db") as backend:
        yield backend


@settings(max_examples=examples(100), deadline=None)
@given(case=inputs())
def test_planning_in_steps_gives_the_plan_and_the_error_of_planning_in_one_go(
    case: tuple[str, list[Any], list[Message], int, int], broker: LocalBackend
) -> None:
    entity, items, earlier, step, cap = case
    profile = ENTITIES[entity]
    sender = IdempotentSender(
        broker, profile, max_batch_messages=cap, require_duplicate_detection=False
    )
    sender._plan_remembered(earlier, what="earlier", batch=False)  # an earlier call
    in_one_go = planned(sender, items, None)
    assert planned(sender, items, step) == in_one_go
    keyed = {m.partition_key is not None for m in items if isinstance(m, Message)}
    if items and all(isinstance(m, Message) for m in items) and len(keyed) == 1:
        keys = [m.partition_key for m in items] if keyed == {True} else None
        columns = MessageColumns.of(  # the same messages, as a Spark task builds them
            MessageFactory(), [m.body_bytes for m in items], [m.message_id for m in items],
            keys, keys,
        )  # fmt: skip
        assert columns is not None and list(columns) == items
        assert planned(sender, columns, None) == in_one_go


# -- 200,000 rows ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_200k_row_generator_lets_other_tasks_run_from_its_first_slice(tmp_path: Path) -> None:
    """200,000 rows, the same entity and ledger: the test's task runs after the first
    slice, keeps running while the rest is read, planned and sent a chunk at a time (the
    first transfers leave long before the generator is over), and every row lands once."""
    db, url, count = tmp_path / "broker.db", f"sqlite://{tmp_path / 'ledger.db'}", 200_000
    rows = Rows(count)
    seen: list[int] = []
    early = 0  # turns with transfers made while most of the input was still unread

    async def send() -> Any:
        nonlocal early
        async with (
            Watched(LocalBackend(db)) as backend,
            AsyncSender(backend, NO_DEDUP, ledger=url, max_in_flight=16) as sender,
        ):
            task = asyncio.ensure_future(sender.send_many(rows))
            while not task.done():
                await asyncio.sleep(0)
                seen.append(rows.yielded)
                early += backend.transfers > 0 and rows.yielded < count // 2
            return await task

    report = asyncio.run(send())
    assert seen[0] <= aio_sender.READ_SLICE and early > 0
    assert (report.sent, report.failed) == (count, 0)
    assert len(set(stored(db, "audit"))) == len(stored(db, "audit")) == count
    assert not [k for k, row in ledger_keys(url, count).items() if row.confirmed_at is None]
