"""In doubt on the real broker: the connection is cut between the client and Artemis after
the broker took a transfer (or a commit) and before its answer came back. The sender resends
with the same ids; the broker drops what it already has; every message is there once."""

from __future__ import annotations

import logging

import pytest

from artemis.faultproxy import DISCHARGE, FaultProxy
from artemis.raw import drain
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends import ArtemisBackend

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.05, max_backoff=0.2, attempt_timeout=10)


@pytest.fixture
def proxy(artemis_broker):
    with FaultProxy("127.0.0.1", artemis_broker.port) as proxy:
        yield proxy


def through(proxy: FaultProxy, broker) -> ArtemisBackend:
    return ArtemisBackend("127.0.0.1", proxy.port, user=broker.user, password=broker.password)


def test_a_transfer_whose_answer_is_lost_is_resent_and_stored_once(
    artemis_broker, artemis_address, proxy, caplog
):
    caplog.set_level(logging.INFO, logger="sendonce")
    messages = [Message(f"order {i} MARK-{i}", message_id=f"o-{i}") for i in range(20)]
    proxy.cut_after(b"MARK-7")
    with (
        through(proxy, artemis_broker) as backend,
        IdempotentSender(
            backend, EntityProfile(artemis_address, id_cache_size=1000), retry=FAST
        ) as sender,
    ):
        report = sender.send_many(messages)
    assert proxy.fired.is_set() and proxy.connections == 2
    assert (report.sent, report.failed) == (20, 0)
    assert any(r.attempts == 2 for r in report.results)  # the in-doubt transfer, resent
    got = drain(artemis_broker.url(), artemis_address)
    assert sorted(m.id for m in got) == sorted(m.message_id for m in messages)
    assert "in doubt" in caplog.text


@pytest.mark.parametrize("cut", ["after", "before"])
def test_a_commit_lost_in_flight_is_resent_and_the_group_lands_once(
    artemis_broker, artemis_address, proxy, cut
):
    # "after": the broker committed, the answer is lost; "before": it never saw the commit.
    (proxy.cut_after if cut == "after" else proxy.cut_before)(DISCHARGE)
    with (
        through(proxy, artemis_broker) as backend,
        IdempotentSender(
            backend, EntityProfile(artemis_address, id_cache_size=1000), retry=FAST
        ) as sender,
    ):
        with sender.transaction() as tx:
            tx.send_many([Message(f"{i}", message_id=f"g-{i}") for i in range(3)])
    assert proxy.fired.is_set()
    report = tx.report
    assert report is not None
    assert [(r.message_id, r.outcome, r.attempts) for r in report.results] == [
        (f"g-{i}", "sent", 2) for i in range(3)
    ]
    assert [m.id for m in drain(artemis_broker.url(), artemis_address)] == ["g-0", "g-1", "g-2"]
