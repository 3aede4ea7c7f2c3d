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
from datetime import timedelta
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
    for args in (["broker", "purge", str(broker), "--entity", "orders"],
                 ["broker", "receive", str(broker), "--entity", "orders"],
                 ["broker", "create", str(broker), "--entity", "new"]):  # fmt: skip
        result = sendonce(*args, cwd=broker.parent)
        assert_refused(result, f"no write permission on '{broker}'", "chmod")
    broker.chmod(0o644)
    with LocalBackend(broker) as backend:
        assert backend.message_ids("orders") == ["1"]  # nothing lost


def test_a_broker_the_user_may_not_write_is_inspected_from_a_snapshot(broker: Path):
    """A backup on a read-only volume: stats, peek (the dead-letter queue too) and backup
    work, and nothing is written beside the file."""
    with LocalBackend(broker) as backend:
        [locked] = backend.receive("orders", mode="peek_lock")
        assert locked.lock_token is not None
        backend.dead_letter("orders", locked.lock_token, reason="checked")
    home = broker.parent
    before = sorted(p.name for p in home.iterdir())
    broker.chmod(0o444)
    home.chmod(0o555)
    stats = sendonce("broker", "stats", str(broker), "--json", cwd=home)
    assert stats.returncode == 0, stats.stderr
    assert "showing a snapshot of it taken now" in stats.stderr
    assert "orders" in json.loads(stats.stdout)["entities"]
    peek = sendonce("broker", "peek", str(broker), "--entity", "orders", "--dead-letter", cwd=home)
    assert json.loads(peek.stdout)["dead_letter_reason"] == "checked"
    copy = home.parent / "copy.db"
    assert sendonce("broker", "backup", str(broker), str(copy), cwd=home.parent).returncode == 0
    assert sorted(p.name for p in home.iterdir()) == before
    home.chmod(0o755)
    with LocalBackend(copy) as backend:
        assert backend.peek("orders", sub_queue="dead_letter")[0].message_id == "1"


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
    result = sendonce("broker", "purge", str(broker), "--entity", "orders", cwd=broker.parent)
    assert_refused(result, f"'{lock}'")
    looked = sendonce("broker", "stats", str(broker), cwd=broker.parent)
    assert looked.returncode == 0 and "snapshot" in looked.stderr


def test_a_read_only_ledger_is_read_in_place_writing_nothing_beside_it(tmp_path: Path):
    """Issue 28 item 7: a ledger file the user may not write, in a directory they may: the
    reading commands work and leave no -wal or -shm beside it (they would block its writers
    later); the writing ones are refused; once writable again, publish uses it."""
    from datetime import UTC, datetime

    from sendonce import EntityProfile, Message
    from sendonce.ledger import Key, Ledger

    path = tmp_path / "ledger.db"
    with Ledger(f"sqlite://{path}", clock=lambda: datetime(2026, 1, 1, tzinfo=UTC)) as ledger:
        ledger._prepare(
            "orders", [Message("x", message_id="1")], [Key("1")],
            window=timedelta(minutes=10), margin=timedelta(seconds=5),
        )  # fmt: skip
    with LocalBackend(tmp_path / "b.db") as backend:
        backend.create_entity(EntityProfile("orders"))
    before = sorted(os.listdir(tmp_path))
    path.chmod(0o444)
    try:
        stats = sendonce("ledger", "stats", str(path), "--json", cwd=tmp_path)
        assert stats.returncode == 0, stats.stderr
        assert "reading it read-only" in stats.stderr
        assert json.loads(stats.stdout)["entities"]["orders"]["unconfirmed"] == 1
        listed = sendonce("ledger", "in-doubt", str(path), "--entity", "orders", cwd=tmp_path)
        assert "'1': first attempted 2026-01-01" in listed.stdout, listed.stderr
        compared = sendonce("ledger", "reconcile", str(path), "--entity", "orders",
                            "--broker", "local:b.db", "--json", cwd=tmp_path)  # fmt: skip
        assert json.loads(compared.stdout)["absent"] == [
            {"message_id": "1", "partition_key": None}
        ], compared.stderr
        assert sorted(os.listdir(tmp_path)) == before  # no -wal, no -shm, no .lock
        refused = sendonce("ledger", "confirm", str(path), "--entity", "orders", "--id", "1",
                           cwd=tmp_path)  # fmt: skip
        assert_refused(refused, f"no write permission on '{path}'")
    finally:
        path.chmod(0o644)
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 2}\n')
    published = sendonce(
        "publish", str(source), "--to", "local:b.db", "--entity", "orders", "--id",
        "{order_id}", "--no-progress", "--ledger", str(path), cwd=tmp_path,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr


def test_a_read_only_broker_in_a_writable_directory_is_inspected_writing_nothing(broker: Path):
    """The same for a broker: stats reads a snapshot, and no -wal or -shm is left beside it."""
    home = broker.parent
    before = sorted(p.name for p in home.iterdir())
    broker.chmod(0o444)
    stats = sendonce("broker", "stats", str(broker), "--json", cwd=home)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["entities"]["orders"]["messages"] == 1
    assert sorted(p.name for p in home.iterdir()) == before
    broker.chmod(0o644)


def test_a_broker_on_a_read_only_file_system_is_inspected_not_written(broker: Path):
    """A real read-only mount (a bind mount remounted read-only in a private mount
    namespace): the reading commands work from a snapshot, the writing ones are refused."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare (util-linux) for a private read-only mount")
    home = str(broker.parent)
    probe = subprocess.run(
        [unshare, "-m", "sh", "-c", f"mount --bind {home} {home} && "
         f"mount -o remount,ro,bind {home}"],
        capture_output=True, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"this machine allows no private mounts: {probe.stderr!r}")
    before = sorted(os.listdir(home))

    def on_read_only_mount(*args: str) -> subprocess.CompletedProcess[str]:
        command = " ".join(repr(a) for a in [sys.executable, "-m", "sendonce.cli", *args])
        script = f"mount --bind {home} {home} && mount -o remount,ro,bind {home} && {command}"
        return subprocess.run(
            [unshare, "-m", "sh", "-c", script],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    stats = on_read_only_mount("broker", "stats", str(broker), "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["entities"]["orders"]["messages"] == 1
    refused = on_read_only_mount("broker", "purge", str(broker), "--entity", "orders")
    assert_refused(refused, "is on a read-only file system", "Copy it to a writable place")
    assert sorted(os.listdir(home)) == before
