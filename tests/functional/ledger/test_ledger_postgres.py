"""The PostgreSQL store when its connection is lost: reconnects, or sends nothing unrecorded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sendonce import EntityProfile, IdempotentSender, Ledger, LedgerError, Message, RetryPolicy
from sendonce.backends import LocalBackend
from sendonce.ledger import Key

pytestmark = pytest.mark.postgres


def msg(i: int) -> Message:
    return Message(f"body {i}", message_id=f"order-{i}")


def _admin(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/postgres"


def _terminate_others(url: str) -> None:
    """Kill every other session on the ledger's database (what a failover or restart does)."""
    with psycopg.connect(_admin(url), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (url.rsplit("/", 1)[1],),
        )


class CutLedgerAfter:
    """A backend that, after its n-th send, cuts the ledger's connection (or the database)."""

    def __init__(self, inner: LocalBackend, n: int, cut: Any) -> None:
        self.inner, self.n, self.cut, self.calls = inner, n, cut, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send(self, entity: str, messages: Sequence[Message], **kw: Any) -> Any:
        acks = self.inner.send(entity, messages, **kw)
        self.calls += 1
        if self.calls == self.n:
            self.cut()
        return acks


@pytest.fixture
def pg_ledger_url(ledger_url: str) -> str:
    if not ledger_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    return ledger_url


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_a_connection_lost_between_transfers_is_reopened(
    tmp_path: Path, pg_ledger_url: str
) -> None:
    url = pg_ledger_url
    with LocalBackend(tmp_path / "b.db") as broker, Ledger(url) as ledger:
        backend = CutLedgerAfter(broker, 2, lambda: _terminate_others(url))
        with IdempotentSender(
            backend, EntityProfile("orders"), ledger=ledger, max_batch_messages=10
        ) as sender:
            report = sender.send_many([msg(i) for i in range(50)])
        assert (report.sent, report.failed) == (50, 0)
        rows = ledger.store.lookup("orders", [Key(f"order-{i}", "") for i in range(50)])
        assert all(r.confirmed_at is not None for r in rows.values()) and len(rows) == 50
        assert broker.count("orders") == 50


@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_an_unreachable_ledger_sends_nothing_more_and_a_rerun_completes(
    tmp_path: Path, pg_ledger_url: str
) -> None:
    url = pg_ledger_url
    name = url.rsplit("/", 1)[1]

    def take_the_database_away() -> None:
        with psycopg.connect(_admin(url), autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        _terminate_others(url)

    retry = RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)
    with LocalBackend(tmp_path / "b.db") as broker:
        with Ledger(url) as ledger:
            backend = CutLedgerAfter(broker, 2, take_the_database_away)
            with IdempotentSender(
                backend, EntityProfile("orders"), retry=retry, ledger=ledger, max_batch_messages=100
            ) as sender:
                report = sender.send_many([msg(i) for i in range(900)])
        # Intents are written a window ahead (here two transfers of 100). The database went
        # away after the first window's two transfers reached the broker. The second window's
        # intents are written while the first is sent, so they may have been durable in time
        # (then it was sent too); no later window could record its intents, so none was sent.
        assert report.sent in (200, 400) and report.failed == 900 - report.sent
        assert all(isinstance(f.error, LedgerError) for f in report.failures)
        assert "not sent" in str(report.failures[0].error)
        assert broker.count("orders") == report.sent
        with psycopg.connect(_admin(url), autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        with IdempotentSender(broker, EntityProfile("orders"), retry=retry, ledger=url) as sender:
            again = sender.send_many([msg(i) for i in range(900)])
        # Confirmations lost with the database leave those keys unconfirmed: still inside
        # the window, they are resent and the broker drops the copies.
        assert again.failed == 0 and again.sent + again.duplicates == 900
        assert broker.count("orders") == 900


def test_a_confirmed_window_is_one_row_and_pruning_drops_it_with_its_keys(
    tmp_path: Path, pg_ledger_url: str
) -> None:
    from datetime import UTC, datetime, timedelta

    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    with LocalBackend(tmp_path / "b.db") as broker:
        with Ledger(pg_ledger_url, clock=lambda: now[0], retention=timedelta(days=1)) as ledger:
            with IdempotentSender(
                broker, EntityProfile("orders"), ledger=ledger, max_batch_messages=10
            ) as sender:
                assert sender.send_many([msg(i) for i in range(30)]).sent == 30
            with psycopg.connect(pg_ledger_url) as conn:
                per_key = conn.execute(
                    "SELECT count(*) FROM sendonce_ledger WHERE confirmed_at IS NOT NULL"
                ).fetchone()
                transfers = conn.execute("SELECT count(*) FROM sendonce_ledger_transfers")
                # Three transfers of 10 in one write-ahead window: confirmed as one row.
                assert (per_key, transfers.fetchone()) == ((0,), (1,))
            rows = ledger.store.lookup("orders", [Key(f"order-{i}", "") for i in range(30)])
            assert {(r.outcome, r.confirmed_at) for r in rows.values()} == {("sent", now[0])}
            now[0] += timedelta(days=2)
            assert ledger.prune(limit=25) == 25  # keys first; transfers once no old key is left
            assert ledger.prune(limit=25) == 5
            with psycopg.connect(pg_ledger_url) as conn:
                left = conn.execute("SELECT count(*) FROM sendonce_ledger_transfers").fetchone()
            assert left == (0,)
