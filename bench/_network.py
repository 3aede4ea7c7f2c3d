"""What the network benchmarks share: an emulator in its own process, reached through a
delay proxy per round trip, and the machine's load for the report.

The emulator runs as ``sendonce emulator`` in a subprocess, so that its broker work
does not share the client's GIL; each RTT gets a :class:`~delay_proxy.DelayProxy`
in front of it (RTT 0 connects directly).
"""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from delay_proxy import DelayProxy, with_port

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend

__all__ = ["PIDS", "CpuMeter", "emulator_process", "load", "through_rtts"]

PIDS: dict[str, int] = {}
"""The helper processes running now: "emulator", and "proxy <rtt> ms" per delay proxy."""


@contextlib.contextmanager
def emulator_process(db: Path, profiles: Sequence[EntityProfile]) -> Iterator[str]:
    """Create ``profiles`` in a fresh broker file, serve it; yield the connection string."""
    with LocalBackend(db) as store:
        for profile in profiles:
            store.create_entity(profile)
    code = "from sendonce.cli import main; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "emulator", "--db", str(db), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        PIDS["emulator"] = proc.pid
        yield proc.stdout.readline().strip()
    finally:
        PIDS.pop("emulator", None)
        proc.terminate()
        proc.wait(timeout=20)


@contextlib.contextmanager
def through_rtts(conn_str: str, rtts_ms: Sequence[float]) -> Iterator[dict[float, str]]:
    """One connection string per RTT (ms): a delay proxy each, the emulator itself for 0."""
    port = int(conn_str.split("Endpoint=sb://", 1)[1].split(";", 1)[0].rsplit(":", 1)[1])
    with contextlib.ExitStack() as stack:
        out: dict[float, str] = {}
        for rtt in rtts_ms:
            if rtt <= 0:
                out[rtt] = conn_str
                continue
            proxy = stack.enter_context(DelayProxy("127.0.0.1", port, rtt=rtt / 1000))
            out[rtt] = with_port(conn_str, proxy.port)
            if proxy.pid is not None:
                PIDS[f"proxy {rtt:g} ms"] = proxy.pid
                stack.callback(PIDS.pop, f"proxy {rtt:g} ms", None)
        yield out


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc (0.0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by this process (``time.process_time``), the part of it spent in
    Python's cyclic garbage collector, and the helper processes' (``PIDS``) between
    :meth:`start` and :meth:`stop`: where the machine's cores went."""

    def __init__(self) -> None:
        self.used: dict[str, float] = {"client gc": 0.0}
        self._at: dict[str, float] = {}
        self._gc_started = 0.0

    def _now(self) -> dict[str, float]:
        now = {"client": time.process_time()}
        for name, pid in PIDS.items():
            now[name] = process_cpu(pid)
        return now

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.process_time()
        else:
            self.used["client gc"] += time.process_time() - self._gc_started

    def start(self) -> None:
        gc.callbacks.append(self._gc)
        self._at = self._now()

    def stop(self) -> None:
        for name, value in self._now().items():
            self.used[name] = self.used.get(name, 0.0) + value - self._at.get(name, value)
        gc.callbacks.remove(self._gc)


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"
