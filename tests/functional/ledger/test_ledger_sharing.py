"""How people hold a ledger: shared by threads, two handles on one file, across a fork.

A service keeps one ledger for several senders (one per entity or per thread); a
driver keeps its ledger open while workers fork from it. Each shape ends with every
key confirmed and every message on the broker exactly once.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from sendonce import EntityProfile, IdempotentSender, Ledger, Message, RetryPolicy
from sendonce.backends import LocalBackend
from sendonce.ledger import Key

PROFILE = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=10))
RETRY = RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)


def msg(i: int) -> Message:
    return Message(f"body {i}", message_id=f"order-{i}")


def on_broker(path: Path) -> Counter[str]:
    with LocalBackend(path) as broker:
        return Counter(m.message_id for m in broker.receive("orders", max_messages=100_000))


def confirmed(ledger: Ledger, n: int) -> int:
    rows = ledger.store.lookup("orders", [Key(f"order-{i}", "") for i in range(n)])
    return sum(1 for r in rows.values() if r.confirmed_at is not None)


def test_threads_sharing_one_ledger_send_each_key_once(tmp_path: Path, ledger_url: str) -> None:
    """Four threads, one sender each, one ledger object, the same 300 orders at once."""
    errors: list[BaseException] = []
    reports = []
    with LocalBackend(tmp_path / "broker.db") as broker, Ledger(ledger_url) as ledger:
        start = threading.Barrier(4)

        def produce(offset: int) -> None:
            try:
                order = [msg((i + offset) % 300) for i in range(300)]
                with IdempotentSender(
                    broker, PROFILE, retry=RETRY, ledger=ledger, max_batch_messages=25
                ) as sender:
                    start.wait()
                    reports.append(sender.send_many(order))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(k * 75,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert all(r.failed == 0 for r in reports)
        assert sum(r.sent for r in reports) == 300
        assert confirmed(ledger, 300) == 300
    assert on_broker(tmp_path / "broker.db") == Counter(f"order-{i}" for i in range(300))


def test_two_ledger_handles_on_one_file_in_one_process(tmp_path: Path) -> None:
    """One sender per entity, each with its own Ledger on the same file (one connection)."""
    url = f"sqlite://{tmp_path / 'ledger.db'}"
    with LocalBackend(tmp_path / "broker.db") as broker:
        with Ledger(url) as first, Ledger(url) as second:
            a = IdempotentSender(broker, PROFILE, retry=RETRY, ledger=first)
            b = IdempotentSender(broker, PROFILE, retry=RETRY, ledger=second)
            for k in range(10):
                batch = [msg(i) for i in range(k * 10, k * 10 + 15)]  # overlaps the next one
                (a if k % 2 else b).send_many(batch)
            first.close()  # the other handle keeps working on the shared connection
            assert b.send_many([msg(i) for i in range(110)]).sent == 5
            assert confirmed(second, 110) == 110
    assert on_broker(tmp_path / "broker.db") == Counter(f"order-{i}" for i in range(110))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_uses_the_ledger_it_inherited(tmp_path: Path) -> None:
    """The parent keeps its ledger and broker open across fork; both go on sending."""
    url = f"sqlite://{tmp_path / 'ledger.db'}"
    with LocalBackend(tmp_path / "broker.db") as broker, Ledger(url) as ledger:
        sender = IdempotentSender(broker, PROFILE, retry=RETRY, ledger=ledger)
        assert sender.send_many([msg(i) for i in range(50)]).sent == 50
        pid = os.fork()
        if pid == 0:  # the child: the inherited objects reopen their files on first use
            code = 1
            try:
                report = sender.send_many([msg(i) for i in range(100)])
                code = 0 if (report.sent, report.duplicates) == (50, 50) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        again = sender.send_many([msg(i) for i in range(150)])
        assert (again.sent, again.duplicates, again.failed) == (50, 100, 0)
        assert sorted(again.from_ledger) == sorted(f"order-{i}" for i in range(100))
        assert confirmed(ledger, 150) == 150
    assert on_broker(tmp_path / "broker.db") == Counter(f"order-{i}" for i in range(150))
