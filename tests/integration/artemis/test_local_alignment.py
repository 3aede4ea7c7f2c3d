"""The local broker's Artemis mode against the real broker: the same scenario through the
same sender on both, the reports compared (docs/artemis.md lists what differs and why).
"""

from __future__ import annotations

from pathlib import Path

from artemis.raw import browse_ids, raw_transaction
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends.local import LocalBackend

FAST = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05, attempt_timeout=10)


def _group_with_a_repeated_id(sender: IdempotentSender) -> list[tuple[str, str]]:
    with sender.transaction() as tx:
        tx.send(Message("1", message_id="r-1"))
        tx.send(Message("2", message_id="r-2"))
        tx.send(Message("1", message_id="r-1"))  # the same message twice
    report = tx.report
    assert report is not None
    found = [(r.message_id, r.outcome) for r in report.results]
    found += [(f.message_id, f.error.condition or "") for f in report.failures]
    return sorted(found)


def test_the_broker_commits_a_transaction_that_repeats_an_id_and_stores_both(
    artemis_broker, artemis_address
):
    url = artemis_broker.url()
    assert raw_transaction(url, artemis_address, [("a", 1), ("a", 2)])[0] == "committed"
    assert len(browse_ids(url, artemis_address)) == 2  # one id, two copies


def test_a_group_repeating_an_id_is_ignored_whole_on_both_brokers(
    artemis_broker, artemis_address, tmp_path: Path
):
    profile = EntityProfile(artemis_address, id_cache_size=100)
    with IdempotentSender(artemis_broker.url(), profile, retry=FAST) as sender:
        on_artemis = _group_with_a_repeated_id(sender)
    with (
        LocalBackend(tmp_path / "broker.db") as local,
        IdempotentSender(local, profile, retry=FAST) as sender,
    ):
        on_local = _group_with_a_repeated_id(sender)
        assert local.message_ids(artemis_address) == []
    assert on_artemis == on_local
    assert browse_ids(artemis_broker.url(), artemis_address) == []
