"""Every sample runs, and the README's demo command proves exactly-once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Spark samples are run by the Spark suite, with its session settings.
SAMPLES = sorted(p for p in (ROOT / "samples").glob("*.py") if not p.name.startswith("spark"))


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_sample_runs(sample: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SERVICEBUS_")}
    proc = subprocess.run(
        [sys.executable, str(sample)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip(), "a sample says what it did"


def test_publish_orders_sample_shows_the_resend_dropped() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "publish_orders.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "first run: sent 3, duplicates 0" in proc.stdout
    assert "resend:    sent 0, duplicates 3" in proc.stdout
    assert proc.stdout.count("received ") == 2  # customer c-42's two orders, in order
    assert proc.stdout.index("12345.2017") < proc.stdout.index("12347.2017")


def test_demo_command_proves_exactly_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sendonce.cli",
            "demo",
            "--orders",
            "600",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "killed with SIGKILL" in proc.stdout
    assert "messages in the queue: 600 for 600 orders" in proc.stdout
    assert "EXACTLY ONCE" in proc.stdout
    assert (tmp_path / "demo-broker.db").exists()


def test_ledger_sample_rerun_sends_only_what_was_missing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "ledger_rerun.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "sent 400, skipped as already sent 600 (from the ledger), failed 0" in proc.stdout
    assert "the queue holds 1000 messages for 1000 orders, 0 twice" in proc.stdout
    assert (tmp_path / "ledger.db").exists()
