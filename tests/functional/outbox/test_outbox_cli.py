"""``sendonce relay`` and ``sendonce outbox``: real processes, signals, JSON, no tracebacks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from sendonce import EntityProfile, Message
from sendonce.backends import LocalBackend
from sendonce.cli import main
from sendonce.outbox import enqueue, install, stats

pytestmark = pytest.mark.postgres


def fill(url: str, count: int, keys: int = 10) -> None:
    with psycopg.connect(url) as conn:
        batch = [
            Message(f"order {n}", message_id=f"k{n % keys}-{n}", partition_key=f"k{n % keys}")
            for n in range(count)
        ]
        enqueue(conn, batch, entity="orders")
        conn.commit()


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_relay_drain_stats_dead_and_requeue(outbox_url: str, tmp_path: Path) -> None:
    broker_url = f"local://{tmp_path / 'broker.db'}"
    with LocalBackend(tmp_path / "broker.db") as broker:
        broker.create_entity(EntityProfile("orders", partitioned=True, max_message_size=2048))
    code, out, _ = run("outbox", "install", outbox_url)
    assert code == 0 and "installed" in out
    fill(outbox_url, 30)
    with psycopg.connect(outbox_url) as conn:
        enqueue(conn, [Message("x" * 4000, message_id="big", partition_key="k1")], entity="orders")
        conn.commit()
    code, out, _ = run("outbox", "stats", outbox_url, "--json")
    assert code == 0 and json.loads(out)["entities"]["orders"]["pending"] == 31
    code, out, err = run(
        "relay",
        "--outbox",
        outbox_url,
        "--to",
        broker_url,
        "--entity",
        "orders",
        "--drain",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out) | {"rounds": 0} == {
        "status": "ok",
        "published": 30,
        "dead": 1,
        "dead_reasons": {"invalid": 1},
        "rounds": 0,
        "exit_status": 0,
    }
    code, out, _ = run("outbox", "stats", outbox_url, "--json")
    counts = json.loads(out)["entities"]["orders"]
    assert (counts["pending"], counts["published"], counts["dead"]) == (0, 30, 1)
    code, out, _ = run("outbox", "dead", outbox_url, "--json")
    (row,) = json.loads(out)["rows"]
    assert row["message_id"] == "big" and row["reason"] == "invalid"
    code, out, _ = run("outbox", "requeue", outbox_url, "--entity", "orders", "--id", "big")
    assert code == 0 and "requeued 1" in out
    code, out, _ = run("outbox", "stats", outbox_url)
    assert "orders: 1 pending" in out
    with LocalBackend(tmp_path / "broker.db") as broker:
        assert len(set(broker.message_ids("orders"))) == 30


def test_bad_setups_are_refused_without_a_traceback_or_a_secret(
    outbox_url: str, tmp_path: Path
) -> None:
    broker_url = f"local://{tmp_path / 'broker.db'}"
    with LocalBackend(tmp_path / "broker.db") as broker:
        broker.create_entity(EntityProfile("orders"))
        broker.create_entity(EntityProfile("audit", duplicate_detection=False))
    relay = ("relay", "--to", broker_url, "--drain", "--outbox")
    code, out, err = run(*relay, "sqlite:///tmp/o.db", "--entity", "orders")
    assert code == 2 and "postgresql://" in err and "Traceback" not in out + err
    install(outbox_url)
    code, out, err = run(*relay, outbox_url, "--entity", "audit")
    assert code == 2 and "--ledger" in err and "Traceback" not in out + err
    with_ledger = (*relay, outbox_url, "--entity", "audit", "--ledger", str(tmp_path / "ledger.db"))
    code, out, err = run(*with_ledger)  # a missing ledger is a typo until told otherwise
    assert code == 2 and "--create-ledger" in err and not (tmp_path / "ledger.db").exists()
    code, out, err = run(*with_ledger, "--create-ledger")
    assert code == 0, err
    assert "created a new, empty ledger" in err and (tmp_path / "ledger.db").exists()
    with psycopg.connect(outbox_url, autocommit=True) as conn:
        conn.execute("UPDATE sendonce_outbox_meta SET value = '7'")
    code, out, err = run(*relay, outbox_url, "--entity", "orders")
    assert code == 2 and "version 7" in err and "Traceback" not in out + err
    code, out, err = run("outbox", "stats", outbox_url, "--json")
    assert code == 2 and json.loads(out)["status"] == "error"
    down = "postgresql://ana:hunter2secret@127.0.0.1:1/db?connect_timeout=2"
    for args in (("outbox", "stats", down), (*relay, down, "--entity", "orders")):
        code, out, err = run(*args)
        assert code == 1, (args, out, err)
        assert "Traceback" not in out + err and "hunter2secret" not in out + err


def _relay_process(outbox_url: str, broker_url: str) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "sendonce.cli",
        "relay",
        "--outbox",
        outbox_url,
        "--to",
        broker_url,
        "--entity",
        "orders",
        "--json",
        "--poll",
        "1s",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_sigterm_stops_the_relay_with_its_leases_released_and_nothing_lost(
    outbox_url: str, tmp_path: Path
) -> None:
    broker_url = f"local://{tmp_path / 'broker.db'}"
    with LocalBackend(tmp_path / "broker.db") as broker:
        broker.create_entity(EntityProfile("orders", partitioned=True))
    install(outbox_url)
    fill(outbox_url, 1000, keys=100)
    process = _relay_process(outbox_url, broker_url)
    try:
        with LocalBackend(tmp_path / "broker.db") as broker:
            while broker.count("orders") == 0:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    summary = json.loads(out)
    assert summary["status"] == "ok" and "Traceback" not in err
    (row,) = stats(outbox_url)
    assert row.leased == 0  # released on the way out
    assert row.published == summary["published"]
    # Idle, then SIGINT (Ctrl-C): exit 130; a second relay publishes the rest exactly once.
    process = _relay_process(outbox_url, broker_url)
    try:
        with LocalBackend(tmp_path / "broker.db") as broker:
            while broker.count("orders") < 1000:
                assert process.poll() is None
                time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert json.loads(out)["status"] == "interrupted"
    with LocalBackend(tmp_path / "broker.db") as broker:
        ids = broker.message_ids("orders")
    assert len(ids) == len(set(ids)) == 1000
    (row,) = stats(outbox_url)
    assert (row.pending, row.leased, row.published) == (0, 0, 1000)


def test_outbox_json_shapes_and_an_unknown_entity(outbox_url: str) -> None:
    """Every --json is one line with status and exit_status; a typo'd --entity exits 2 (as
    `ledger stats --entity nope`), not 0 with nothing in it."""
    install(outbox_url)
    fill(outbox_url, 3)
    code, out, _ = run("outbox", "stats", outbox_url, "--json")
    report = json.loads(out)
    assert code == 0 and out.count("\n") == 1
    assert list(report) == ["status", "entities", "exit_status"]
    assert report["entities"]["orders"]["pending"] == 3
    code, out, err = run("outbox", "stats", outbox_url, "--entity", "nope")
    assert code == 2 and "--entity: the outbox has no rows of 'nope' (it has 'orders')" in err
    code, out, _ = run("outbox", "stats", outbox_url, "--entity", "nope", "--json")
    assert code == 2 and json.loads(out)["exit_status"] == 2
    code, out, _ = run("outbox", "stats", outbox_url, "--entity", "ORDERS", "--json")
    assert code == 0 and list(json.loads(out)["entities"]) == ["orders"]
    code, out, _ = run("outbox", "dead", outbox_url, "--json")
    assert code == 0 and json.loads(out) == {
        "status": "ok",
        "count": 0,
        "rows": [],
        "exit_status": 0,
    }
    code, out, _ = run("outbox", "requeue", outbox_url, "--entity", "orders", "--id", "x", "--json")
    assert code == 0 and json.loads(out) == {
        "status": "ok",
        "entity": "orders",
        "requeued": [],
        "not_dead": ["x"],
        "exit_status": 0,
    }
