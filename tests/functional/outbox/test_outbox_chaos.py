"""The demo's proof: web-style producers and several relays ``kill -9``ed at random points,
the broker connection cut, then every committed order's message on the broker exactly once,
none of a rolled-back order, per customer in commit order.

On the local broker (cuts by ``FaultyBackend`` in each relay) and through the emulator with
the real azure-servicebus client (cuts by the emulator's scripted faults). The default run is
small; ``-m slow`` runs a longer, larger randomized one.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from sendonce.backends import LocalBackend

sys.path.insert(0, str(Path(__file__).parent))
import outbox_chaos

pytestmark = pytest.mark.postgres

HERE = Path(__file__).parent


class Fleet:
    """Producer and relay processes, killed and restarted at random."""

    def __init__(self, outbox: str, broker: str, seed: int, logs: Path) -> None:
        self.outbox, self.broker, self.logs = outbox, broker, logs
        self.rng = random.Random(seed)
        self.incarnation = 0
        self.producers: list[subprocess.Popen[bytes]] = []
        self.relays: list[subprocess.Popen[bytes]] = []
        self.kills = 0
        self.born: dict[int, float] = {}

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        self.incarnation += 1
        command = [sys.executable, str(HERE / "outbox_chaos.py"), *args]
        with open(self.logs / f"{args[0]}-{self.incarnation}.log", "wb") as log:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        self.born[process.pid] = time.monotonic()
        return process

    def log_tail(self) -> str:
        """The end of what the processes wrote on stderr (tracebacks of real failures)."""
        texts = [p.read_text(errors="replace")[-600:] for p in sorted(self.logs.glob("*.log"))]
        return "\n".join(t for t in texts if "Error" in t)[-3000:]

    def producer(self) -> subprocess.Popen[bytes]:
        seed = str(self.rng.randrange(1 << 30))
        return self._spawn("producer", self.outbox, str(self.incarnation + 1), seed)

    def relay(self) -> subprocess.Popen[bytes]:
        return self._spawn("relay", self.outbox, self.broker, str(self.rng.randrange(1 << 30)))

    def chaos(self, seconds: float, tick: Callable[[], None] | None = None) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(0.2, 0.8))
            pool = self.producers if self.rng.random() < 0.5 else self.relays
            victim = self.rng.randrange(len(pool))
            # A process needs a moment to start (imports take over a second on a busy
            # machine): kill it only once it has had time to work, at a random point.
            if time.monotonic() - self.born[pool[victim].pid] < self.rng.uniform(1.5, 3.0):
                continue
            pool[victim].kill()  # kill -9, wherever it is
            pool[victim].wait()
            self.kills += 1
            pool[victim] = self.producer() if pool is self.producers else self.relay()
            if tick is not None:
                tick()

    def stop_producers(self) -> None:
        for process in self.producers:
            process.kill()
            process.wait()

    def stop_relays(self) -> None:
        for process in self.relays:
            process.send_signal(signal.SIGTERM)
        for process in self.relays:
            try:
                process.wait(timeout=30)
            finally:
                process.kill()

    def kill_all(self) -> None:
        for process in self.producers + self.relays:
            process.kill()
            process.wait()


def _drained(outbox: str, relays: list[subprocess.Popen[bytes]]) -> None:
    with psycopg.connect(outbox, autocommit=True) as conn:
        while conn.execute(
            "SELECT count(*) FROM sendonce_outbox WHERE published_at IS NULL"
        ).fetchone() != (0,):
            assert any(r.poll() is None for r in relays), "every relay died"
            time.sleep(0.1)


def _prove(
    outbox: str,
    broker_path: Path,
    fleet: Fleet,
    seconds: float,
    producers: int,
    relays: int,
    tick: Callable[[], None] | None = None,
) -> dict[str, int]:
    fleet.producers = [fleet.producer() for _ in range(producers)]
    fleet.relays = [fleet.relay() for _ in range(relays)]
    try:
        with psycopg.connect(outbox, autocommit=True) as conn:  # the producers are working
            while conn.execute("SELECT count(*) FROM orders").fetchone() == (0,):
                assert any(p.poll() is None for p in fleet.producers), fleet.log_tail()
                time.sleep(0.1)
        fleet.chaos(seconds, tick)
        fleet.stop_producers()
        _drained(outbox, fleet.relays)
        fleet.stop_relays()
    finally:
        fleet.kill_all()
    with LocalBackend(broker_path) as broker:
        ids = broker.message_ids("orders")
    counts = outbox_chaos.check(outbox, ids)
    assert counts["orders"] > 0 and fleet.kills > 0, fleet.log_tail()
    return counts


def _setup(outbox_url: str, tmp_path: Path) -> Path:
    outbox_chaos.prepare(outbox_url)
    path = tmp_path / "broker.db"
    with LocalBackend(path) as broker:
        broker.create_entity(outbox_chaos.ORDERS)
    return path


@pytest.mark.parametrize("seed", [1])
def test_kill_9_producers_and_relays_on_the_local_broker(
    outbox_url: str, tmp_path: Path, seed: int
) -> None:
    path = _setup(outbox_url, tmp_path)
    fleet = Fleet(outbox_url, f"local://{path}", seed, tmp_path)
    _prove(outbox_url, path, fleet, seconds=6, producers=2, relays=3)


@pytest.mark.emulator
def test_kill_9_and_cut_connections_through_the_emulator(outbox_url: str, tmp_path: Path) -> None:
    pytest.importorskip("azure.servicebus")
    from sendonce.emulator import Emulator
    from sendonce.emulator._faults import Fault, FaultAction

    path = _setup(outbox_url, tmp_path)
    with Emulator(path) as emulator:
        fleet = Fleet(outbox_url, emulator.connection_string, 7, tmp_path)
        actions = [
            FaultAction.DROP_AFTER_COMMIT,
            FaultAction.DROP_BEFORE_COMMIT,
            FaultAction.SERVER_BUSY,
        ]

        def cut() -> None:
            emulator.faults.add(Fault(fleet.rng.choice(actions), entity="orders"))

        _prove(outbox_url, path, fleet, seconds=6, producers=2, relays=2, tick=cut)
        assert emulator.faults.applied, "no connection was cut"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_kill_9_at_random_for_longer_on_the_local_broker(
    outbox_url: str, tmp_path: Path, seed: int
) -> None:
    path = _setup(outbox_url, tmp_path)
    fleet = Fleet(outbox_url, f"local://{path}", seed, tmp_path)
    _prove(outbox_url, path, fleet, seconds=40, producers=3, relays=4)
