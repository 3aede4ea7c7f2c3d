"""The ledger dimension of the fault schedules: restarts beyond the window on a fast clock.

Each seed draws a store (SQLite file or PostgreSQL server), an entity with or without
duplicate detection, ``in_doubt``, a 20-40 s window with a clock running 10-40x, fault
scripts (before/after commit, permanent), and 2-4 producer incarnations (real processes)
that die by SIGKILL right after the broker committed a transfer or after some chunk, each
restarted up to 2.5 windows later. The checker: nothing confirmed is lost; nothing is stored
twice unless the application chose ``in_doubt="resend"``; every id missing at the end was
reported failed (in doubt or refused) by the last run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sendonce.backends import LocalBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "functional" / "ledger"))
from pgserver import pg_bin

from _interrupts import sigint_default

PRODUCER = str(Path(__file__).with_name("ledger_producer.py"))
DEFAULT_SEEDS = (1, 2, 3, 4)
SLOW_SEEDS = tuple(range(100, 140))


def schedule(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    n = rng.randint(200, 500)
    incarnations = []
    offset = 0.0
    window = rng.randint(20, 40)
    for _ in range(rng.randint(2, 4)):
        last = False
        incarnations.append(
            {
                "offset": offset,
                "kill_at": rng.choice([None, rng.randint(1, 12)]),
                "kill_after_chunk": rng.choice([None, rng.randint(1, 4)]),
                "fault_seed": rng.randrange(2**32),
                "fault_rate": rng.choice([0.0, 0.1, 0.3]),
                "last": last,
            }
        )
        offset += rng.uniform(0, 2.5) * window
    incarnations.append(
        {
            "offset": offset + rng.uniform(0, 2.5) * window,
            "kill_at": None,
            "kill_after_chunk": None,
            "fault_seed": rng.randrange(2**32),
            "fault_rate": rng.choice([0.0, 0.1]),
            "last": True,
        }
    )
    # Drawn from their own stream, so each seed's other choices stay what they were:
    # transfers in flight, and SIGINT right after an intent write (transfers' intents then
    # written ahead) in an incarnation that is not killed otherwise.
    extra = random.Random(f"in-flight:{seed}")
    for inc in incarnations:
        inc["sigint_at_write"] = None
        if not inc["last"] and inc["kill_at"] is None and extra.random() < 0.5:
            inc["sigint_at_write"] = extra.randint(2, 6)
    return {
        "max_in_flight": extra.choice([1, 4, 8]),
        "seed": seed,
        "store": "postgres" if seed % 2 else "sqlite",
        "dedup": rng.random() < 0.7,
        "in_doubt": "resend" if rng.random() < 0.25 else "error",
        "window": window,
        "speed": rng.choice([10, 20, 40]),
        "ids": rng.sample(range(n), n) if rng.random() < 0.3 else list(range(n)),
        "chunk": rng.randint(40, 100),
        "batch": rng.randint(10, 40),
        "incarnations": incarnations,
    }


@pytest.fixture(scope="module")
def pg_server(request: pytest.FixtureRequest) -> str | None:
    """The run's cluster (``postgres_server``, tests/conftest.py), None without PostgreSQL."""
    if pg_bin() is None:
        return None
    url: str = request.getfixturevalue("postgres_server")
    return url


def ledger_url(plan: dict[str, Any], tmp_path: Path, pg_server: str | None) -> str:
    if plan["store"] == "sqlite":
        return f"sqlite://{tmp_path / 'ledger.db'}"
    if pg_server is None:
        pytest.skip("PostgreSQL is not installed")
    import psycopg

    name = f"faults_{plan['seed']}_{os.getpid()}_{int(time.time() * 1000) % 10**6}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg_server.rsplit("/", 1)[0] + f"/{name}"


def run_incarnation(config: dict[str, Any], kill_after_chunk: int | None) -> list[dict[str, Any]]:
    with sigint_default():  # its SIGINT after an intent write works in a background job too
        proc = subprocess.Popen(
            [sys.executable, PRODUCER, json.dumps(config)], stdout=subprocess.PIPE, text=True
        )
    assert proc.stdout is not None
    lines: list[dict[str, Any]] = []
    for raw in proc.stdout:
        line = json.loads(raw)
        if line.get("interrupted"):
            # Ctrl-C while intents were written ahead: nothing never attempted stays behind
            assert line["leftover"] == [], f"intents left behind: {line['leftover'][:10]}"
            continue
        lines.append(line)
        if kill_after_chunk is not None and len(lines) >= kill_after_chunk:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=300)
    assert proc.returncode in (0, 130, -signal.SIGKILL), f"producer failed: {proc.returncode}"
    return lines


def check(plan: dict[str, Any], db: Path, runs: list[list[dict[str, Any]]]) -> list[str]:
    later = datetime.now(UTC) + timedelta(days=365)
    with LocalBackend(str(db), clock=lambda: later) as broker:
        stored = Counter(m.message_id for m in broker.receive("orders", max_messages=10**6))
    confirmed = {i for run in runs for line in run for i in line["confirmed"]}
    final_failed = {i for line in runs[-1] for ids in line["failed"].values() for i in ids}
    everything = {f"id-{i}" for i in plan["ids"]}
    problems = []
    lost = confirmed - set(stored)
    if lost:
        problems.append(f"confirmed but not stored: {sorted(lost)[:10]}")
    twice = sorted(i for i, c in stored.items() if c > 1)
    if twice and plan["in_doubt"] != "resend":
        problems.append(f"stored twice without in_doubt='resend': {twice[:10]}")
    unreported = everything - set(stored) - final_failed
    if unreported:
        problems.append(f"missing and never reported: {sorted(unreported)[:10]}")
    accounted = {i for line in runs[-1] for i in line["confirmed"]} | final_failed
    if accounted != everything:
        problems.append(f"the last run did not account for {sorted(everything - accounted)[:10]}")
    return problems


def run_schedule(seed: int, tmp_path: Path, pg_server: str | None) -> None:
    plan = schedule(seed)
    db = tmp_path / "broker.db"
    url = ledger_url(plan, tmp_path, pg_server)
    origin = time.time()
    runs = []
    for inc in plan["incarnations"]:
        config = {
            "broker": str(db),
            "ledger": url,
            "ids": plan["ids"],
            "chunk": plan["chunk"],
            "batch": plan["batch"],
            "speed": plan["speed"],
            "origin": origin,
            "offset": inc["offset"],
            "window": plan["window"],
            "dedup": plan["dedup"],
            "in_doubt": plan["in_doubt"],
            "kill_at": inc["kill_at"],
            "sigint_at_write": inc["sigint_at_write"],
            "max_in_flight": plan["max_in_flight"],
            "fault_seed": inc["fault_seed"],
            "fault_rate": inc["fault_rate"],
        }
        runs.append(run_incarnation(config, inc["kill_after_chunk"]))
    problems = check(plan, db, runs)
    assert not problems, f"seed {seed}: {problems}\nschedule: {json.dumps(plan)[:2000]}"


@pytest.mark.postgres
@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_ledger_schedule(seed: int, tmp_path: Path, pg_server: str | None) -> None:
    run_schedule(seed, tmp_path, pg_server)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_ledger_schedule_slow(seed: int, tmp_path: Path, pg_server: str | None) -> None:
    run_schedule(seed, tmp_path, pg_server)


def test_the_checker_catches_loss_duplicates_and_silence(tmp_path: Path) -> None:
    """The checker is not vacuous: a broker state breaking each rule is reported."""
    from sendonce import EntityProfile, Message

    db = tmp_path / "broker.db"
    with LocalBackend(str(db)) as broker:
        broker.create_entity(EntityProfile("orders", duplicate_detection=False))
        broker.send("orders", [Message("b", message_id="id-0")] * 2, timeout=5)
    plan = {"ids": [0, 1, 2], "in_doubt": "error"}
    runs = [[{"confirmed": ["id-0", "id-1"], "failed": {}}], [{"confirmed": [], "failed": {}}]]
    problems = check(plan, db, runs)
    assert any("confirmed but not stored" in p and "id-1" in p for p in problems)
    assert any("stored twice" in p and "id-0" in p for p in problems)
    assert any("never reported" in p and "id-2" in p for p in problems)
    assert any("did not account" in p for p in problems)
