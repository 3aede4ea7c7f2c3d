"""Transfers: what the ledger writes per transfer, on both stores, with a real broker file.

A transfer's intents are one write; its usual confirmation ("every intent acked") is
one row; the next transfer's intents are written while this one is sent. These tests
hold each of those to the ledger's guarantees: an intent is durable before its
transfer's first attempt, nothing confirmed is lost, nothing unsent stays behind.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ledger_helpers import T0, WINDOW, Clock, msg

from _interrupts import sigint_default
from sendonce import (
    EntityProfile,
    IdempotentSender,
    InDoubtError,
    Ledger,
    LedgerError,
    Message,
    PayloadConflictError,
    RetryPolicy,
)
from sendonce.backends import LocalBackend
from sendonce.ledger import Key, body_digest
from sendonce.ledger._store import Confirmation
from sendonce.testing import Fault, FaultyBackend


def keys(ids: range) -> list[Key]:
    return [Key(f"order-{i}", "") for i in ids]


PROFILE = EntityProfile("orders", duplicate_detection_window=WINDOW)


class Watching:
    """A broker that checks, at every send, what the ledger holds for that batch."""

    def __init__(self, inner: LocalBackend, ledger: Ledger | None) -> None:
        self.inner, self.ledger = inner, ledger
        self.missing: list[str] = []
        self.sends = 0
        self.interrupt_at: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> Any:
        self.sends += 1
        if self.sends == self.interrupt_at:
            raise KeyboardInterrupt  # Ctrl-C while this transfer is on its way
        wanted = [Key(m.message_id, "") for m in messages]
        found = self.ledger.store.lookup(entity, wanted) if self.ledger else wanted
        self.missing += [k.message_id for k in wanted if k not in found]
        return self.inner.send(entity, messages, **kw)


@pytest.mark.parametrize("in_flight", [1, 8])
def test_every_intent_is_durable_before_its_transfers_first_attempt(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy, in_flight: int
) -> None:
    """Intents are written ahead a window at a time, in a worker thread: never later than
    the attempt, whether one transfer or eight are in flight."""
    with Ledger(ledger_url, clock=clock) as ledger:
        watching = Watching(broker, ledger)
        with IdempotentSender(
            watching,
            PROFILE,
            retry=retry,
            ledger=ledger,
            max_batch_messages=7,
            max_in_flight=in_flight,
        ) as sender:
            report = sender.send_many([msg(i) for i in range(600)])
        assert report.sent == 600 and watching.sends == 86
        assert watching.missing == []
        rows = ledger.store.lookup("orders", keys(range(600)))
    assert len(rows) == 600
    assert all(r.confirmed_at is not None and r.outcome == "sent" for r in rows.values())
    # One intent write per window of transfers, not one per transfer.
    assert len({r.owner for r in rows.values()}) == 3


def test_an_interrupted_send_releases_the_intents_written_ahead(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    """Ctrl-C during transfer 2: transfer 3 was never attempted, so it is not in doubt."""
    with Ledger(ledger_url, clock=clock) as ledger:
        watching = Watching(broker, ledger)
        watching.interrupt_at = 2
        sender = IdempotentSender(
            watching, PROFILE, retry=retry, ledger=ledger, max_batch_messages=10
        )
        with pytest.raises(KeyboardInterrupt):
            sender.send_many([msg(i) for i in range(30)])
        rows = ledger.store.lookup("orders", keys(range(30)))
        assert sorted(rows) == sorted(keys(range(20)))  # transfer 3's intents are gone
        clock.now += 2 * WINDOW
        with IdempotentSender(broker, PROFILE, retry=retry, ledger=ledger) as again:
            report = again.send_many([msg(i) for i in range(30)])
    # Transfer 1's confirmation travelled with transfer 3's intents (written ahead,
    # then released: only the confirmation stayed). Transfer 2 may have reached the
    # broker: in doubt past the window, and reported. Transfer 3 is sent normally.
    assert report.sent == 10
    assert sorted(report.from_ledger) == sorted(f"order-{i}" for i in range(10))
    assert sorted(report.in_doubt) == sorted(f"order-{i}" for i in range(10, 20))
    assert all(isinstance(f.error, InDoubtError) for f in report.failures)
    assert broker.count("orders") == 20


def test_the_store_confirms_whole_transfers_and_single_keys(ledger_url: str) -> None:
    with Ledger(ledger_url) as ledger:
        store = ledger.store
        body = [body_digest(msg(i)) for i in range(6)]
        store.record_intents("orders", keys(range(3)), body[:3], first_attempt=T0, owner="a")
        store.record_intents("orders", keys(range(3, 6)), body[3:], first_attempt=T0, owner="b")
        later = T0 + timedelta(minutes=1)
        # Transfer a: all acked, one of them as a duplicate. Transfer b: only order-3 acked.
        store.confirm(
            "orders",
            Confirmation(("a",), {Key("order-1", ""): "duplicate", Key("order-3", ""): "sent"}),
            later,
        )
        rows = store.lookup("orders", keys(range(6)))
    assert {k.message_id: (r.outcome, r.confirmed_at) for k, r in rows.items()} == {
        "order-0": ("sent", later),
        "order-1": ("duplicate", later),
        "order-2": ("sent", later),
        "order-3": ("sent", later),
        "order-4": (None, None),
        "order-5": (None, None),
    }
    assert {rows[k].owner for k in keys(range(3))} == {"a"}
    assert rows[Key("order-4", "")].first_attempt == T0
    assert rows[Key("order-4", "")].digest == body[4]


def test_a_refused_transfer_is_released_while_the_next_was_written_ahead(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    """Transfer 2 refused (nothing stored): released; transfers 1 and 3 confirmed."""
    faulty = FaultyBackend(broker, [Fault.NONE, Fault.PERMANENT, Fault.NONE])
    with Ledger(ledger_url, clock=clock) as ledger:
        with IdempotentSender(
            faulty, PROFILE, retry=retry, ledger=ledger, max_batch_messages=5
        ) as sender:
            report = sender.send_many([msg(i) for i in range(15)])
        rows = ledger.store.lookup("orders", keys(range(15)))
        assert report.sent == 10 and report.failed == 5 and not report.in_doubt
        assert sorted(rows) == sorted(keys(range(5)) + keys(range(10, 15)))
        assert all(r.confirmed_at is not None for r in rows.values())
        clock.now += 2 * WINDOW  # nothing of transfer 2 was stored: nothing is in doubt
        with IdempotentSender(broker, PROFILE, retry=retry, ledger=ledger) as again:
            rerun = again.send_many([msg(i) for i in range(15)])
    assert (rerun.sent, rerun.duplicates, rerun.failed) == (5, 10, 0)
    assert broker.count("orders") == 15


def test_a_duplicate_acked_by_the_broker_is_recorded_as_duplicate(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    with IdempotentSender(broker, PROFILE, retry=retry) as plain:
        plain.send(msg(2))  # sent earlier without the ledger
    with Ledger(ledger_url, clock=clock) as ledger:
        with IdempotentSender(broker, PROFILE, retry=retry, ledger=ledger) as sender:
            report = sender.send_many([msg(i) for i in range(4)])
        rows = ledger.store.lookup("orders", keys(range(4)))
    assert (report.sent, report.duplicates) == (3, 1)
    assert {k.message_id: r.outcome for k, r in rows.items()} == {
        "order-0": "sent",
        "order-1": "sent",
        "order-2": "duplicate",
        "order-3": "sent",
    }


def test_an_unreachable_ledger_mid_call_sends_nothing_unrecorded(
    broker: LocalBackend, clock: Clock, tmp_path: Path, retry: RetryPolicy
) -> None:
    """The file goes away after the first transfer: every later window fails, unsent."""
    path = tmp_path / "ledger.db"
    with Ledger(f"sqlite://{path}", clock=clock) as ledger:

        class Removing:
            def __init__(self) -> None:
                self.sends = 0

            def __getattr__(self, name: str) -> Any:
                return getattr(broker, name)

            def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> Any:
                acks = broker.send(entity, messages, **kw)
                self.sends += 1
                if self.sends == 1:
                    path.rename(tmp_path / "moved.db")  # identity check: never written again
                return acks

        with IdempotentSender(
            Removing(), PROFILE, retry=retry, ledger=ledger, max_batch_messages=100
        ) as sender:
            report = sender.send_many([msg(i) for i in range(900)])
    # Windows of two transfers; the second window's intents may have been written (ahead)
    # before the move: then it is sent too.
    assert report.sent in (200, 400) and report.failed == 900 - report.sent
    assert all(isinstance(f.error, LedgerError) for f in report.failures)
    assert broker.count("orders") == report.sent


# -- the SQLite file format ------------------------------------------------------------

_V1_SCHEMA = """
CREATE TABLE ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO ledger_meta VALUES ('format', 'sendonce-ledger'), ('schema_version', '1');
CREATE TABLE sendonce_ledger (
    entity TEXT NOT NULL, message_id TEXT NOT NULL, partition_key TEXT NOT NULL,
    digest TEXT NOT NULL, first_attempt INTEGER NOT NULL, owner TEXT NOT NULL,
    confirmed_at INTEGER, outcome TEXT,
    PRIMARY KEY (entity, message_id, partition_key)
) WITHOUT ROWID;
"""


def _v1_digest(message: Message) -> str:
    body = message.body if isinstance(message.body, bytes) else message.body.encode()
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def _us(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def test_a_version_1_ledger_file_is_upgraded_in_place(
    broker: LocalBackend, clock: Clock, tmp_path: Path, retry: RetryPolicy
) -> None:
    """The first format's rows keep their meaning, their blake2b digests included."""
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(_V1_SCHEMA)
    at = _us(T0)
    conn.executemany(
        "INSERT INTO sendonce_ledger VALUES (?, ?, '', ?, ?, ?, ?, ?)",
        [
            ("orders", "order-1", _v1_digest(msg(1)), at, "old", at + 5, "sent"),
            ("orders", "order-2", _v1_digest(msg(2)), at, "old", at + 5, "sent"),
            ("orders", "order-3", _v1_digest(msg(3)), at, "old", None, None),
            ("other", "order-1", _v1_digest(msg(1, "x")), at, "older", None, None),
        ],
    )
    conn.commit()
    conn.close()
    clock.now = T0 + 2 * WINDOW
    with Ledger(f"sqlite://{path}", clock=clock) as ledger:
        with IdempotentSender(broker, PROFILE, retry=retry, ledger=ledger) as sender:
            report = sender.send_many([msg(1), msg(2, "changed"), msg(3), msg(4)])
        other = ledger.store.lookup("other", [Key("order-1", "")])
    assert report.from_ledger == ["order-1"]  # same body under the old digest: no conflict
    errors = {f.message_id: type(f.error) for f in report.failures}
    assert errors == {"order-2": PayloadConflictError, "order-3": InDoubtError}
    assert report.sent == 1 and broker.count("orders") == 1
    assert other[Key("order-1", "")].first_attempt == T0
    check = sqlite3.connect(path)
    version = check.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'")
    assert version.fetchone() == ("3",)
    assert check.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'sendonce_ledger'"
    ).fetchone() == (0,)
    check.close()


def test_a_confirmed_window_costs_one_row_not_one_per_key(
    broker: LocalBackend, clock: Clock, tmp_path: Path, retry: RetryPolicy
) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(f"sqlite://{path}", clock=clock) as ledger:
        with IdempotentSender(
            broker, PROFILE, retry=retry, ledger=ledger, max_batch_messages=100
        ) as sender:
            assert sender.send_many([msg(i) for i in range(1000)]).sent == 1000
    conn = sqlite3.connect(path)
    per_key = conn.execute(
        "SELECT count(*) FROM ledger_keys WHERE confirmed_at IS NOT NULL"
    ).fetchone()
    transfers = conn.execute(
        "SELECT count(*), sum(keys) FROM ledger_transfers WHERE confirmed_at IS NOT NULL"
    ).fetchone()
    conn.close()
    assert per_key == (0,)
    assert transfers == (5, 1000)  # windows of two transfers (256 messages at most)


def test_pruning_drops_a_transfer_with_its_last_key(
    broker: LocalBackend, clock: Clock, tmp_path: Path, retry: RetryPolicy
) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(
        f"sqlite://{path}",
        clock=clock,
        retention=timedelta(days=1),
        prune_interval=timedelta(days=365),  # only the explicit prunes below
    ) as ledger:
        with IdempotentSender(
            broker, PROFILE, retry=retry, ledger=ledger, max_batch_messages=5
        ) as sender:
            sender.send_many([msg(i) for i in range(10)])
            clock.now += timedelta(days=2)
            sender.send_many([msg(i) for i in range(10, 15)])
        assert ledger.prune(limit=7) == 7
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT keys FROM ledger_transfers ORDER BY tid").fetchall() == [
            (3,),
            (5,),
        ]
        assert ledger.prune(limit=100) == 3
        assert conn.execute("SELECT keys FROM ledger_transfers").fetchall() == [(5,)]
        conn.close()
        assert sorted(ledger.store.lookup("orders", keys(range(15)))) == keys(range(10, 15))


# -- interruptions while intents are written ahead -------------------------------------


class Pausing:
    """A ledger store whose ``record_intents`` call number ``at`` runs ``before`` first
    (while the sender waits for that window), then writes."""

    def __init__(self, inner: Any, at: int, before: Any) -> None:
        self.inner, self.at, self.before = inner, at, before
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def record_intents(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        if self.calls == self.at:
            self.before()
        return self.inner.record_intents(*args, **kw)


@pytest.mark.parametrize("in_flight", [1, 8])
def test_ctrl_c_while_a_window_is_written_ahead_releases_it_and_confirms_the_acked(
    broker: LocalBackend, clock: Clock, tmp_path: Path, retry: RetryPolicy, in_flight: int
) -> None:
    """SIGINT lands while the sender waits for window 2's intents (window 1 all acked).

    On the way out window 2's intents are released (never attempted) and window 1 is
    confirmed, so a re-run past the window finds nothing in doubt and sends the rest.
    """
    import signal
    import threading
    import time

    main = threading.main_thread().ident
    assert main == threading.get_ident()
    counting = Watching(broker, None)  # type: ignore[arg-type]

    def interrupt() -> None:
        deadline = time.monotonic() + 5
        while counting.sends < 25 and time.monotonic() < deadline:  # window 1 all sent
            time.sleep(0.01)
        time.sleep(0.2)  # the sender is now waiting for this write
        assert main is not None
        signal.pthread_kill(main, signal.SIGINT)
        time.sleep(0.1)

    sqlite_url = f"sqlite://{tmp_path / 'ledger.db'}"
    with Ledger(sqlite_url, clock=clock) as plain_ledger:
        store = Pausing(plain_ledger.store, at=2, before=interrupt)
        ledger = Ledger(store, clock=clock)  # type: ignore[arg-type]
        counting.ledger = ledger
        sender = IdempotentSender(
            counting,
            PROFILE,
            retry=retry,
            ledger=ledger,
            max_batch_messages=10,
            max_in_flight=in_flight,
        )
        with sigint_default(), pytest.raises(KeyboardInterrupt):
            sender.send_many([msg(i) for i in range(600)])
        assert counting.sends == 25 and broker.count("orders") == 250
        rows = plain_ledger.store.lookup("orders", keys(range(600)))
        assert sorted(rows) == sorted(keys(range(250)))  # window 2's intents are gone
        assert all(r.confirmed_at is not None for r in rows.values())
        clock.now += 2 * WINDOW
        with IdempotentSender(broker, PROFILE, retry=retry, ledger=plain_ledger) as again:
            rerun = again.send_many([msg(i) for i in range(600)])
    assert rerun.in_doubt == []
    assert sorted(rerun.from_ledger) == sorted(f"order-{i}" for i in range(250))
    assert rerun.sent == 350
    assert Counter(broker.message_ids("orders")) == Counter(f"order-{i}" for i in range(600))


@pytest.mark.parametrize("in_flight", [1, 8])
def test_a_cancelled_aio_call_releases_the_window_written_ahead_and_confirms_the_acked(
    broker: LocalBackend, clock: Clock, tmp_path: Path, retry: RetryPolicy, in_flight: int
) -> None:
    """task.cancel() while window 2's intents are being written: CancelledError, and the
    ledger holds window 1 confirmed and nothing of window 2."""
    import asyncio
    import threading

    from sendonce.aio import IdempotentSender as AsyncSender
    from sendonce.aio import ThreadedBackend

    writing = threading.Event()
    cancelled = threading.Event()

    def hold() -> None:
        writing.set()
        assert cancelled.wait(10)

    sqlite_url = f"sqlite://{tmp_path / 'ledger.db'}"

    class Acked:
        """Counts the acks handed back to the sender (stored is not enough: a transfer the
        worker thread finished may not have reached its task yet when the test cancels)."""

        def __init__(self, inner: ThreadedBackend) -> None:
            self.inner, self.acks = inner, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def send(self, *args: Any, **kw: Any) -> Any:
            acks = await self.inner.send(*args, **kw)
            self.acks += 1
            return acks

    async def scenario(ledger: Ledger) -> None:
        async with ThreadedBackend(LocalBackend(broker.path, clock=clock)) as threaded:
            backend = Acked(threaded)
            async with AsyncSender(
                backend,  # type: ignore[arg-type]
                PROFILE,
                retry=retry,
                ledger=ledger,
                max_batch_messages=10,
                max_in_flight=in_flight,
            ) as sender:
                task = asyncio.ensure_future(sender.send_many([msg(i) for i in range(600)]))
                await asyncio.to_thread(writing.wait, 10)
                for _ in range(1000):  # until window 1 is acknowledged (10 s at most)
                    if backend.acks >= 25:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0)  # the last transfer's task returns its acks
                task.cancel()
                cancelled.set()
                with pytest.raises(asyncio.CancelledError):
                    await task

    with Ledger(sqlite_url, clock=clock) as plain_ledger:
        ledger = Ledger(Pausing(plain_ledger.store, at=2, before=hold), clock=clock)  # type: ignore[arg-type]
        asyncio.run(scenario(ledger))
        assert broker.count("orders") == 250
        rows = plain_ledger.store.lookup("orders", keys(range(600)))
        assert sorted(rows) == sorted(keys(range(250)))
        assert all(r.confirmed_at is not None for r in rows.values())
        clock.now += 2 * WINDOW
        with IdempotentSender(broker, PROFILE, retry=retry, ledger=plain_ledger) as again:
            rerun = again.send_many([msg(i) for i in range(600)])
    assert rerun.in_doubt == [] and rerun.sent == 350
    assert Counter(broker.message_ids("orders")) == Counter(f"order-{i}" for i in range(600))


def test_both_intent_statements_write_the_same_rows(tmp_path: Path) -> None:
    """SQLite: a write of unpartitioned keys packs them in SQL (ids and digests in one
    piece each), any other in Python: the rows, and what a later write finds, are alike."""
    from sendonce.ledger._sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "ledger.db"))
    try:
        at = datetime(2026, 1, 1, tzinfo=UTC)
        plain = [Key("é/1", ""), Key("b", "")]
        mixed = [Key("c", ""), Key("d", "p/q")]
        digests = [body_digest(msg(i)) for i in range(2)]
        assert store.record_intents("orders", plain, digests, first_attempt=at, owner="a") == {}
        assert store.record_intents("orders", mixed, digests, first_attempt=at, owner="b") == {}
        rows = store.read(
            lambda conn: conn.execute("SELECT k, digest FROM ledger_keys ORDER BY rowid").fetchall()
        )
        assert rows == [
            ("1:000é/1", digests[0].hex()),
            ("1:000b", digests[1].hex()),
            ("1:000c", digests[0].hex()),
            ("1:003p/qd", digests[1].hex()),
        ]
        again = store.record_intents(
            "orders", [*plain, *mixed], digests * 2, first_attempt=at, owner="c"
        )
        assert {k: (e.digest, e.owner) for k, e in again.items()} == {
            plain[0]: (digests[0], "a"),
            plain[1]: (digests[1], "a"),
            mixed[0]: (digests[0], "b"),
            mixed[1]: (digests[1], "b"),
        }
    finally:
        store.close()
