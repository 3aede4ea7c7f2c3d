"""Issue 20 item 1, CLI side: a batch that fails ends with the CLI's summary, never a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("azure.servicebus", reason="pip install 'sendonce[azure]'")

SECRET = "c2VjcmV0LWtleS1mb3ItdGVzdHM="


def closed_port() -> int:
    """A port nothing listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def sendonce(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a shell user runs it: its own process, its real stderr."""
    return subprocess.run(
        [sys.executable, "-m", "sendonce.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("records", [1, 3])
def test_publishing_to_an_unreachable_namespace_ends_with_the_summary(tmp_path: Path, records):
    source = tmp_path / "orders.jsonl"
    source.write_text("".join(json.dumps({"order_id": i}) + "\n" for i in range(records)))
    url = (
        f"Endpoint=sb://127.0.0.1:{closed_port()}/;SharedAccessKeyName=RootManageSharedAccessKey;"
        f"SharedAccessKey={SECRET};UseDevelopmentEmulator=true"
    )
    result = sendonce(
        "publish", str(source), "--to", url, "--entity", "orders", "--id", "{order_id}",
        "--window", "1m", "--attempts", "2", "--timeout", "2s", "--no-progress", "--json",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "TypeError" not in result.stderr
    report = json.loads(result.stdout)
    # Said once, and publish stops: a refused connection stored nothing (issue 34 item 8).
    assert (report["status"], report["sent"], report["failed"]) == ("stopped", 0, 0)
    assert report["in_doubt"] == [] and report["failures"] == []
    assert report["error"].startswith("the broker could not be reached")
    assert result.stderr.count("the broker could not be reached") == 1
    assert "nothing was stored" in result.stderr
    assert SECRET not in result.stdout + result.stderr
