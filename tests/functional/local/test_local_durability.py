"""An acknowledged message survives a kill -9 of the sender; durability="full" syncs first."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend

# Sends one message per call and prints each id once its ack returned, then keeps going
# until it is killed.
SENDER = textwrap.dedent(
    """
    import sys
    from sendonce import Message
    from sendonce.backends.local import LocalBackend

    backend = LocalBackend(sys.argv[1], durability=sys.argv[2])
    i = 0
    while True:
        message_id = f"order-{i}"
        (ack,) = backend.send("orders", [Message("x" * 100, message_id=message_id)], timeout=30)
        assert ack.outcome == "accepted"
        sys.stdout.write(message_id + "\\n")
        sys.stdout.flush()
        i += 1
    """
)


def make_broker(db: str) -> None:
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_every_acked_message_survives_kill_9(tmp_path: Path, durability: str):
    db = str(tmp_path / "broker.db")
    make_broker(db)
    child = subprocess.Popen(
        [sys.executable, "-c", SENDER, db, durability], stdout=subprocess.PIPE, text=True
    )
    acked: list[str] = []
    assert child.stdout is not None
    try:
        while len(acked) < 150:
            line = child.stdout.readline()
            assert line, "the sender died before it was killed"
            acked.append(line.strip())
    finally:
        os.kill(child.pid, signal.SIGKILL)  # mid-stream: no clean close, no checkpoint
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert os.path.getsize(db + "-wal") > 0  # the commits live only in the WAL
    with LocalBackend(db) as reopened:
        stored = set(reopened.message_ids("orders"))
    missing = [m for m in acked if m not in stored]
    assert missing == []


@pytest.mark.parametrize(("durability", "level"), [("normal", 1), ("full", 2)])
def test_synchronous_pragma_in_force(tmp_path: Path, durability: str, level: int):
    with LocalBackend(tmp_path / "b.db", durability=durability) as broker:  # type: ignore[arg-type]
        conn = broker._db._current().conn  # the shared connection: pragmas are per connection
        assert conn is not None
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == level
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


ONE_SEND = textwrap.dedent(
    """
    import os, sys
    from sendonce import Message
    from sendonce.backends.local import LocalBackend

    backend = LocalBackend(sys.argv[1], durability=sys.argv[2])
    backend.send("orders", [Message("x", message_id="warm-up")], timeout=30)
    os.write(1, b"SEND\\n")
    (ack,) = backend.send("orders", [Message("x", message_id="the-one")], timeout=30)
    os.write(1, b"ACK\\n")
    """
)


def syscalls_between_send_and_ack(tmp_path: Path, durability: str) -> list[str]:
    db = str(tmp_path / "broker.db")
    make_broker(db)
    trace = tmp_path / "trace.txt"
    subprocess.run(
        [
            "strace",
            "-qq",
            "-f",
            "-y",
            "-e",
            "trace=write,pwrite64,fsync,fdatasync",
            "-e",
            "signal=none",
            "-o",
            str(trace),
            sys.executable,
            "-c",
            ONE_SEND,
            db,
            durability,
        ],
        check=True,
        capture_output=True,
    )
    lines = trace.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if 'SEND\\n"' in line)
    end = next(i for i, line in enumerate(lines) if 'ACK\\n"' in line)
    return lines[start:end]


def strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(
        ["strace", "-qq", "-e", "trace=none", sys.executable, "-c", "pass"], capture_output=True
    )
    return probe.returncode == 0


needs_strace = pytest.mark.skipif(not strace_works(), reason="strace unavailable or not permitted")


@needs_strace
def test_full_durability_syncs_the_wal_before_the_ack(tmp_path: Path):
    calls = syscalls_between_send_and_ack(tmp_path, "full")
    wal_writes = [i for i, c in enumerate(calls) if re.search(r"write64?\(\d+<[^>]*-wal>", c)]
    syncs = [i for i, c in enumerate(calls) if re.search(r"f(data)?sync\(\d+<[^>]*-wal>", c)]
    assert wal_writes, calls
    assert syncs and syncs[-1] > wal_writes[-1], calls


@needs_strace
def test_normal_durability_does_not_sync_before_the_ack(tmp_path: Path):
    # The counterpart that shows the strace check can tell the modes apart.
    calls = syscalls_between_send_and_ack(tmp_path, "normal")
    assert any(re.search(r"write64?\(\d+<[^>]*-wal>", c) for c in calls), calls
    assert not any("sync(" in c for c in calls), calls
