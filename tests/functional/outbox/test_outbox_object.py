"""``Outbox(url)``: the outbox as an object, like ``Ledger(url)``; the functions delegate to it.

Against a real PostgreSQL database and the local broker: install, a row that can never be
sent moved aside, read back, requeued and then published once.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sendonce import EntityProfile, Message
from sendonce.backends import LocalBackend
from sendonce.errors import ConfigurationError
from sendonce.outbox import SCHEMA_VERSION, Outbox, dead_rows, enqueue, install, requeue, stats

pytestmark = pytest.mark.postgres


def test_a_url_that_is_not_postgresql_is_refused_before_anything_connects() -> None:
    for url in ("sqlite:///tmp/outbox.db", "local:///tmp/broker.db", ""):
        with pytest.raises(ConfigurationError) as bad:
            Outbox(url)
        assert bad.value.field == "outbox"


def test_its_repr_hides_the_password() -> None:
    outbox = Outbox("postgresql://app:s3cret-pw@db.example:5432/shop")
    assert "s3cret-pw" not in repr(outbox)
    assert repr(outbox).startswith("Outbox('postgresql://app:")


def test_install_stats_dead_rows_and_requeue_through_the_object(
    outbox_url: str, broker: LocalBackend, tmp_path: Path
) -> None:
    with Outbox(outbox_url) as outbox:
        assert outbox.install() == 0  # nothing before
        assert outbox.install() == SCHEMA_VERSION  # idempotent: found the current version
        assert outbox.stats() == []
        small = EntityProfile("orders", max_message_size=1024)
        rows = [Message("ok", message_id="a"), Message("x" * 2000, message_id="big")]
        with psycopg.connect(outbox_url) as conn:
            enqueue(conn, rows, entity="orders")
            conn.commit()
        with outbox.relay(broker, [small]) as relay:
            relay.drain()
        assert broker.message_ids("orders") == ["a"]
        (dead,) = outbox.dead_rows()
        assert (dead.message_id, dead.reason) == ("big", "invalid")
        assert outbox.dead_rows(entity="ORDERS") == [dead]  # entity names ignore case
        assert outbox.dead_rows(entity="other") == []
        (row,) = outbox.stats()
        assert (row.entity, row.pending, row.published, row.dead) == ("orders", 0, 1, 1)
        # The functions of the same names read the same rows.
        assert stats(outbox_url) == outbox.stats()
        assert dead_rows(outbox_url) == [dead]
        # The entity moves to a broker with a larger limit; the operator puts the row back
        # and it goes out once (the row published before stays published).
        assert outbox.requeue("orders", ["big", "never-dead"]) == ["big"]
        assert outbox.dead_rows() == []
        with (
            LocalBackend(tmp_path / "larger.db") as larger,
            outbox.relay(larger, [EntityProfile("orders")]) as relay,
        ):
            relay.drain()
            assert larger.message_ids("orders") == ["big"]
        assert requeue(outbox_url, "orders") == []  # nothing dead is left


def test_closing_lets_it_reopen_and_install_takes_a_url_or_a_connection(outbox_url: str) -> None:
    with psycopg.connect(outbox_url) as conn:
        assert install(conn) == 0  # inside the caller's transaction
        conn.commit()
    outbox = Outbox(outbox_url)
    assert outbox.stats() == []
    outbox.close()
    outbox.close()  # twice is fine
    assert outbox.stats() == []  # reopens on use
    outbox.close()
    assert install(outbox_url) == SCHEMA_VERSION
