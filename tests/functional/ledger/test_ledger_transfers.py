"""Transfers: what the ledger writes per transfer, on both stores, with a real broker file.

A transfer's intents are one write; its usual confirmation ("every intent acked") is
one row; the next transfer's intents are written while this one is sent. These tests
hold each of those to the ledger's guarantees: an intent is durable before its
transfer's first attempt, nothing confirmed is lost, nothing unsent stays behind.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ledger_helpers import T0, WINDOW, Clock, msg

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

    def __init__(self, inner: LocalBackend, ledger: Ledger) -> None:
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
        found = self.ledger.store.lookup(entity, wanted)
        self.missing += [k.message_id for k in wanted if k not in found]
        return self.inner.send(entity, messages, **kw)


def test_every_intent_is_durable_before_its_transfers_first_attempt(
    broker: LocalBackend, clock: Clock, ledger_url: str, retry: RetryPolicy
) -> None:
    """Intents are written ahead, in a worker thread: never later than the attempt."""
    with Ledger(ledger_url, clock=clock) as ledger:
        watching = Watching(broker, ledger)
        with IdempotentSender(
            watching, PROFILE, retry=retry, ledger=ledger, max_batch_messages=7
        ) as sender:
            report = sender.send_many([msg(i) for i in range(100)])
        assert report.sent == 100 and watching.sends == 15
        assert watching.missing == []
        rows = ledger.store.lookup("orders", keys(range(100)))
    assert len(rows) == 100
    assert all(r.confirmed_at is not None and r.outcome == "sent" for r in rows.values())
    assert len({r.owner for r in rows.values()}) == 15  # one transfer per batch


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
    """The file goes away after the first transfer: every later transfer fails, unsent."""
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
            Removing(), PROFILE, retry=retry, ledger=ledger, max_batch_messages=10
        ) as sender:
            report = sender.send_many([msg(i) for i in range(40)])
    # Transfer 2's intents may have been written (ahead) before the move: then it is sent.
    assert report.sent in (10, 20) and report.failed == 40 - report.sent
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
    assert version.fetchone() == ("2",)
    assert check.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'sendonce_ledger'"
    ).fetchone() == (0,)
    check.close()


def test_a_confirmed_transfer_costs_one_row_not_one_per_key(
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
    assert transfers == (10, 1000)


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
