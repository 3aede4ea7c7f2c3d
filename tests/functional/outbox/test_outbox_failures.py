"""The relay when things go wrong: a broker that is down or loses acks, messages that can
never be sent, bad setups. Each ends with every committed message on the broker once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from sendonce import EntityProfile, Ledger, Message, RetryPolicy
from sendonce.backends import LocalBackend
from sendonce.errors import ConfigurationError, MessageSizeError, ValidationError
from sendonce.outbox import Relay, dead_rows, enqueue, install, requeue, stats
from sendonce.testing import Fault, FaultyBackend

pytestmark = pytest.mark.postgres

ORDERS = EntityProfile("orders", partitioned=True)
NO_WAIT = RetryPolicy(max_attempts=3, initial_backoff=0, max_backoff=0, sleep=lambda s: None)


def messages(key: str, *numbers: int, size: int = 0) -> list[Message]:
    return [
        Message(f"{key} {n}" + "x" * size, message_id=f"{key}-{n}", partition_key=key)
        for n in numbers
    ]


def committed(url: str, batch: Sequence[Message], entity: str = "orders") -> None:
    with psycopg.connect(url) as conn:
        enqueue(conn, batch, entity=entity)
        conn.commit()


def test_a_broker_that_refuses_and_loses_acks_gets_every_message_once_in_order(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    keys = ["a", "b", "c"]
    for n in range(6):
        committed(outbox_url, [m for k in keys for m in messages(k, n)])
    faults = [Fault.BEFORE_COMMIT, Fault.AFTER_COMMIT, Fault.BEFORE_COMMIT] * 10
    flaky = FaultyBackend(broker, faults)
    with Relay(outbox_url, flaky, [ORDERS], retry=NO_WAIT, per_key=2) as relay:
        while relay.drain().rounds:
            pass
        left = stats(outbox_url)[0]
    assert (left.pending, left.leased, left.dead) == (0, 0, 0)
    ids = broker.message_ids("orders")
    assert len(ids) == len(set(ids)) == 18
    for key in keys:
        assert [i for i in ids if i.startswith(key)] == [f"{key}-{n}" for n in range(6)]


def test_while_the_broker_is_down_the_relay_backs_off_and_loses_nothing(
    outbox_url: str, broker: LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    install(outbox_url)
    down = [True]

    def script(index: int, entity: str, batch: Sequence[Message]) -> Fault:
        return Fault.BEFORE_COMMIT if down[0] else Fault.NONE

    flaky = FaultyBackend(broker, script)
    relay = Relay(outbox_url, flaky, [ORDERS], retry=NO_WAIT, poll_interval=0.2, backoff_max=0.3)
    caplog.set_level(logging.WARNING, logger="sendonce.outbox")
    runner = threading.Thread(target=relay.run)
    runner.start()
    try:
        committed(outbox_url, messages("k", 1, 2, 3))
        while "nothing could be published" not in caplog.text:
            time.sleep(0.05)
        calls_while_down = len(flaky.calls)
        committed(outbox_url, messages("k", 4))
        assert broker.message_ids("orders") == []
        down[0] = False
        while len(broker.message_ids("orders")) < 4:
            time.sleep(0.05)
    finally:
        relay.stop()
        runner.join(timeout=30)
        relay.close()
    assert not runner.is_alive()
    assert calls_while_down >= 1
    assert broker.message_ids("orders") == ["k-1", "k-2", "k-3", "k-4"]
    (row,) = stats(outbox_url)
    assert (row.pending, row.leased, row.published) == (0, 0, 4)


def test_rows_that_can_never_be_sent_are_moved_aside_without_blocking_their_key(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    small = EntityProfile("orders", partitioned=True, max_message_size=1024)
    committed(outbox_url, messages("k", 1) + messages("k", 2, size=2000) + messages("k", 3))
    committed(outbox_url, [Message("other body", message_id="k-1", partition_key="k")])

    def refuse_k4(index: int, entity: str, batch: Sequence[Message]) -> Fault:
        return Fault.PERMANENT if any(m.message_id == "k-4" for m in batch) else Fault.NONE

    committed(outbox_url, messages("k", 4, 5))
    with Relay(outbox_url, FaultyBackend(broker, refuse_k4), [small], retry=NO_WAIT) as relay:
        totals = relay.drain()
    assert broker.message_ids("orders") == ["k-1", "k-3", "k-5"]
    assert totals.dead_reasons == {"invalid": 1, "conflict": 1, "refused": 1}
    dead = {d.message_id: d for d in dead_rows(outbox_url)}
    assert dead["k-2"].reason == "invalid" and "1024-byte limit" in dead["k-2"].error
    assert dead["k-4"].reason == "refused"
    assert dead["k-1"].reason == "conflict"
    (row,) = stats(outbox_url)
    assert (row.pending, row.published, row.dead) == (0, 3, 3)
    # The broker stops refusing: the operator puts k-4 back; it goes to the end of its key.
    assert requeue(outbox_url, "orders", ["k-4"]) == ["k-4"]
    with Relay(outbox_url, broker, [small]) as relay:
        relay.drain()
    assert broker.message_ids("orders") == ["k-1", "k-3", "k-5", "k-4"]


def test_a_row_in_doubt_past_the_window_is_moved_aside_not_resent(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    committed(outbox_url, messages("k", 1, 2))
    with psycopg.connect(outbox_url, autocommit=True) as conn:
        # A relay tried k-1 eleven minutes ago and died: the broker may have forgotten it.
        conn.execute(
            "UPDATE sendonce_outbox SET first_attempt = now() - interval '11 minutes' "
            "WHERE message_id = 'k-1'"
        )
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        totals = relay.drain()
    assert totals.dead_reasons == {"in-doubt": 1}
    assert broker.message_ids("orders") == ["k-2"]
    (dead,) = dead_rows(outbox_url)
    assert dead.message_id == "k-1" and "InDoubtError" in dead.error


def test_an_entity_without_duplicate_detection_needs_a_ledger(
    outbox_url: str, broker: LocalBackend, tmp_path: Path
) -> None:
    install(outbox_url)
    audit = EntityProfile("audit", duplicate_detection=False)
    committed(outbox_url, messages("k", 1, 2), entity="audit")
    with pytest.raises(ConfigurationError, match="ledger") as refused:
        Relay(outbox_url, broker, [audit])
    assert refused.value.field == "ledger"
    assert broker.count("audit") == 0 and stats(outbox_url)[0].pending == 2
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}") as ledger:
        with Relay(outbox_url, broker, [audit], ledger=ledger) as relay:
            assert relay.drain().published == 2
        # The rows are published; a copy enqueued again is skipped by the ledger.
        committed(outbox_url, messages("k", 1), entity="audit")
        with Relay(outbox_url, broker, [audit], ledger=ledger) as relay:
            relay.drain()
    assert broker.message_ids("audit") == ["k-1", "k-2"]


def test_bad_outbox_urls_and_schemas_are_refused_naming_the_outbox(
    outbox_url: str, broker: LocalBackend
) -> None:
    for url in ("sqlite:///tmp/outbox.db", "local:///tmp/broker.db", "", None):
        with pytest.raises(ConfigurationError) as bad:
            Relay(url, broker, [ORDERS])  # type: ignore[arg-type]
        assert bad.value.field == "outbox"
    with psycopg.connect(outbox_url) as conn:
        with pytest.raises(ConfigurationError, match="no sendonce outbox"):
            enqueue(conn, messages("k", 1), entity="orders")
        conn.rollback()
    install(outbox_url)
    with psycopg.connect(outbox_url, autocommit=True) as conn:
        conn.execute("UPDATE sendonce_outbox_meta SET value = '99'")
    with pytest.raises(ConfigurationError, match="version 99") as newer:
        Relay(outbox_url, broker, [ORDERS])
    assert newer.value.field == "outbox"
    with psycopg.connect(outbox_url) as conn:
        with pytest.raises(ConfigurationError, match="version 99"):
            enqueue(conn, messages("k", 1), entity="orders")
        conn.rollback()
        count = conn.execute("SELECT count(*) FROM sendonce_outbox").fetchone()
    assert count == (0,)


def test_enqueue_refuses_bad_messages_and_connections_writing_nothing(outbox_url: str) -> None:
    install(outbox_url)
    with psycopg.connect(outbox_url, autocommit=True) as conn:
        with pytest.raises(ConfigurationError, match="autocommit") as outside:
            enqueue(conn, messages("k", 1), entity="orders")
        assert outside.value.field == "conn"
        with conn.transaction():  # inside an explicit transaction block it is fine
            assert enqueue(conn, messages("k", 1), entity="orders") == 1
    with psycopg.connect(outbox_url) as conn:
        good = messages("k", 2)
        with pytest.raises(ValidationError, match=r"messages\[1\]") as wrong_type:
            enqueue(conn, [*good, "not a message"], entity="orders")  # type: ignore[list-item]
        assert wrong_type.value.field == "messages"
        from datetime import UTC, datetime

        later = Message("x", message_id="later", scheduled_enqueue_time=datetime.now(UTC))
        with pytest.raises(ValidationError) as scheduled:
            enqueue(conn, [later], entity="orders")
        assert scheduled.value.field == "scheduled_enqueue_time"
        tiny = EntityProfile("orders", max_message_size=1024)
        with pytest.raises(MessageSizeError, match=r"messages\[1\]"):
            enqueue(conn, good + messages("k", 3, size=5000), entity=tiny)
        with pytest.raises(ConfigurationError) as no_entity:
            enqueue(conn, good, entity="")
        assert no_entity.value.field == "entity"
        with pytest.raises(ConfigurationError, match="psycopg connection or a SQLAlchemy"):
            enqueue(object(), good, entity="orders")
        conn.commit()
        rows = conn.execute("SELECT message_id FROM sendonce_outbox").fetchall()
    assert rows == [("k-1",)]


def test_published_rows_are_pruned_in_batches_that_never_wait_for_a_writer(
    outbox_url: str, broker: LocalBackend
) -> None:
    """The cleanup bugs of outbox libraries (unbounded deletes that lock, deadlock or stall
    writers): pruning deletes at most ``limit`` rows per statement and skips rows another
    transaction holds, and idle key counters go with them."""
    install(outbox_url)
    committed(outbox_url, messages("k", *range(10)))
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        relay.drain()
        with psycopg.connect(outbox_url) as holder:  # a transaction holding one published row
            holder.execute("SELECT 1 FROM sendonce_outbox WHERE message_id = 'k-3' FOR UPDATE")
            assert relay.store.prune(timedelta(0), limit=4) == 4
            assert relay.store.prune(timedelta(0), limit=100) == 5  # k-3 skipped, not waited for
            holder.rollback()
        assert relay.store.prune(timedelta(0), limit=100) == 1
        with psycopg.connect(outbox_url) as conn:
            assert conn.execute("SELECT count(*) FROM sendonce_outbox_keys").fetchone() == (0,)
        committed(outbox_url, messages("k", 10))  # the key starts again after its counter went
    with Relay(outbox_url, broker, [ORDERS], retention=timedelta(0)) as relay:
        assert relay.drain().published == 1
    assert stats(outbox_url) == []  # deleted at once with no retention
    assert broker.message_ids("orders") == [f"k-{n}" for n in range(11)]


def test_an_older_schema_is_migrated_in_place_by_a_relay(
    outbox_url: str, broker: LocalBackend
) -> None:
    from sendonce.outbox import SCHEMA_VERSION

    install(outbox_url)
    committed(outbox_url, messages("k", 1, 2))
    with psycopg.connect(outbox_url, autocommit=True) as conn:  # as version 1 left it
        conn.execute("ALTER TABLE sendonce_outbox DROP COLUMN claimed_through")
        conn.execute("UPDATE sendonce_outbox_meta SET value = '1'")
    with psycopg.connect(outbox_url) as conn:
        with pytest.raises(ConfigurationError, match="older"):
            enqueue(conn, messages("k", 3), entity="orders")
        conn.rollback()
    assert install(outbox_url) == 1
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        assert relay.drain().published == 2
    with psycopg.connect(outbox_url) as conn:
        version = conn.execute("SELECT value FROM sendonce_outbox_meta").fetchone()
    assert version == (str(SCHEMA_VERSION),)
    assert broker.message_ids("orders") == ["k-1", "k-2"]


def test_a_relay_keeps_its_lease_while_a_slow_transfer_is_in_flight(
    outbox_url: str, broker: LocalBackend
) -> None:
    """A round longer than the lease: the heartbeat renews it, so a second relay never takes
    the key over (without renewal it would, after one lease)."""
    install(outbox_url)
    committed(outbox_url, messages("k", 1, 2))
    slow = FaultyBackend(broker, [Fault.SLOW_ACK], slow_ack_delay=3.0)
    lease = timedelta(seconds=0.9)
    with Relay(outbox_url, slow, [ORDERS], lease=lease) as holder:
        runner = threading.Thread(target=holder.drain)
        runner.start()
        try:
            with Relay(outbox_url, broker, [ORDERS], lease=lease) as other:
                while runner.is_alive():
                    assert other.drain().published == 0
                    time.sleep(0.05)
        finally:
            runner.join(timeout=30)
        assert holder.totals.published == 2
    assert broker.message_ids("orders") == ["k-1", "k-2"]
