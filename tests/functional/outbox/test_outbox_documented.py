"""What docs/outbox.md says the outbox does, checked against a real PostgreSQL: isolation
levels, what the calls return (issue 34 item 12)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import psycopg
import pytest

from sendonce import EntityProfile, Message
from sendonce.backends import LocalBackend
from sendonce.outbox import Relay, RelayTotals, enqueue, install

pytestmark = pytest.mark.postgres

DOC = (Path(__file__).parents[3] / "docs" / "outbox.md").read_text()


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _waiting_on_a_lock(url: str, pid: int) -> bool:
    with psycopg.connect(url, autocommit=True) as watcher:
        row = watcher.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return row is not None and row[0] == "Lock"


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_under_repeatable_read_the_second_transaction_waits_then_fails_if_the_first_committed(
    outbox_url: str, first_ends: str
) -> None:
    install(outbox_url)
    key = [Message("a", message_id="k-1", partition_key="k")]
    second_key = [Message("b", message_id="k-2", partition_key="k")]
    first = psycopg.connect(outbox_url)
    second = psycopg.connect(outbox_url)
    outcome: list[BaseException | str] = []
    try:
        for conn in (first, second):
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        second.execute("SELECT 1")  # the second's snapshot is taken before the first commits
        enqueue(first, key, entity="orders")

        def run_second() -> None:
            try:
                enqueue(second, second_key, entity="orders")
                second.commit()
                outcome.append("committed")
            except psycopg.Error as exc:
                second.rollback()
                outcome.append(exc)

        worker = threading.Thread(target=run_second)
        worker.start()
        pid = second.info.backend_pid
        while not _waiting_on_a_lock(outbox_url, pid):  # it waits: it has not failed
            assert worker.is_alive() and not outcome, outcome
            time.sleep(0.02)
        getattr(first, first_ends)()
        worker.join(timeout=60)
        assert not worker.is_alive()
    finally:
        first.close()
        second.close()
    if first_ends == "commit":
        (error,) = outcome
        assert isinstance(error, psycopg.errors.SerializationFailure)
        assert "could not serialize access due to concurrent update" in str(error)
    else:
        assert outcome == ["committed"]
    assert (
        "the second transaction also **waits** at its `enqueue` for the first to end; then, if "
        "the first committed, it fails with a serialization error"
    ) in _flat(DOC)


def test_what_enqueue_drain_and_run_return_is_what_the_doc_says(
    outbox_url: str, tmp_path: Path
) -> None:
    install(outbox_url)
    with psycopg.connect(outbox_url) as conn:
        assert enqueue(conn, [], entity="orders") == 0
        batch = [Message(str(n), message_id=f"m-{n}") for n in range(3)]
        assert enqueue(conn, batch, entity="orders") == 3
        conn.commit()
    with LocalBackend(tmp_path / "b.db") as broker:
        with Relay(outbox_url, broker, [EntityProfile("orders")], poll_interval=0.1) as relay:
            drained = relay.drain()
            assert isinstance(drained, RelayTotals)
            assert (drained.published, drained.dead, drained.dead_reasons) == (3, 0, {})
            runner = threading.Thread(target=lambda: result.append(relay.run()))
            result: list[RelayTotals] = []
            runner.start()
            relay.stop()
            runner.join(timeout=60)
        assert result == [relay.totals] and result[0].published == 3  # since it started
    flat = _flat(DOC)
    assert "`enqueue(conn, messages, *, entity, notify=True)` returns the number of rows" in flat
    assert "`relay.drain()` returns a `RelayTotals` of what that drain did" in flat
    assert "`relay.run()` returns the relay's `totals` since it started" in flat


def test_published_counts_rows_whose_copy_the_broker_dropped(
    outbox_url: str, tmp_path: Path
) -> None:
    """A relay killed after its transfer was stored, before it marked the rows: the next
    relay resends them, the broker drops the copies, and it counts them published, as the
    docs say (a sum of relay runs' counts can exceed what the broker stored)."""
    from sendonce import IdempotentSender

    install(outbox_url)
    batch = [Message(str(n), message_id=f"m-{n}") for n in range(3)]
    with psycopg.connect(outbox_url) as conn:
        enqueue(conn, batch, entity="orders")
        conn.commit()
    orders = EntityProfile("orders")
    with LocalBackend(tmp_path / "b.db") as broker:
        with IdempotentSender(broker, orders) as killed_relay:  # what it stored before dying
            assert killed_relay.send_many(batch[:2]).sent == 2
        with Relay(outbox_url, broker, [orders]) as relay:
            assert relay.drain().published == 3
        assert sorted(broker.message_ids("orders")) == ["m-0", "m-1", "m-2"]
    with psycopg.connect(outbox_url) as conn:
        outcomes = conn.execute("SELECT outcome FROM sendonce_outbox ORDER BY id").fetchall()
    assert outcomes == [("duplicate",), ("duplicate",), ("sent",)]
    flat = _flat(DOC)
    assert "`published` counts the rows the relay marked published, including rows whose" in flat
    assert "copy the broker dropped as a duplicate" in flat
