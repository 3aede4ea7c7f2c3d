"""``sender.transaction()`` on Artemis is one AMQP transaction: all or nothing, and a
duplicate member rolls the whole group back."""

from __future__ import annotations

from artemis.raw import drain
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy

FAST = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05, attempt_timeout=10)


def test_a_group_commits_all_or_nothing(artemis_broker, artemis_address):
    url = artemis_broker.url()
    with IdempotentSender(url, EntityProfile(artemis_address, id_cache_size=100), retry=FAST) as s:
        with s.transaction() as tx:
            tx.send(Message("a", message_id="a"))
            tx.send(Message("b", message_id="b"))
        assert tx.report is not None and tx.report.sent == 2
        # "b" again, beside a new "c": Artemis rolls the whole group back.
        with s.transaction() as tx:
            tx.send(Message("c", message_id="c"))
            tx.send(Message("b", message_id="b"))
        report = tx.report
        assert report is not None
        assert [r.message_id for r in report.results if r.outcome == "duplicate"] == ["b"]
        assert [f.message_id for f in report.failures] == ["c"]
        assert report.failures[0].error.condition == "sendonce:group-ignored"
        # The rolled-back "c" left no trace in the id cache: it can be sent now.
        assert s.send(Message("c", message_id="c")).outcome == "sent"
    assert [m.id for m in drain(url, artemis_address)] == ["a", "b", "c"]
