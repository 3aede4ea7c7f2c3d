"""A second body under a published id: moved aside as a payload conflict, never counted published.

The broker keeps the first body and drops the second as a duplicate, so a relay that counted
the second "published" would lose it silently. A relay compares a pending row with the row
published under its id while that row is kept (the retention), in one run and across runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from sendonce import EntityProfile, Message
from sendonce.backends import LocalBackend
from sendonce.cli import main
from sendonce.outbox import Relay, dead_rows, enqueue, install, requeue, stats

pytestmark = pytest.mark.postgres

ORDERS = EntityProfile("orders")


def order(total: int, message_id: str = "order-1/created", key: str | None = None) -> Message:
    return Message(json.dumps({"total": total}), message_id=message_id, partition_key=key)


def committed(url: str, batch: Sequence[Message]) -> None:
    with psycopg.connect(url) as conn:
        enqueue(conn, batch, entity="orders")
        conn.commit()


def test_a_second_body_under_a_published_id_is_moved_aside_by_a_later_relay_run(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    committed(outbox_url, [order(10)])
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        assert relay.drain().published == 1
    committed(outbox_url, [order(99)])
    with Relay(outbox_url, broker, [ORDERS]) as relay:  # a new process: nothing in memory
        totals = relay.drain()
    assert (totals.published, totals.dead, totals.dead_reasons) == (0, 1, {"conflict": 1})
    (dead,) = dead_rows(outbox_url)
    assert (dead.message_id, dead.reason) == ("order-1/created", "conflict")
    assert "payload conflict with the row published at" in dead.error
    assert broker.message_ids("orders") == ["order-1/created"]
    (peeked,) = broker.peek("orders", max_messages=10)
    assert json.loads(peeked.body) == {"total": 10}
    (row,) = stats(outbox_url)
    assert (row.pending, row.published, row.dead) == (0, 1, 1)
    # Requeued, it is still a conflict: moved aside again, never published.
    assert requeue(outbox_url, "orders", ["order-1/created"]) == ["order-1/created"]
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        assert relay.drain().dead_reasons == {"conflict": 1}


def test_both_bodies_in_one_relay_run_keep_the_first_and_move_the_later_aside(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    committed(outbox_url, [order(10, key="c-1")])
    committed(outbox_url, [order(99, key="c-2")])  # another key: claimed in the same round
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        totals = relay.drain()
    assert (totals.published, totals.dead) == (1, 1)
    (dead,) = dead_rows(outbox_url)
    assert dead.reason == "conflict" and dead.partition_key == "c-2"
    (peeked,) = broker.peek("orders", max_messages=10)
    assert json.loads(peeked.body) == {"total": 10}


def test_the_same_body_again_is_a_repeat_not_a_conflict(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    committed(outbox_url, [order(10)])
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        relay.drain()
    committed(outbox_url, [order(10)])
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        totals = relay.drain()
    assert (totals.published, totals.dead) == (1, 0)  # the broker dropped the copy
    assert dead_rows(outbox_url) == []
    assert broker.message_ids("orders") == ["order-1/created"]


def test_on_a_partitioned_entity_the_same_id_under_another_partition_key_is_no_conflict(
    outbox_url: str, broker: LocalBackend
) -> None:
    install(outbox_url)
    partitioned = EntityProfile("orders", partitioned=True)
    committed(outbox_url, [order(10, key="c-1")])
    with Relay(outbox_url, broker, [partitioned]) as relay:
        relay.drain()
    committed(outbox_url, [order(99, key="c-2"), order(98, key="c-1")])
    with Relay(outbox_url, broker, [partitioned]) as relay:
        totals = relay.drain()
    assert (totals.published, totals.dead) == (1, 1)
    (dead,) = dead_rows(outbox_url)
    assert dead.partition_key == "c-1" and "payload conflict" in dead.error
    assert sorted(json.loads(m.body)["total"] for m in broker.peek("orders", max_messages=10)) == [
        10,
        99,
    ]


def test_detection_stops_where_the_published_row_is_pruned(
    outbox_url: str, broker: LocalBackend
) -> None:
    """The documented limit: with the published row gone (retention 0 here) a later relay
    cannot tell the second body from a repeat; the broker drops it (outcome duplicate)."""
    install(outbox_url)
    committed(outbox_url, [order(10)])
    with Relay(outbox_url, broker, [ORDERS], retention=timedelta(0)) as relay:
        relay.drain()
    committed(outbox_url, [order(99)])
    with Relay(outbox_url, broker, [ORDERS]) as relay:
        totals = relay.drain()
    assert (totals.published, totals.dead) == (1, 0)
    with psycopg.connect(outbox_url) as conn:
        outcome = conn.execute("SELECT outcome FROM sendonce_outbox").fetchone()
    assert outcome == ("duplicate",)
    (peeked,) = broker.peek("orders", max_messages=10)
    assert json.loads(peeked.body) == {"total": 10}


def test_the_cli_reports_the_conflict_across_relay_runs(outbox_url: str, tmp_path: Path) -> None:
    """The user's steps: enqueue, relay --drain; enqueue the same id with another body,
    relay --drain --json: dead 1, and `outbox dead` shows it with its reason."""
    db = tmp_path / "broker.db"
    with LocalBackend(db) as broker:
        broker.create_entity(ORDERS)
    relay = ("relay", "--outbox", outbox_url, "--to", f"local://{db}", "--entity", "orders")
    install(outbox_url)
    committed(outbox_url, [order(10)])
    assert CliRunner().invoke(main, [*relay, "--drain"]).exit_code == 0
    committed(outbox_url, [order(99)])
    result = CliRunner().invoke(main, [*relay, "--drain", "--json"])
    report = json.loads(result.stdout)
    assert (report["published"], report["dead"], report["dead_reasons"]) == (
        0,
        1,
        {"conflict": 1},
    )
    result = CliRunner().invoke(main, ["outbox", "dead", outbox_url, "--json"])
    rows = json.loads(result.stdout)["rows"]
    assert [(r["message_id"], r["reason"]) for r in rows] == [("order-1/created", "conflict")]
