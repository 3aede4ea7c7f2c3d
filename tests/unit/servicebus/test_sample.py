"""samples/servicebus_publish.py runs as documented."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[3] / "samples" / "servicebus_publish.py"


def _run(env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SERVICEBUS_")}
    return subprocess.run(
        [sys.executable, str(SAMPLE)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_without_the_variables_it_explains_how_to_run_and_exits_0() -> None:
    done = _run({})
    assert done.returncode == 0, done.stderr
    assert "SERVICEBUS_CONNECTION_STRING" in done.stdout
    assert "SERVICEBUS_QUEUE" in done.stdout
    assert "docs/servicebus.md" in done.stdout


@pytest.mark.slow
def test_an_unreachable_namespace_fails_cleanly_without_printing_the_key() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    secret = "VGhpc0lzQVNlY3JldEtleVRoYXRNdXN0TmV2ZXJMZWFr="
    conn_str = (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        f"SharedAccessKey={secret};UseDevelopmentEmulator=true"
    )
    done = _run({"SERVICEBUS_CONNECTION_STRING": conn_str, "SERVICEBUS_QUEUE": "orders"})
    assert done.returncode == 1
    # A refused connection stored nothing: not stored (safe to resend), not in doubt.
    assert "error: NeverSentError" in done.stderr
    assert secret not in done.stdout + done.stderr


@pytest.mark.emulator
@pytest.mark.timeout(180)
def test_against_the_emulator_each_order_lands_once(tmp_path: Path) -> None:
    pytest.importorskip("proton")
    from sendonce import EntityProfile
    from sendonce.backends.local import LocalBackend
    from sendonce.emulator import Emulator

    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        store.create_entity(EntityProfile("orders"))  # what the sample assumes
        with Emulator(path, poll_interval=0.02) as emulator:
            env = {
                "SERVICEBUS_CONNECTION_STRING": emulator.connection_string,
                "SERVICEBUS_QUEUE": "orders",
            }
            first = _run(env)
            second = _run(env)  # a restarted producer publishing the same orders
        assert first.returncode == 0, first.stderr
        assert second.returncode == 0, second.stderr
        assert "first run: sent 3, failed 0" in first.stdout
        received = store.receive("orders", max_messages=20)
    assert sorted(m.message_id for m in received) == [
        "12345.2017/payment",
        "12346.2017/payment",
        "12347.2017/payment",
    ]
