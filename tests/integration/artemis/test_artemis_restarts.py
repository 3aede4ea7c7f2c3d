"""The broker killed (``kill -9`` of its JVM) mid-send and restarted (issue 29 item 3).

Each test starts its own broker (the session's is shared): slow, under ``-m slow``. What
the broker holds at the end is read with a hand-written proton client (``artemis.raw``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from artemis.broker import ArtemisBroker
from artemis.raw import browse_ids, drain, message_count, wait_for
from sendonce import EntityProfile, IdempotentSender, Ledger, Message, RetryPolicy
from sendonce.errors import InDoubtError

pytestmark = pytest.mark.slow

# Long enough to ride out a restart (5-15 s on a loaded 2-core machine).
THROUGH_A_RESTART = RetryPolicy(
    max_attempts=60, initial_backoff=0.2, max_backoff=1.0, attempt_timeout=15
)
N = 3000


def profile(name: str) -> EntityProfile:
    return EntityProfile(name, id_cache_size=20_000, persist_id_cache=False)


def business(n: int, prefix: str) -> list[Message]:
    return [
        Message(f"body {i}", message_id=f"{prefix}-{i}", partition_key=f"k{i % 8}")
        for i in range(n)
    ]


def send_and_kill(broker: ArtemisBroker, sender: IdempotentSender, messages: list[Message]):
    """``send_many`` in a thread; ``kill -9`` of the broker once it holds a sixth of them;
    a restart; the report."""
    url = broker.url()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(sender.send_many, messages)
        wait_for(lambda: message_count(url, "orders") >= N // 6, what="a sixth stored")
        broker.kill()
        assert not running.done()
        broker.start()
        return running.result(timeout=600)


def test_killed_and_restarted_with_its_id_cache_every_id_is_stored_once():
    with ArtemisBroker(persist_id_cache=True) as broker:
        assert drain(broker.url(), "orders") == []  # a receiver's attach makes the queue
        messages = business(N, "order")
        with IdempotentSender(
            broker.url(), "orders", retry=THROUGH_A_RESTART, max_batch_messages=20
        ) as sender:
            assert sender.profile.persist_id_cache
            report = send_and_kill(broker, sender, messages)
        assert report.sent == N and not report.failures
        assert max(r.attempts for r in report.results) >= 2  # some were in flight at the kill
        got = [m.id for m in drain(broker.url(), "orders")]
    assert len(got) == N
    assert sorted(got) == sorted(m.message_id for m in messages)


def test_killed_and_restarted_without_its_id_cache_the_ledger_keeps_each_id_once(
    tmp_path: Path,
):
    """persist-id-cache=false: the restarted broker remembers no id. A resend of what was
    in flight at the kill is reported in doubt (it may be stored), and a re-run would store
    everything again: the ledger skips what was confirmed, and the operator decides the
    rest by looking at the queue."""
    with ArtemisBroker(persist_id_cache=False) as broker:
        url = broker.url()
        assert drain(url, "orders") == []  # a receiver's attach makes the queue
        with IdempotentSender(url, profile("plain")) as plain:
            plain.send(Message("stored before the restart", message_id="p-1"))
        messages = business(N, "order")
        ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
        with (
            Ledger(ledger_url, create=True) as ledger,
            IdempotentSender(
                url, "orders", retry=THROUGH_A_RESTART, max_batch_messages=20, ledger=ledger
            ) as sender,
        ):
            assert not sender.profile.persist_id_cache
            first = send_and_kill(broker, sender, messages)
        in_doubt = {f.message_id for f in first.failures}
        assert in_doubt, "the transfers in flight at the kill are in doubt"
        assert all(isinstance(f.error, InDoubtError) for f in first.failures)
        assert "restarted" in str(first.failures[0].error)
        assert first.sent == N - len(in_doubt)

        # Without a ledger, the restarted broker takes a known id again (what the ledger
        # is for): "p-1" was stored before the restart.
        with IdempotentSender(url, profile("plain")) as plain:
            plain.send(Message("stored before the restart", message_id="p-1"))
        assert browse_ids(url, "plain") == ["p-1", "p-1"]

        # The job runs again (a new process): the ledger skips every confirmed id and
        # still holds the doubtful ones back.
        with (
            Ledger(ledger_url) as ledger,
            IdempotentSender(url, "orders", retry=THROUGH_A_RESTART, ledger=ledger) as sender,
        ):
            again = sender.send_many(messages)
        assert again.sent == 0
        assert {f.message_id for f in again.failures} == in_doubt
        assert len(again.from_ledger) == N - len(in_doubt)

        # The operator looks at the queue: what is there was stored, the rest was not.
        stored = set(browse_ids(url, "orders"))
        with Ledger(ledger_url) as ledger:
            rows = ledger.lookup("orders", sorted(in_doubt))
            ledger.confirm("orders", {k: "resolved" for k in rows if k.message_id in stored})
            for key, row in rows.items():
                if key.message_id not in stored:
                    ledger.release("orders", [key], row.owner)
            with IdempotentSender(url, "orders", retry=THROUGH_A_RESTART, ledger=ledger) as s:
                last = s.send_many(messages)
        assert not last.failures
        assert last.sent == len(in_doubt - stored)
        got = [m.id for m in drain(url, "orders")]
    assert len(got) == N
    assert sorted(got) == sorted(m.message_id for m in messages)
