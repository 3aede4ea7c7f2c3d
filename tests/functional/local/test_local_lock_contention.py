"""Another process holding the broker's write lock: calls store nothing and say so.

A writer outside this process (here a plain ``BEGIN IMMEDIATE`` in a subprocess,
as the sqlite3 shell or a backup tool would hold it) keeps the lock past the
attempt timeout. Every attempt is rolled back before it can commit, so the
messages are "not stored" (retryable, nothing in doubt), and opening a sender
does not wait for that process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta

import pytest

from sendonce import (
    AttemptNotSentError,
    ConfigurationError,
    EntityProfile,
    IdempotentSender,
    InDoubtError,
    Message,
    NeverSentError,
    RetryPolicy,
)
from sendonce import aio as sendonce_aio
from sendonce.backends.local import LocalBackend

ORDERS = EntityProfile("orders")

# Holds the write lock until told (a line on stdin) to let go.
HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("ROLLBACK")
    conn.close()
    """
)


@contextmanager
def write_lock_held(db: str) -> Iterator[subprocess.Popen[str]]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, db],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.stdin.write("go\n")
        holder.stdin.close()
        holder.wait(30)


def retry() -> RetryPolicy:
    return RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=False, attempt_timeout=0.5)


def messages(prefix: str, n: int) -> list[Message]:
    return [Message(f"body {i}", message_id=f"{prefix}-{i}") for i in range(n)]


@pytest.fixture
def created(db: str) -> str:
    with LocalBackend(db) as broker:
        broker.create_entity(ORDERS)
    return db


@pytest.fixture(params=["restart", "shared"])
def opening(request: pytest.FixtureRequest, created: str) -> Iterator[str]:
    """The sender is the file's first opener (a restart), or this process has it open."""
    with ExitStack() as stack:
        if request.param == "shared":
            stack.enter_context(LocalBackend(created))
        yield created


def assert_each_once(db: str, ids: list[str]) -> None:
    with LocalBackend(db) as broker:
        stored = Counter(broker.message_ids("orders"))
    assert stored == Counter(ids)


def test_backend_send_past_the_lock_is_not_sent(created: str) -> None:
    with LocalBackend(created) as broker, write_lock_held(created) as holder:
        with pytest.raises(AttemptNotSentError, match="nothing of this call was stored"):
            broker.send("orders", messages("a", 2), timeout=0.3)
        assert holder.poll() is None
    assert_each_once(created, [])


@pytest.mark.parametrize("entity", [ORDERS, "orders"], ids=["profile", "name"])
def test_sender_opens_without_waiting_and_reports_not_stored(
    opening: str, entity: EntityProfile | str
) -> None:
    url = f"local://{opening}"
    with write_lock_held(opening) as holder:
        with IdempotentSender(url, entity, retry=retry()) as sender:
            assert holder.poll() is None  # opened while the lock is still held
            with pytest.raises(NeverSentError) as single:
                sender.send(Message("one", message_id="single"))
            report = sender.send_many(messages("batch", 3))
        assert holder.poll() is None
    assert not isinstance(single.value, InDoubtError)
    assert single.value.attempts == 2
    assert report.failed == 3 and report.sent == 0
    for failure in report.failures:
        assert isinstance(failure.error, NeverSentError), failure.error
        assert "in doubt" not in str(failure.error)
    assert_each_once(opening, [])
    # Sending the same messages again once the lock is free stores each exactly once.
    with IdempotentSender(url, entity, retry=retry()) as sender:
        sender.send(Message("one", message_id="single"))
        assert sender.send_many(messages("batch", 3)).sent == 3
    assert_each_once(opening, ["single", "batch-0", "batch-1", "batch-2"])


def test_aio_sender_opens_without_waiting_and_reports_not_stored(opening: str) -> None:
    url = f"local://{opening}"

    async def run() -> None:
        with write_lock_held(opening) as holder:
            async with sendonce_aio.IdempotentSender(url, ORDERS, retry=retry()) as sender:
                assert holder.poll() is None
                with pytest.raises(NeverSentError):
                    await sender.send(Message("one", message_id="single"))
                report = await sender.send_many(messages("batch", 3))
            assert holder.poll() is None
        assert report.failed == 3
        assert all(isinstance(f.error, NeverSentError) for f in report.failures)
        assert_each_once(opening, [])
        async with sendonce_aio.IdempotentSender(url, ORDERS, retry=retry()) as sender:
            await sender.send(Message("one", message_id="single"))
            assert (await sender.send_many(messages("batch", 3))).sent == 3

    asyncio.run(run())
    assert_each_once(opening, ["single", "batch-0", "batch-1", "batch-2"])


@pytest.mark.parametrize("sender_kind", ["sync", "aio"])
def test_a_sender_opens_on_a_missing_entity_without_waiting_and_its_first_send_creates_it(
    created: str, sender_kind: str, request: pytest.FixtureRequest
) -> None:
    """Another process holds the write lock past the open: the entity cannot be created
    then. The open does not wait for it (it used to wait the whole busy timeout and fail);
    sends report not stored while the lock is held, and the first send once it is free
    creates the entity, with the sender's profile, and stores each message once."""
    audit = EntityProfile("audit", max_delivery_count=3, lock_duration=timedelta(seconds=30))
    with LocalBackend(created, busy_timeout=120) as broker:  # this process's own handle
        with write_lock_held(created) as holder:
            if sender_kind == "sync":
                sender = IdempotentSender(broker, audit, retry=retry())
            else:
                threaded = sendonce_aio.ThreadedBackend(broker)
                # The sender does not close the backend it is given: its worker thread would
                # outlive the test (a later test's in this worker), whatever the outcome.
                request.addfinalizer(lambda: asyncio.run(threaded.close()))
                sender = sendonce_aio.IdempotentSender(threaded, audit, retry=retry())
                asyncio.run(sender.open())
            assert holder.poll() is None  # opened while the lock is still held
            assert broker.describe("audit") == audit  # what the first send will create
            with pytest.raises(ConfigurationError, match="does not exist"):
                broker.count("audit")
            if sender_kind == "sync":
                with pytest.raises(NeverSentError):
                    sender.send(Message("one", message_id="single"))
        # the lock is free: the first send creates the entity in its own transaction
        if sender_kind == "sync":
            sender.send(Message("one", message_id="single"))
            assert sender.send_many(messages("batch", 2)).sent == 2
            sender.close()
        else:

            async def rest() -> int:
                await sender.send(Message("one", message_id="single"))
                report = await sender.send_many(messages("batch", 2))
                await sender.close()
                return report.sent

            assert asyncio.run(rest()) == 2
        assert broker.describe("audit") == audit
        assert broker.count("audit") == 3
    with LocalBackend(created) as again:  # another handle sees it stored
        assert again.describe("AUDIT") == audit
        assert Counter(again.message_ids("audit")) == Counter(["single", "batch-0", "batch-1"])
