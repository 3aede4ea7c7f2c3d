"""A producer SIGKILLed mid-stream and restarted leaves each order exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from sendonce.backends import LocalBackend

PRODUCER = Path(__file__).with_name("producer_main.py")
ORDERS = 10_000


def start_producer(db: Path, checkpoint: Path, chunk: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(PRODUCER), str(db), str(checkpoint), str(ORDERS), str(chunk)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_mid_stream_then_restart_publishes_each_order_once(tmp_path: Path) -> None:
    db, checkpoint = tmp_path / "broker.db", tmp_path / "checkpoint"
    producer = start_producer(db, checkpoint, chunk=250)
    assert producer.stdout is not None
    committed = 0
    for line in producer.stdout:  # wait until a good part of the stream is committed
        if line.startswith("committed"):
            committed = int(line.split()[1])
            if committed >= 3_000:
                break
    producer.send_signal(signal.SIGKILL)
    producer.wait(timeout=30)
    assert producer.returncode == -signal.SIGKILL
    with LocalBackend(db) as broker:
        before_restart = broker.count("orders")
    assert 3_000 <= before_restart < ORDERS  # killed mid-stream, with committed work behind it

    restarted = start_producer(db, checkpoint, chunk=250)
    out, err = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, err
    assert out.strip().endswith("done")

    with LocalBackend(db) as broker:
        ids = Counter(broker.message_ids("orders"))
    assert len(ids) == ORDERS
    assert set(ids.values()) == {1}
    assert set(ids) == {f"{i}.2017/payment" for i in range(ORDERS)}


def test_restart_from_scratch_after_sigkill_also_converges(tmp_path: Path) -> None:
    """No checkpoint at all: the restarted producer resends everything; the broker drops copies."""
    db = tmp_path / "broker.db"
    producer = start_producer(db, tmp_path / "cp-first", chunk=500)
    assert producer.stdout is not None
    for line in producer.stdout:
        if line.startswith("committed") and int(line.split()[1]) >= 2_000:
            break
    producer.send_signal(signal.SIGKILL)
    producer.wait(timeout=30)
    restarted = start_producer(db, tmp_path / "cp-second", chunk=500)
    _, err = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, err
    with LocalBackend(db) as broker:
        ids = Counter(broker.message_ids("orders"))
    assert len(ids) == ORDERS and set(ids.values()) == {1}
