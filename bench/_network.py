"""What the network benchmarks share: an emulator in its own process, reached through a
delay proxy per round trip, and the machine's load for the report.

The emulator runs as ``sendonce emulator`` in a subprocess, so that its broker work
does not share the client's GIL; each RTT gets a :class:`~delay_proxy.DelayProxy`
in front of it (RTT 0 connects directly).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from delay_proxy import DelayProxy, with_port

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend

__all__ = ["emulator_process", "load", "through_rtts"]


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
        yield proc.stdout.readline().strip()
    finally:
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
        yield out


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"
