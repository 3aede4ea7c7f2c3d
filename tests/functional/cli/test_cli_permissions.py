"""Issue 23 item 1: permission problems are CLI errors naming the file and what to do.

The command runs in its own process as a user the file permissions apply to: as
root, with the capabilities that bypass them dropped (``setpriv``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sendonce.backends.local import LocalBackend


def _prefix() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("as root, these tests need setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]


def sendonce(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_prefix(), sys.executable, "-m", "sendonce.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Path]:
    """A healthy broker with one message, in a directory of its own."""
    home = tmp_path / "data"
    home.mkdir()
    path = home / "b.db"
    with LocalBackend(path) as backend:
        from sendonce import EntityProfile, IdempotentSender, Message

        backend.create_entity(EntityProfile("orders"))
        with IdempotentSender(backend, "orders") as sender:
            sender.send(Message("x", message_id="1"))
    yield path
    for p in (home, *home.iterdir()):  # let pytest clean up
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def assert_refused(result: subprocess.CompletedProcess[str], *named: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "PermissionError" not in result.stderr
    assert "damaged" not in result.stderr.replace("is not damaged", "")
    for name in named:
        assert name in result.stderr


def test_a_read_only_broker_file_is_named_not_called_damaged(broker: Path):
    broker.chmod(0o444)
    for args in (["broker", "stats", str(broker)], ["broker", "peek", str(broker), "--entity",
                 "orders"], ["broker", "purge", str(broker), "--entity", "orders"]):  # fmt: skip
        result = sendonce(*args, cwd=broker.parent)
        assert_refused(result, f"no write permission on '{broker}'", "chmod")
    assert (
        "this command only reads"
        in sendonce("broker", "stats", str(broker), cwd=broker.parent).stderr
    )
    broker.chmod(0o644)
    with LocalBackend(broker) as backend:
        assert backend.message_ids("orders") == ["1"]  # nothing lost


def test_a_read_only_directory_is_named(broker: Path, tmp_path: Path):
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 2}\n')
    broker.parent.chmod(0o555)
    result = sendonce(
        "publish", str(source), "--to", f"local://{broker}", "--entity", "orders", "--id",
        "{order_id}", "--no-progress", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert_refused(result, f"'{broker.parent}'")
    assert json.loads(result.stdout)["status"] == "error"
    broker.parent.chmod(0o755)
    with LocalBackend(broker) as backend:
        assert backend.message_ids("orders") == ["1"]


def test_a_lock_file_of_another_user_is_named(broker: Path):
    lock = Path(str(broker) + ".lock")
    lock.touch()
    lock.chmod(0o444)  # as another user's 0644 lock looks to us
    result = sendonce("broker", "stats", str(broker), cwd=broker.parent)
    assert_refused(result, f"'{lock}'")


def test_a_read_only_ledger_is_named(tmp_path: Path):
    from sendonce.ledger import Ledger

    path = tmp_path / "ledger.db"
    with Ledger(f"sqlite://{path}"):
        pass
    path.chmod(0o444)
    try:
        result = sendonce("ledger", "stats", str(path), cwd=tmp_path)
        assert_refused(result, f"no write permission on '{path}'")
    finally:
        path.chmod(0o644)
