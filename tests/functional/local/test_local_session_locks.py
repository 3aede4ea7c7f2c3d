"""Session locks in the local broker: one receiver per session, kept in the broker file.

Service Bus rules (https://learn.microsoft.com/azure/service-bus-messaging/message-sessions):
a session is locked to one receiver at a time; a second receiver asking for it gets
*session cannot be locked*; NEXT_AVAILABLE_SESSION takes an unlocked session with a
message available, waiting up to max_wait_time; the lock lasts the lock duration
unless renewed, and renewing it keeps the session's messages locked; an expired
lock frees the session and the old holder's operations fail with *session lock lost*.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from _old_schemas import as_version_5

import sendonce
from sendonce import EntityProfile, Message
from sendonce.backends.local import (
    LocalBackend,
    LocalSession,
    LockLostError,
    NoSessionAvailableError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from sendonce.backends.local._schema import SCHEMA_VERSION
from sendonce.errors import ConfigurationError, ValidationError

CARTS = EntityProfile("carts", sessions=True)


def msg(mid: str, session: str) -> Message:
    return Message(mid.encode(), message_id=mid, session_id=session)


@pytest.fixture
def carts(broker: LocalBackend) -> LocalBackend:
    broker.create_entity(CARTS)
    return broker


def ids(messages: list[sendonce.backends.local.ReceivedMessage]) -> list[str]:
    return [m.message_id for m in messages]


def test_a_session_is_locked_to_one_receiver(carts: LocalBackend) -> None:
    carts.send("carts", [msg("a1", "A"), msg("b1", "B"), msg("a2", "A")], timeout=5)
    with carts.accept_session("carts", "A") as first:
        assert isinstance(first, LocalSession) and first.session_id == "A"
        with pytest.raises(SessionCannotBeLockedError) as refused:
            carts.accept_session("carts", "A")
        assert refused.value.session_id == "A" and refused.value.entity == "carts"
        assert "'A'" in str(refused.value) and "'carts'" in str(refused.value)
        # receivers without the session: refused for it, and never handed its messages
        with pytest.raises(SessionCannotBeLockedError):
            carts.receive("carts", session_id="A")
        assert ids(carts.receive("carts", max_messages=10, mode="peek_lock")) == ["b1"]
        got = first.receive(max_messages=10)
        assert ids(got) == ["a1", "a2"]
        assert all(m.locked_until == first.locked_until for m in got)
        first.complete(got[0])
    # closed: the session is free, and its unsettled message comes first again
    with carts.accept_session("carts", "A") as second:
        (again,) = second.receive(max_messages=10)
        assert (again.message_id, again.delivery_count) == ("a2", 2)
        second.complete(again)


def test_the_errors_are_exported_and_lock_lost_is_a_lock_lost() -> None:
    from sendonce.backends import LocalSession as FromBackends

    assert FromBackends is LocalSession
    with pytest.deprecated_call():  # their old home, for a deprecation period
        assert sendonce.SessionCannotBeLockedError is SessionCannotBeLockedError
        assert sendonce.SessionLockLostError is SessionLockLostError
        assert sendonce.NoSessionAvailableError is NoSessionAvailableError
    assert issubclass(SessionLockLostError, LockLostError)
    assert issubclass(NoSessionAvailableError, TimeoutError)


def test_a_named_session_can_be_locked_before_it_has_messages(carts: LocalBackend) -> None:
    with carts.accept_session("carts", "later") as session:
        assert session.receive() == []
        carts.send("carts", [msg("x", "later")], timeout=5)
        (x,) = session.receive()
        session.complete(x.lock_token)  # a lock token does as well as the message
    assert carts.message_ids("carts") == []


def test_next_available_takes_an_unlocked_session_with_a_message(
    carts: LocalBackend, clock
) -> None:
    carts.send("carts", [msg("a1", "A"), msg("b1", "B")], timeout=5)
    carts.schedule("carts", [msg("c1", "C")], clock.now + timedelta(hours=1), timeout=5)
    hours = timedelta(hours=2)
    with carts.accept_session("carts", "A", lock_duration=hours):
        with carts.accept_session("carts", lock_duration=hours) as picked:
            assert picked.session_id == "B"  # A is held, C has nothing available yet
            with pytest.raises(NoSessionAvailableError):
                carts.accept_session("carts")  # max_wait_time=None: no waiting
            clock.advance(hours=1)
            with carts.accept_session("carts", max_wait_time=0) as scheduled:
                assert scheduled.session_id == "C"


def test_next_available_waits_for_a_message(carts: LocalBackend) -> None:
    got: list[object] = []

    def wait() -> None:
        try:
            with carts.accept_session("carts", max_wait_time=3600) as session:
                got.append((session.session_id, ids(session.receive())))
        except BaseException as exc:  # reported by the test thread
            got.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    carts.send("carts", [msg("late", "L")], timeout=5)
    waiter.join(60)
    assert got == [("L", ["late"])]


def test_next_available_gives_up_after_max_wait_time_on_the_broker_clock(
    carts: LocalBackend, clock
) -> None:
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            carts.accept_session("carts", max_wait_time=600)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    for _ in range(300):  # the broker's clock, not the wall clock, ends the wait
        clock.advance(seconds=601)  # (again, in case the waiter had not started yet)
        waiter.join(0.2)
        if not waiter.is_alive():
            break
    assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], NoSessionAvailableError)
    assert "'carts'" in str(outcome[0])


def test_an_expired_session_lock_frees_the_session(carts: LocalBackend, clock) -> None:
    carts.send("carts", [msg("s1", "S")], timeout=5)
    first = carts.accept_session("carts", "S", lock_duration=timedelta(seconds=30))
    (m,) = first.receive()
    first.set_state(b"half-done")
    clock.advance(seconds=31)  # never renewed
    with carts.accept_session("carts", "S") as second:
        (again,) = second.receive()
        assert (again.message_id, again.delivery_count) == ("s1", 2)
        assert second.get_state() == b"half-done"
        for lost in (
            first.get_state,
            lambda: first.set_state(b"x"),
            first.renew_lock,
            first.receive,
            lambda: first.complete(m),
            lambda: first.abandon(m),
        ):
            with pytest.raises(SessionLockLostError) as err:
                lost()
            assert err.value.session_id == "S"
        first.close()  # the old holder closing leaves the new holder's locks alone
        with pytest.raises(SessionCannotBeLockedError):
            carts.accept_session("carts", "S")
        second.complete(again)
    assert carts.message_ids("carts") == []


def test_renewing_the_session_keeps_it_and_its_messages_locked(carts: LocalBackend, clock) -> None:
    carts.send("carts", [msg("r1", "R")], timeout=5)
    with carts.accept_session("carts", "R", lock_duration=timedelta(seconds=30)) as session:
        (m,) = session.receive()
        first_until = session.locked_until
        clock.advance(seconds=20)
        renewed = session.renew_lock()
        assert renewed == session.locked_until > first_until
        clock.advance(seconds=20)  # past the first expiry, within the renewed one
        with pytest.raises(SessionCannotBeLockedError):
            carts.accept_session("carts", "R")
        assert carts.count("carts") == 0  # its message is still locked
        session.complete(m)
    assert carts.message_ids("carts") == []


def test_settling_defer_and_dead_letter_through_the_session(carts: LocalBackend) -> None:
    carts.send("carts", [msg("d1", "D"), msg("d2", "D"), msg("d3", "D")], timeout=5)
    with carts.accept_session("carts", "D") as session:
        d1, d2, d3 = session.receive(max_messages=3)
        assert ids(session.peek(max_messages=5)) == ["d1", "d2", "d3"]
        session.defer(d1)
        session.dead_letter(d2, reason="bad", error_description="no good")
        session.abandon(d3)
        (d3_again,) = session.receive()
        session.complete(d3_again)
        (deferred,) = session.receive_deferred([d1.sequence_number])
        assert deferred.message_id == "d1"
        session.complete(deferred)
        with pytest.raises(LockLostError):
            session.complete(deferred)  # settled already
    (dead,) = carts.peek("carts", sub_queue="dead_letter")
    assert (dead.message_id, dead.dead_letter_reason) == ("d2", "bad")
    assert carts.message_ids("carts") == []


def test_a_session_cannot_settle_another_sessions_message(carts: LocalBackend) -> None:
    carts.send("carts", [msg("p1", "P"), msg("q1", "Q")], timeout=5)
    with carts.accept_session("carts", "P") as p, carts.accept_session("carts", "Q") as q:
        (q1,) = q.receive()
        with pytest.raises(LockLostError):
            p.complete(q1)
        q.complete(q1)


def test_plain_deferred_receive_honours_session_locks(carts: LocalBackend) -> None:
    carts.send("carts", [msg("f1", "F")], timeout=5)
    with carts.accept_session("carts", "F") as session:
        (f1,) = session.receive()
        session.defer(f1)
        with pytest.raises(SessionCannotBeLockedError):
            carts.receive_deferred("carts", [f1.sequence_number], session_id="F")
        with pytest.raises(sendonce.backends.local.MessageNotFoundError):
            carts.receive_deferred("carts", [f1.sequence_number])
    (f1_again,) = carts.receive_deferred("carts", [f1.sequence_number])
    carts.complete("carts", f1_again.lock_token)


def test_session_locks_are_per_subscription(broker: LocalBackend) -> None:
    broker.create_entity(EntityProfile("events", kind="topic", sessions=True))
    broker.create_subscription("events", "a")
    broker.create_subscription("events", "b")
    broker.send("events", [msg("e1", "S")], timeout=5)
    with broker.accept_session("events", "S", subscription="a") as in_a:
        with broker.accept_session("events", subscription="b") as in_b:
            assert in_b.session_id == "S"
            assert ids(in_b.receive()) == ["e1"]
        with pytest.raises(SessionCannotBeLockedError) as refused:
            broker.accept_session("events", "S", subscription="a")
        assert "events/Subscriptions/a" in str(refused.value)
        assert ids(in_a.receive()) == ["e1"]


def test_bad_requests_are_refused(carts: LocalBackend, make_entity) -> None:
    make_entity("plain")
    with pytest.raises(ConfigurationError, match="sessions"):
        carts.accept_session("plain", "S")
    for bad in (-1, float("nan"), "5", True):
        with pytest.raises(ValidationError) as err:
            carts.accept_session("carts", max_wait_time=bad)  # type: ignore[arg-type]
        assert err.value.field == "max_wait_time"
    with pytest.raises(ValidationError):
        carts.accept_session("carts", "")
    with pytest.raises(ValidationError):
        carts.accept_session("carts", "S", lock_duration=timedelta(0))
    with carts.accept_session("carts", "S") as session:
        with pytest.raises(ValidationError):
            session.receive(mode="browse")  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            session.complete("")
    with pytest.raises(SessionLockLostError):
        session.receive()  # closed
    session.close()  # idempotent


def test_two_handles_in_one_process_compete(db: str, clock, carts: LocalBackend) -> None:
    carts.send("carts", [msg("a1", "A"), msg("b1", "B")], timeout=5)
    with LocalBackend(db, clock=clock) as one, LocalBackend(db, clock=clock) as two:
        with one.accept_session("carts") as mine:
            assert mine.session_id == "A"
            with pytest.raises(SessionCannotBeLockedError):
                two.accept_session("carts", "A")
            with two.accept_session("carts") as theirs:
                assert theirs.session_id == "B"
                with pytest.raises(NoSessionAvailableError):
                    one.accept_session("carts")


def _in_another_process(db: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    with LocalBackend(db) as broker:
        try:
            broker.accept_session("carts", "A")
            out.put("locked A")
        except SessionCannotBeLockedError:
            out.put("refused A")
        with broker.accept_session("carts") as session:
            out.put(f"next {session.session_id}")
            out.put(ids(session.receive(max_messages=5)))


def test_another_process_is_refused_a_held_session(db: str) -> None:
    with LocalBackend(db) as broker:
        broker.create_entity(CARTS)
        broker.send("carts", [msg("a1", "A"), msg("b1", "B")], timeout=5)
        with broker.accept_session("carts", "A"):
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            child = ctx.Process(target=_in_another_process, args=(db, out))
            child.start()
            results = [out.get(timeout=60) for _ in range(3)]
            child.join(60)
            assert child.exitcode == 0
        assert results == ["refused A", "next B", ["b1"]]
        # the child's session ended with it: its unsettled message is available
        with broker.accept_session("carts") as session:
            assert ids(session.receive(max_messages=5)) in (["a1"], ["b1"])


SESSIONS = ("A", "B", "C", "D")
PER_SESSION = 6


def test_two_concurrent_session_receivers_process_every_message_once_in_order(db: str) -> None:
    with LocalBackend(db) as broker:
        broker.create_entity(CARTS)
        sent = [msg(f"{s}-{i}", s) for i in range(PER_SESSION) for s in SESSIONS]  # interleaved
        broker.send("carts", sent, timeout=5)
    processed: list[tuple[str, str, str]] = []
    record = threading.Lock()
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with LocalBackend(db) as handle:  # its own handle (the same connection)
                while True:
                    with record:
                        if len(processed) >= len(sent):
                            return
                    try:
                        session = handle.accept_session("carts", max_wait_time=0.2)
                    except NoSessionAvailableError:
                        continue
                    with session:
                        while batch := session.receive(max_messages=2):
                            for m in batch:
                                with record:
                                    processed.append((name, session.session_id, m.message_id))
                                session.complete(m)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(mid for _, _, mid in processed) == sorted(m.message_id for m in sent)
    for s in SESSIONS:
        assert [mid for _, sid, mid in processed if sid == s] == [
            f"{s}-{i}" for i in range(PER_SESSION)
        ]
    with LocalBackend(db) as broker:
        assert broker.message_ids("carts") == []


def test_a_version_4_file_is_upgraded_with_a_session_lock_table(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    with LocalBackend(path) as broker:
        broker.create_entity(CARTS)
        broker.send("carts", [msg("old", "S")], timeout=5)
        broker.set_session_state("carts", "S", b"kept")
    conn = sqlite3.connect(path)
    with conn:
        as_version_5(conn)
        conn.execute("DROP TABLE session_locks")
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.close()
    with LocalBackend(path) as broker, LocalBackend(path) as other:
        with broker.accept_session("carts", "S") as session:
            with pytest.raises(SessionCannotBeLockedError):
                other.accept_session("carts", "S")
            assert session.get_state() == b"kept"
            assert ids(session.receive()) == ["old"]
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == (SCHEMA_VERSION,)


def test_locks_of_a_stopped_broker_are_forgotten_on_restart(db: str) -> None:
    """No process has the file open: no receiver can hold a session any more."""
    with LocalBackend(db) as broker:
        broker.create_entity(CARTS)
        broker.accept_session("carts", "S")  # never closed
    with LocalBackend(db) as broker, broker.accept_session("carts", "S") as session:
        assert session.session_id == "S"
