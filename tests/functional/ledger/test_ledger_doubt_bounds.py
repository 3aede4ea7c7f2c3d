"""Doubt bounded by what was in flight, on an entity without duplicate detection, where each
key left unconfirmed is a possible duplicate or a key to check by hand (docs/ledger.md,
"How much doubt a crash leaves"):

- a producer killed with SIGKILL mid-``send_many`` leaves unconfirmed at most the keys of
  its ``max_in_flight`` transfers (no intents written ahead beyond them), and the re-run
  reports exactly those in doubt and sends the rest once;
- an ``aio`` ``send_many`` cancelled mid-call, or a sync one interrupted with Ctrl-C,
  leaves unconfirmed only keys the broker may have stored: transfers still queued (behind
  the backend's worker thread, or never started) are released.

Real processes and signals, a real broker file, both ledger stores.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from _interrupts import sigint_default
from sendonce import EntityProfile, IdempotentSender, Ledger, Message
from sendonce.aio import IdempotentSender as AsyncSender
from sendonce.aio import ThreadedBackend
from sendonce.backends import LocalBackend
from sendonce.errors import ValidationError
from sendonce.ledger import Key
from sendonce.testing import Fault, FaultyBackend

PRODUCER = str(Path(__file__).with_name("doubt_producer.py"))
COUNT = 4000
TRANSFER = 50  # the producer's max_batch_messages
PAD = "x" * 100


def ids(count: int) -> list[str]:
    return [f"row-{i}" for i in range(count)]


def unconfirmed(url: str, count: int) -> set[str]:
    """The keys the ledger holds as intents never confirmed, but for staged ones (written
    ahead, never sent: the next writer takes them over): what a re-run finds in doubt."""
    with Ledger(url) as ledger:
        rows = ledger.lookup("audit", [Key(i, f"k{n % 7}") for n, i in enumerate(ids(count))])
    return {
        key.message_id
        for key, row in rows.items()
        if row.confirmed_at is None and row.outcome not in ("staged", "taken")
    }


def stored(db: Path) -> Counter[str]:
    with LocalBackend(db) as broker:
        return Counter(broker.message_ids("audit"))


def start(db: Path, url: str, in_flight: int, mode: str = "sync") -> subprocess.Popen[str]:
    # Each ack 5 ms late: the call lasts long enough to be stopped midway on any machine.
    args = [sys.executable, PRODUCER, str(db), url, str(COUNT), str(in_flight), mode, "0", "0.005"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "sending"
    return proc


def once_stored(db: Path, proc: subprocess.Popen[str], at_least: int) -> None:
    """Wait until the broker holds ``at_least`` rows: the producer is mid-call."""
    with LocalBackend(db) as broker:
        while held(broker) < at_least:
            assert proc.poll() is None, "the producer finished before it could be stopped"
            time.sleep(0.005)


def held(broker: LocalBackend) -> int:
    try:
        return broker.count("audit")
    except ValidationError:  # the producer has not created the entity yet
        return 0


def rerun(db: Path, url: str) -> dict[str, Any]:
    args = [sys.executable, PRODUCER, str(db), url, str(COUNT), "4", "sync", "0"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    summary: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return summary


def check_rerun(db: Path, url: str, doubt: set[str]) -> None:
    """The re-run reports exactly the keys left in doubt and sends every other row once."""
    summary = rerun(db, url)
    assert set(summary["in_doubt"]) == doubt and summary["failed"] == len(doubt)
    on_broker = stored(db)
    assert max(on_broker.values()) == 1  # nothing twice
    assert set(ids(COUNT)) - doubt <= set(on_broker)  # nothing lost that is not reported


@pytest.mark.parametrize(
    ("ledger_url", "in_flight"),
    [("sqlite", 1), ("sqlite", 4), pytest.param("postgres", 4, marks=pytest.mark.postgres)],
    indirect=["ledger_url"],
)
def test_a_kill_9_leaves_at_most_the_transfers_in_flight_in_doubt(
    tmp_path: Path, ledger_url: str, in_flight: int
) -> None:
    db = tmp_path / "broker.db"
    proc = start(db, ledger_url, in_flight)
    once_stored(db, proc, COUNT // 3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    doubt = unconfirmed(ledger_url, COUNT)
    # Before the rule, two write-ahead windows (up to 32 transfers or 256 messages each)
    # were unconfirmed here; now only the transfers in flight can be.
    assert len(doubt) <= in_flight * TRANSFER
    check_rerun(db, ledger_url, doubt)


def test_ctrl_c_of_a_sync_send_many_leaves_only_keys_the_broker_may_have(
    tmp_path: Path, ledger_url: str
) -> None:
    """SIGINT as at a terminal: no transfer starts after it, those in flight end and are
    confirmed, those never attempted are released."""
    db = tmp_path / "broker.db"
    with sigint_default():
        proc = start(db, ledger_url, 4)
    once_stored(db, proc, COUNT // 3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in out, err
    doubt = unconfirmed(ledger_url, COUNT)
    on_broker = stored(db)
    assert doubt <= set(on_broker)  # nothing the broker never got is left in doubt
    assert len(doubt) <= 4 * TRANSFER
    assert len(on_broker) < COUNT  # it was interrupted mid-call
    check_rerun(db, ledger_url, doubt)


def test_cancelling_an_aio_send_many_releases_the_transfers_queued_behind_the_backend(
    tmp_path: Path, ledger_url: str
) -> None:
    """The issue's case: an aio sender on the local broker (one worker thread), 16
    transfers in flight, a generator of rows, the task cancelled mid-call. The transfers
    queued behind the worker never reached the broker: they are released, and what stays
    unconfirmed was stored (the call the worker was running, and any it ended unseen).
    Each ack comes 50 ms late, so the queue fills whichever store the ledger is on."""
    db = tmp_path / "broker.db"
    profile = EntityProfile("audit", duplicate_detection=False, partitioned=True)
    count = 20_000  # transfers of ~1,300 rows (the entity's 256 KB): 15 of them

    def rows() -> Any:  # no partition key: transfers of any rows run side by side
        for i in range(count):
            yield Message(f'{{"row": {i}, "note": "{PAD}"}}', message_id=f"row-{i}")

    async def cancelled_midway() -> None:
        slow = FaultyBackend(LocalBackend(db), lambda *_: Fault.SLOW_ACK, slow_ack_delay=0.05)
        async with (  # a broker slower than the ledger: transfers queue behind its thread
            ThreadedBackend(slow) as backend,
            AsyncSender(backend, profile, ledger=ledger_url, max_in_flight=16) as sender,
        ):
            task = asyncio.ensure_future(sender.send_many(rows()))
            with LocalBackend(db) as broker:
                while held(broker) < count // 2:  # the backend's queue has filled
                    assert not task.done(), "the call ended before it could be cancelled"
                    await asyncio.sleep(0.1)  # seldom: a count holds up the event loop
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(cancelled_midway())
    with Ledger(ledger_url) as ledger:
        keys = [Key(*profile.dedup_key(m)) for m in rows()]
        rows_ = ledger.lookup("audit", keys)
    doubt = {k.message_id for k, row in rows_.items() if row.confirmed_at is None}
    on_broker = stored(db)
    assert len(on_broker) < count  # it was cancelled mid-call
    assert doubt <= set(on_broker)  # before: thousands of never-sent keys stayed in doubt
    with IdempotentSender(f"local:{db}", profile, ledger=ledger_url) as again:
        report = again.send_many(rows())  # the re-run: in doubt exactly what is unconfirmed
    assert set(report.in_doubt) == doubt and report.failed == len(doubt)
    assert stored(db) == dict.fromkeys({f"row-{i}" for i in range(count)}, 1)


# -- staged intents: written ahead on SQLite, never in doubt ----------------------------------

MARGIN = timedelta(seconds=5)


def orders(n: int, body: str = "order") -> tuple[list[Message], list[Key]]:
    messages = [Message(f"{body} {i}", message_id=f"order-{i}") for i in range(n)]
    return messages, [Key(m.message_id) for m in messages]


def test_a_staged_intent_is_taken_over_by_the_next_writer_and_its_stager_cannot_arm(
    tmp_path: Path,
) -> None:
    """Writer A stages 3 intents and stops before arming (a crash, or only slow): writer B
    takes them over (it sends them), and A's arm fails, so A never sends them."""
    url = f"sqlite://{tmp_path / 'ledger.db'}"
    messages, keys = orders(3)
    with Ledger(url) as first, Ledger(url) as second:
        assert first.stages
        staged = first.prepare("audit", messages, keys, window=timedelta(0), margin=MARGIN,
                               staged=True)  # fmt: skip
        assert staged.send == [0, 1, 2]
        taken = second.prepare("audit", messages[:2], keys[:2], window=timedelta(0),
                               margin=MARGIN)  # fmt: skip
        assert taken.send == [0, 1] and not taken.in_doubt  # never sent by A: not in doubt
        assert not first.arm("audit", staged.owner)  # two of its intents are B's now
        rows = first.lookup("audit", keys)
        assert {k.message_id for k, r in rows.items() if r.owner == taken.owner} == {
            "order-0",
            "order-1",
        }
        # A stages again; nobody interferes: it arms, and its intents are plain intents,
        # in doubt for anyone else (A may be sending them).
        again = first.prepare("audit", messages[2:], keys[2:], window=timedelta(0),
                              margin=MARGIN, staged=True)  # fmt: skip
        assert again.send == [0]  # A's own staged row of order-2 is taken back
        assert first.arm("audit", again.owner)
        late = second.prepare("audit", messages[2:], keys[2:], window=timedelta(0),
                              margin=MARGIN)  # fmt: skip
        assert late.send == [] and len(late.in_doubt) == 1


def test_a_staged_intent_with_another_body_is_a_conflict_not_taken_over(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'ledger.db'}"
    messages, keys = orders(2)
    others, _ = orders(2, body="another order")
    with Ledger(url) as first, Ledger(url) as second:
        staged = first.prepare("audit", messages, keys, window=timedelta(0), margin=MARGIN,
                               staged=True)  # fmt: skip
        met = second.prepare("audit", others, keys, window=timedelta(0), margin=MARGIN)
        assert met.send == [] and len(met.conflicts) == 2
        assert first.arm("audit", staged.owner)  # nothing was taken


def test_a_sender_whose_staged_window_was_taken_over_sends_none_of_the_taken_keys(
    tmp_path: Path,
) -> None:
    """Between a window's staging and its arming another producer takes over half of it
    (it met them staged): the sender's arm fails, it decides those keys again (the other
    producer's intents now: in doubt) and sends only the rest. Each order lands once."""
    db, url = tmp_path / "broker.db", f"sqlite://{tmp_path / 'ledger.db'}"
    profile = EntityProfile("audit", duplicate_detection=False)
    messages = [Message(f"order {i}", message_id=f"order-{i}") for i in range(40)]
    with Ledger(url) as plain, Ledger(url) as other, LocalBackend(db) as broker:

        class Intervening:
            """The store, with another producer taking over orders 20-24 (staged: the third
            window) before they are armed."""

            def __init__(self, inner: Any) -> None:
                self.inner, self.arms, self.results = inner, 0, []

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

            def arm(self, *args: Any) -> bool:
                self.arms += 1
                if self.arms == 2:
                    taken = other.prepare("audit", messages[20:25],
                                          [Key(m.message_id) for m in messages[20:25]],
                                          window=timedelta(0), margin=MARGIN)  # fmt: skip
                    assert taken.send == [0, 1, 2, 3, 4]  # found staged: taken over
                    broker.send("audit", messages[20:25], timeout=10)  # ... and sent
                armed: bool = self.inner.arm(*args)
                self.results.append(armed)
                return armed

        store = Intervening(plain.store)
        ledger = Ledger(store)  # type: ignore[arg-type]
        with IdempotentSender(broker, profile, ledger=ledger, max_batch_messages=10) as sender:
            report = sender.send_many(messages)
    assert store.results == [True, False, True]  # windows 2-4 staged; the third was taken
    assert sorted(report.in_doubt) == sorted(m.message_id for m in messages[20:25])
    assert report.sent == 35 and report.failed == 5
    assert stored(db) == {m.message_id: 1 for m in messages}


def test_staged_keys_are_not_listed_in_doubt_nor_resolvable_by_hand(tmp_path: Path) -> None:
    """What a crashed sender staged is not in doubt: `ledger in-doubt` and `stats` leave it
    out, and confirming it by hand (which would lose it) is refused."""
    from datetime import UTC, datetime

    from sendonce.ledger._inspect import check_resolvable, entity_counts, unconfirmed

    url = f"sqlite://{tmp_path / 'ledger.db'}"
    messages, keys = orders(4)
    with Ledger(url) as ledger:
        ledger._prepare("audit", messages[:2], keys[:2], window=timedelta(0), margin=MARGIN)
        ledger._prepare("audit", messages[2:], keys[2:], window=timedelta(0), margin=MARGIN,
                       staged=True)  # fmt: skip
        assert [u.key for u in unconfirmed(ledger.store, "audit")] == keys[:2]
        [counts] = entity_counts(ledger.store)
        assert (counts.keys, counts.unconfirmed) == (2, 2)
        _, refusals = check_resolvable(
            ledger, "audit", keys[2:], min_age=timedelta(0), now=datetime.now(UTC)
        )
        assert [r.reason for r in refusals] == ["staged", "staged"]
