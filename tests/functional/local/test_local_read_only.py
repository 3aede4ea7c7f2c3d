"""Inspecting a broker this user may not write: ``LocalBackend(path, read_only=True)``.

A read-only file, a read-only directory, a read-only file system, a ``.lock`` of
another user. Each check runs in its own process as a user the permissions apply
to (as root: with the capabilities that bypass them dropped, ``setpriv``), and
prints what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sendonce import EntityProfile, Message
from sendonce.backends.local import LocalBackend

# Opens the broker both ways and tries reads and writes; prints what happened.
PROBE = textwrap.dedent(
    """
    import json, sys
    from sendonce import Message
    from sendonce.backends.local import LocalBackend

    path = sys.argv[1]
    out = {}

    def attempt(name, call):
        try:
            out[name] = {"ok": call()}
        except Exception as exc:
            out[name] = {"error": type(exc).__name__, "text": str(exc),
                         "field": getattr(exc, "field", None)}

    attempt("open_for_writing", lambda: LocalBackend(path).close())
    with LocalBackend(path, read_only=True) as broker:
        attempt("message_ids", lambda: broker.message_ids("orders"))
        attempt("count", lambda: broker.count("orders"))
        attempt("stats", lambda: broker.stats("orders")["messages"])
        attempt("peek", lambda: [m.message_id for m in broker.peek("orders", max_messages=9)])
        attempt("dead_letters", lambda: [m.dead_letter_reason
                                         for m in broker.peek("orders", sub_queue="dead_letter")])
        attempt("entities", lambda: [p.name for p in broker.entities()])
        attempt("backup", lambda: broker.backup(sys.argv[2]))
        attempt("send", lambda: broker.send("orders", [Message("x", message_id="new")],
                                            timeout=5))
        attempt("receive", lambda: broker.receive("orders"))
        attempt("purge", lambda: broker.purge("orders"))
    print(json.dumps(out))
    """
)


def _as_a_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("as root, these tests need setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]


def probe(path: Path, *, prefix: list[str] | None = None) -> dict[str, Any]:
    command = [*(_as_a_user() if prefix is None else prefix), sys.executable, "-c", PROBE]
    copy = path.parent.parent / f"copy-{uuid.uuid4().hex[:8]}.db"  # a writable place
    result = subprocess.run(
        [*command, str(path), str(copy)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    seen: dict[str, Any] = json.loads(result.stdout)
    assert seen["backup"] == {"ok": None}, seen["backup"]
    with LocalBackend(copy) as backup:  # a consistent copy, a broker like any other
        assert backup.message_ids("orders") == seen["message_ids"]["ok"]
    return seen


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Path]:
    """A healthy broker with two messages, one of them dead-lettered, in its own directory."""
    home = tmp_path / "data"
    home.mkdir()
    path = home / "b.db"
    with LocalBackend(path) as backend:
        backend.create_entity(EntityProfile("orders"))
        backend.send("orders", [Message("a", message_id="1")], timeout=5)
        [locked] = backend.receive("orders", mode="peek_lock")
        assert locked.lock_token is not None
        backend.dead_letter("orders", locked.lock_token, reason="checked")
        backend.send("orders", [Message("b", message_id="2")], timeout=5)
    yield path
    for p in (home, *home.iterdir()):  # let pytest clean up
        p.chmod(p.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)


def assert_inspected_not_written(seen: dict[str, Any], path: Path) -> None:
    assert seen["message_ids"] == {"ok": ["2"]}
    assert seen["count"] == {"ok": 1}
    assert seen["stats"] == {"ok": 2}  # stored messages, the dead-lettered one too
    assert seen["peek"] == {"ok": ["2"]}
    assert seen["dead_letters"] == {"ok": ["checked"]}
    assert seen["entities"] == {"ok": ["orders"]}
    for write in ("send", "receive", "purge"):
        assert seen[write]["error"] == "ConfigurationError", seen[write]
        assert seen[write]["field"] == "read_only"
        assert str(path) in seen[write]["text"]


def assert_refused_for_writing(seen: dict[str, Any], *named: str) -> None:
    refusal = seen["open_for_writing"]
    assert refusal["error"] == "ConfigurationError", refusal
    assert "damaged" not in refusal["text"]
    assert "read_only=True" in refusal["text"]
    for name in named:
        assert name in refusal["text"]


def assert_intact(path: Path) -> None:
    with LocalBackend(path) as backend:
        assert backend.message_ids("orders") == ["2"]
        assert backend.count("orders", sub_queue="dead_letter") == 1


def test_a_read_only_file_is_inspected_and_not_called_damaged(broker: Path) -> None:
    content = broker.read_bytes()
    broker.chmod(0o444)
    seen = probe(broker)
    assert_refused_for_writing(seen, str(broker))
    assert_inspected_not_written(seen, broker)
    assert broker.read_bytes() == content
    broker.chmod(0o644)
    assert_intact(broker)


def test_a_read_only_directory_is_inspected_with_nothing_written_beside_the_file(
    broker: Path,
) -> None:
    home = broker.parent
    before = sorted(os.listdir(home))
    home.chmod(0o555)
    seen = probe(broker)
    assert_refused_for_writing(seen, f"'{home}'")
    assert_inspected_not_written(seen, broker)
    assert sorted(os.listdir(home)) == before
    home.chmod(0o755)
    assert_intact(broker)


def test_a_lock_file_of_another_user_is_named_and_the_broker_inspected(broker: Path) -> None:
    lock = Path(f"{broker}.lock")
    lock.touch()
    lock.chmod(0o444)  # as another user's 0644 lock looks to us
    seen = probe(broker)
    assert_refused_for_writing(seen, str(lock))
    assert_inspected_not_written(seen, broker)
    assert_intact(broker)


def test_a_reader_sees_what_a_live_writer_committed(broker: Path) -> None:
    """The writer keeps the file open (its messages still in the write-ahead log)."""
    with LocalBackend(broker) as writer:
        writer.send("orders", [Message("c", message_id="3")], timeout=5)
        assert os.path.getsize(f"{broker}-wal") > 0
        for name in (broker, Path(f"{broker}-wal"), Path(f"{broker}-shm")):
            name.chmod(0o444)
        seen = probe(broker)
        assert seen["message_ids"] == {"ok": ["2", "3"]}
        assert seen["send"]["field"] == "read_only"
        for name in (broker, Path(f"{broker}-wal"), Path(f"{broker}-shm")):
            name.chmod(0o644)
        assert writer.message_ids("orders") == ["2", "3"]


def test_a_broker_on_a_read_only_file_system_is_inspected(broker: Path) -> None:
    """A real read-only mount (a bind mount remounted read-only in a private namespace)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare (util-linux) for a private read-only mount")
    home = str(broker.parent)
    mount = f"mount --bind {home} {home} && mount -o remount,ro,bind {home}"
    check = subprocess.run([unshare, "-m", "sh", "-c", mount], capture_output=True, check=False)
    if check.returncode != 0:
        pytest.skip(f"this machine allows no private mounts: {check.stderr!r}")
    before = sorted(os.listdir(home))
    runner = [unshare, "-m", "sh", "-c", f'{mount} && exec "$@"', "sh"]
    seen = probe(broker, prefix=runner)
    assert_refused_for_writing(seen, "read-only")
    assert_inspected_not_written(seen, broker)
    assert sorted(os.listdir(home)) == before
    assert_intact(broker)


def test_one_process_reading_and_writing_shares_one_connection(broker: Path) -> None:
    with LocalBackend(broker) as writer, LocalBackend(broker, read_only=True) as reader:
        assert reader.read_only and not writer.read_only
        writer.send("orders", [Message("c", message_id="3")], timeout=5)
        assert reader.message_ids("orders") == ["2", "3"]
        with pytest.raises(Exception, match="read_only=True") as info:
            reader.purge("orders")
        assert getattr(info.value, "field", None) == "read_only"
    with LocalBackend(broker, read_only=True) as reader:
        with pytest.raises(Exception, match="open read-only in this process"):
            LocalBackend(broker)
        assert reader.count("orders") == 2
    from sendonce.backends import connect_local

    with connect_local(f"local://{broker}?read_only=true") as by_url:
        assert by_url.read_only and by_url.message_ids("orders") == ["2", "3"]
