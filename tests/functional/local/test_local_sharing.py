"""Sharing one broker file the ways users do (issue 10): every case once lost acknowledged
messages or let a duplicate through. Each test ends with every acknowledged message
present exactly once, or with a loud, specific refusal and nothing acknowledged."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from _interrupts import sigint_default
from sendonce import EntityProfile, IdempotentSender, Message, MessageIdTemplate
from sendonce.backends.local import BrokerFileError, LocalBackend
from sendonce.errors import ConfigurationError, KeyRuleError, MessageIdError

ORDERS = EntityProfile("orders")


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "broker.db")
    with LocalBackend(path) as broker:
        broker.create_entity(ORDERS)
    return path


def messages(prefix: str, start: int, count: int) -> list[Message]:
    return [
        Message(f"body-{prefix}-{i}", message_id=f"{prefix}-{i}")
        for i in range(start, start + count)
    ]


SENDER = textwrap.dedent(
    """
    import sys
    from sendonce import Message
    from sendonce.backends.local import LocalBackend

    path, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with LocalBackend(path) as broker:
        for start in range(0, count, 100):
            batch = [Message(f"body-{prefix}-{i}", message_id=f"{prefix}-{i}")
                     for i in range(start, min(count, start + 100))]
            for m, ack in zip(batch, broker.send("orders", batch, timeout=30)):
                if ack.outcome == "accepted":
                    print(m.message_id, flush=True)
    """
)


def send_in_other_process(db: str, prefix: str, count: int) -> list[str]:
    """Another process sends ``count`` messages; returns the ids acknowledged ``accepted``."""
    done = subprocess.run(
        [sys.executable, "-c", SENDER, db, prefix, str(count)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split()


def stored_ids(db: str) -> list[str]:
    """What a fresh process finds in the file: the truth after every handle is closed."""
    code = "import sys; from sendonce.backends.local import LocalBackend\n"
    code += "with LocalBackend(sys.argv[1]) as b: print('\\n'.join(b.message_ids('orders')))"
    out = subprocess.run(
        [sys.executable, "-c", code, db], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.split()


def assert_each_once(db: str, acked: list[str]) -> None:
    stored = stored_ids(db)
    assert len(stored) == len(set(stored)), "a message is stored twice"
    missing = sorted(set(acked) - set(stored))
    assert missing == [], f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"


# 1. A second handle in one process -------------------------------------------------------


def test_a_second_handle_opened_and_closed_beside_an_open_one_loses_nothing(db: str) -> None:
    keep = LocalBackend(db)  # e.g. the Spark driver's backend, kept open during publish
    keep.send("orders", messages("driver", 0, 10), timeout=30)
    LocalBackend(db).close()  # a helper, a preflight, a second url sender
    with IdempotentSender(f"local://{db}", "orders") as other:  # a url sender, closed again
        other.send(Message("x", message_id="url-sender"))
    acked = send_in_other_process(db, "child", 1000)  # writes, closes: "last one out"?
    keep.send("orders", messages("driver", 10, 10), timeout=30)  # a stale view writes here
    acked += send_in_other_process(db, "later", 1000)
    keep.send("orders", messages("driver", 20, 10), timeout=30)
    keep.close()
    assert len(acked) == 2000
    assert_each_once(db, [*acked, "url-sender", *(f"driver-{i}" for i in range(30))])


def test_handles_on_one_file_share_one_connection(db: str, tmp_path: Path) -> None:
    from sendonce import _sqlite_share

    link = tmp_path / "link.db"
    link.symlink_to(db)
    with (
        LocalBackend(db) as a,
        LocalBackend(link) as b,
        LocalBackend(str(tmp_path) + "/./broker.db"),
    ):
        assert _sqlite_share.open_files().count(os.path.realpath(db)) == 1
        assert a.real_path == b.real_path == os.path.realpath(db)
    assert os.path.realpath(db) not in _sqlite_share.open_files()  # (other tests' files aside)


# 2. and 3. Forked children ---------------------------------------------------------------


def _child_sends(
    db: str, prefix: str, out: str, started: multiprocessing.synchronize.Event
) -> None:
    acked = []
    with LocalBackend(db) as own:  # the child's own backend, opened after the fork
        for start in range(0, 600, 20):
            batch = messages(prefix, start, 20)
            for m, ack in zip(batch, own.send("orders", batch, timeout=30), strict=True):
                if ack.outcome == "accepted":
                    acked.append(m.message_id)
            started.set()
            time.sleep(0.002)
    Path(out).write_text("\n".join(acked))


def test_forked_children_keep_their_messages_when_the_parent_closes_first(
    db: str, tmp_path: Path
) -> None:
    fork = multiprocessing.get_context("fork")
    children = []
    with LocalBackend(db) as parent:
        parent.send("orders", messages("parent", 0, 5), timeout=30)
        for k in range(3):
            started = fork.Event()
            child = fork.Process(
                target=_child_sends, args=(db, f"child{k}", str(tmp_path / f"{k}.txt"), started)
            )
            child.start()
            children.append((child, started))
        for _, started in children:
            assert started.wait(60)
    # The parent has closed while its children still send.
    for child, _ in children:
        child.join(120)
        assert child.exitcode == 0
    acked = [i for k in range(3) for i in (tmp_path / f"{k}.txt").read_text().split()]
    assert len(acked) == 1800
    assert_each_once(db, [*acked, *(f"parent-{i}" for i in range(5))])
    # No split brain: an unrelated process is told every one of those ids is a duplicate.
    assert send_in_other_process(db, "child0", 600) == []


def _use_inherited(backend: LocalBackend, out: str) -> None:
    acks = backend.send("orders", messages("inherited", 0, 50), timeout=30)
    Path(out).write_text(str(sum(a.outcome == "accepted" for a in acks)))
    backend.close()


def test_a_child_can_use_and_close_the_backend_it_inherited(db: str, tmp_path: Path) -> None:
    fork = multiprocessing.get_context("fork")
    with LocalBackend(db) as parent:
        child = fork.Process(target=_use_inherited, args=(parent, str(tmp_path / "n.txt")))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert (tmp_path / "n.txt").read_text() == "50"
        assert clean_flag(db) == "0"  # the child's close did not mark the file closed
        acks = parent.send("orders", messages("inherited", 0, 60), timeout=30)
        assert [a.outcome for a in acks] == ["duplicate"] * 50 + ["accepted"] * 10
    assert clean_flag(db) == "1"
    assert_each_once(db, [f"inherited-{i}" for i in range(60)])


def _idle() -> None:
    time.sleep(0.01)


def test_an_idle_forked_pool_does_not_lock_out_later_openers(db: str) -> None:
    fork = multiprocessing.get_context("fork")
    with LocalBackend(db) as broker:
        pool = fork.Pool(2)  # created inside the with-block: the children inherit it all
        pool.apply(_idle)
        broker.send("orders", messages("before", 0, 3), timeout=30)
    try:
        # The parent closed; the idle children still run. A later opener must get in.
        stats = subprocess.run(
            [sys.executable, "-m", "sendonce.cli", "broker", "stats", db],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stats.returncode == 0, stats.stderr
        assert "orders" in stats.stdout
        acked = send_in_other_process(db, "after", 100)
        assert len(acked) == 100
    finally:
        pool.terminate()
        pool.join()
    assert_each_once(db, [*acked, "before-0", "before-1", "before-2"])


def clean_flag(db: str) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT value FROM meta WHERE key = 'clean'").fetchone()[0])
    finally:
        conn.close()


# 4. Ctrl-C while waiting for the write lock ----------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    conn.execute("COMMIT")
    """
)


def test_ctrl_c_while_waiting_for_the_write_lock_leaves_the_backend_usable(db: str) -> None:
    with LocalBackend(db) as broker:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, db, "1.0"], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        # Ctrl-C arrives while the send waits; Python raises it as soon as SQLite returns,
        # which is right after BEGIN IMMEDIATE finally succeeds.
        with sigint_default():
            timer = threading.Timer(0.3, signal.raise_signal, (signal.SIGINT,))
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                broker.send("orders", messages("interrupted", 0, 1), timeout=30)
                time.sleep(5)  # pragma: no cover - the interrupt must have come by now
            timer.join()
        holder.wait(30)
        # Nothing is left open: other processes get in, and this backend still works.
        acked = send_in_other_process(db, "other", 10)
        assert len(acked) == 10
        (ack,) = broker.send("orders", messages("after", 0, 1), timeout=30)
        assert ack.outcome == "accepted"
    stored = stored_ids(db)
    assert stored.count("interrupted-0") <= 1  # in doubt: at most once
    assert_each_once(db, [*acked, "after-0"])


# 5. NUL characters -----------------------------------------------------------------------


@pytest.mark.parametrize("field", ["message_id", "partition_key", "session_id"])
def test_nul_in_ids_and_keys_is_refused_naming_the_field(field: str) -> None:
    values = {"message_id": "order", field: "order\x00A"}
    error = MessageIdError if field == "message_id" else KeyRuleError
    with pytest.raises(error) as info:
        Message("x", **values)  # type: ignore[arg-type]
    assert info.value.field == field
    assert "NUL" in str(info.value)


def test_nul_in_an_id_field_value_or_template_is_refused() -> None:
    with pytest.raises(MessageIdError) as info:
        MessageIdTemplate("{order_id}.{year}").build({"order_id": "12\x003", "year": 2017})
    assert info.value.field == "order_id"
    with pytest.raises(MessageIdError) as template:
        MessageIdTemplate("{order_id}\x00{year}")
    assert template.value.field == "template"


def test_keys_that_differ_only_after_a_nul_are_never_merged(db: str) -> None:
    # Nothing with NUL reaches the broker; the ids that do are each stored once.
    with LocalBackend(db) as broker:
        acks = broker.send("orders", [Message("a", message_id="order")], timeout=30)
        assert acks[0].outcome == "accepted"
        for bad in ("order\x00A", "order\x00B"):
            with pytest.raises(MessageIdError):
                Message("b", message_id=bad)
    assert stored_ids(db) == ["order"]


# 6. Paths: symbolic and hard links -------------------------------------------------------

HOLD_OPEN = textwrap.dedent(
    """
    import sys
    from sendonce import Message
    from sendonce.backends.local import LocalBackend
    with LocalBackend(sys.argv[1]) as b:
        print(b.send("volatile", [Message("x", message_id="seen")], timeout=30)[0].outcome,
              flush=True)
        sys.stdin.readline()
    """
)


def test_opening_through_a_symlink_is_not_a_broker_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "broker.db")
    link = tmp_path / "alias.db"
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("volatile", id_cache_size=100, persist_id_cache=False))
    link.symlink_to(db)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OPEN, db],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "accepted"
        # The file is open in another process, so the broker is running: a non-persisted
        # cache must survive an open through another name.
        with LocalBackend(link) as via_link:
            (ack,) = via_link.send("volatile", [Message("x", message_id="seen")], timeout=30)
        assert ack.outcome == "duplicate"
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(30)


def test_a_hard_linked_broker_file_is_refused(db: str, tmp_path: Path) -> None:
    second = str(tmp_path / "second.db")
    os.link(db, second)
    for name in (db, second):
        with pytest.raises(BrokerFileError) as info:
            LocalBackend(name, busy_timeout=5)
        assert "hard links" in str(info.value)
        assert info.value.field == "path"
    os.unlink(second)
    with LocalBackend(db) as broker:  # one name again: usable
        assert broker.send("orders", messages("ok", 0, 1), timeout=30)[0].outcome == "accepted"


# 7. The file deleted, renamed or replaced while open -------------------------------------


@pytest.mark.parametrize("change", ["delete", "rename", "replace"])
def test_a_file_moved_away_while_open_is_never_written_to_again(
    db: str, tmp_path: Path, change: str
) -> None:
    with LocalBackend(db) as broker:
        broker.send("orders", messages("before", 0, 5), timeout=30)
        if change == "delete":
            os.unlink(db)
        elif change == "rename":
            os.rename(db, str(tmp_path / "moved.db"))
        else:
            other = str(tmp_path / "other.db")
            with LocalBackend(other) as fresh:
                fresh.create_entity(ORDERS)
            os.rename(other, db)
        with pytest.raises(BrokerFileError) as info:
            broker.send("orders", messages("after", 0, 5), timeout=30)
        assert "while open" in str(info.value)
        # It stays refused: nothing is ever acknowledged into a file nobody can open.
        with pytest.raises(BrokerFileError):
            broker.send("orders", messages("after", 5, 5), timeout=30)


def test_a_stale_wal_left_by_a_deleted_file_is_not_replayed_into_a_new_one(tmp_path: Path) -> None:
    db = str(tmp_path / "b.db")
    code = textwrap.dedent(
        """
        import os, sys
        from sendonce import EntityProfile, Message
        from sendonce.backends.local import LocalBackend
        b = LocalBackend(sys.argv[1])
        b.create_entity(EntityProfile("orders"))
        b.send("orders", [Message("x", message_id="old-1")], timeout=30)
        os._exit(0)  # no clean close: the commit lives in the -wal only
        """
    )
    subprocess.run([sys.executable, "-c", code, db], check=True, timeout=60)
    assert os.path.getsize(db + "-wal") > 0
    os.unlink(db)  # the user deletes "the broker file"
    with pytest.raises(BrokerFileError) as info:
        LocalBackend(db)
    assert "-wal" in str(info.value) and "leftover" in str(info.value)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    with LocalBackend(db) as fresh:  # now an empty broker, honestly
        fresh.create_entity(ORDERS)
        assert (
            fresh.send("orders", [Message("x", message_id="old-1")], timeout=30)[0].outcome
            == "accepted"
        )


# 8. Operational edges: a full disk and backups -------------------------------------------

FILL = textwrap.dedent(
    """
    import os, resource, signal, sys
    from sendonce import Message
    from sendonce.backends.local import BrokerStorageError, LocalBackend
    from sendonce.errors import PermanentSendError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    path = sys.argv[1]
    with LocalBackend(path) as b:
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 400_000,) * 2)
        for i in range(1000):
            m = Message("x" * 20_000, message_id=f"big-{i}")
            try:
                b.send("orders", [m], timeout=30)
            except BrokerStorageError as exc:
                kind = "permanent" if isinstance(exc, PermanentSendError) else "other"
                print("ERROR", kind, exc, flush=True)
                break
            print(m.message_id, flush=True)
    """
)


def test_a_full_disk_is_a_sendonce_error_and_loses_nothing_acknowledged(db: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FILL, db], capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.splitlines()
    assert lines and lines[-1].startswith("ERROR"), (done.stdout[-500:], done.stderr[-2000:])
    error = lines[-1]
    assert error.startswith("ERROR permanent ")  # not retried: the sender reports "not stored"
    assert "nothing of it was stored" in error and "intact" in error
    assert "sqlite3" not in error
    acked = lines[:-1]
    assert len(acked) > 3
    assert_each_once(db, acked)


def test_backup_of_a_live_broker_is_consistent(db: str, tmp_path: Path) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", SENDER, db, "live", "3000"], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    writer.stdout.readline()  # it is writing
    copies = []
    with LocalBackend(db) as broker:
        for k in range(3):
            target = str(tmp_path / f"copy{k}.db")
            broker.backup(target)
            copies.append(target)
    writer.wait(120)
    for target in copies:
        with LocalBackend(target) as copy:
            ids = copy.message_ids("orders")
            assert copy.describe("orders") == ORDERS
        assert ids == [f"live-{i}" for i in range(len(ids))]  # a consistent prefix


def test_backup_refuses_to_overwrite(db: str, tmp_path: Path) -> None:
    target = tmp_path / "exists.db"
    target.write_text("precious")
    with LocalBackend(db) as broker, pytest.raises(ConfigurationError) as info:
        broker.backup(target)
    assert info.value.field == "target"
    assert target.read_text() == "precious"


def test_create_false_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    with pytest.raises(ConfigurationError) as info:
        LocalBackend(missing, create=False)
    assert info.value.field == "path"
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_broker_is_left_untouched(tmp_path: Path) -> None:
    data = tmp_path / "orders.csv"
    data.write_text("order_id,amount\n1,2\n" * 50)
    before = data.read_bytes()
    with pytest.raises(BrokerFileError) as info:
        LocalBackend(data)
    assert "check the path" in str(info.value) and "remove" not in str(info.value)
    assert data.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orders.csv"]


# The rule behind all of it: no code of the package opens a database file outside SQLite.


def test_no_module_opens_files_outside_sqlite_except_where_allowed() -> None:
    import ast

    import sendonce

    root = Path(sendonce.__file__).parent
    allowed = {
        "_sqlite_share.py": {"os.open"},  # the opener lock's side file <db>.lock
        "_placement.py": {"_BOOT_ID.read_text"},  # /proc/sys/kernel/random/boot_id
    }
    user_files = {"cli"}  # the command line reads and writes the user's own files
    offenders = []
    for module in root.rglob("*.py"):
        relative = module.relative_to(root)
        if relative.parts[0] in user_files or relative.name in user_files:
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            opens = name in {"open", "os.open", "io.open", "os.fdopen"} or name.endswith(
                (".read_bytes", ".read_text", ".write_bytes", ".write_text")
            )
            if opens and name not in allowed.get(module.name, set()):
                offenders.append(f"{relative}:{node.lineno} {name}")
    assert offenders == []


# How people hold it: threads with their own handles, and CLI commands beside a producer.


def test_threads_opening_and_closing_their_own_handles_lose_nothing(db: str) -> None:
    acked: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        try:
            for round_ in range(5):
                with LocalBackend(db) as own:  # opened and closed again and again
                    batch = messages(f"t{k}r{round_}", 0, 40)
                    acks = own.send("orders", batch, timeout=60)
                with lock:
                    acked.extend(m.message_id for m, a in zip(batch, acks, strict=True))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    writer = subprocess.Popen(
        [sys.executable, "-c", SENDER, db, "proc", "2000"], stdout=subprocess.PIPE, text=True
    )
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    out, _ = writer.communicate(timeout=120)
    assert errors == []
    assert len(acked) == 6 * 5 * 40
    assert_each_once(db, [*acked, *out.split()])


def test_cli_commands_beside_a_producer_lose_nothing(db: str) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", SENDER, db, "live", "3000"], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    writer.stdout.readline()
    for command in (["stats", db], ["peek", db, "--entity", "orders"], ["stats", db, "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "sendonce.cli", "broker", *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    out = writer.stdout.read()  # (communicate() would skip what readline() buffered)
    writer.wait(120)
    acked = ["live-0", *out.split()]
    assert len(acked) == 3000
    assert_each_once(db, acked)


def test_the_backup_command_copies_a_live_broker(db: str, tmp_path: Path) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", SENDER, db, "live", "3000"], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    writer.stdout.readline()
    target = str(tmp_path / "copy.db")
    done = subprocess.run(
        [sys.executable, "-m", "sendonce.cli", "broker", "backup", db, target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    writer.stdout.read()
    writer.wait(120)
    assert done.returncode == 0, done.stderr
    with LocalBackend(target) as copy:
        ids = copy.message_ids("orders")
    assert ids == [f"live-{i}" for i in range(len(ids))] and len(ids) >= 1
    again = subprocess.run(
        [sys.executable, "-m", "sendonce.cli", "broker", "backup", db, target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode != 0 and "never overwrites" in again.stderr


def test_a_write_ahead_log_deleted_by_hand_while_open_is_detected(db: str) -> None:
    with LocalBackend(db) as broker:
        broker.send("orders", messages("before", 0, 5), timeout=30)
        for suffix in ("-wal", "-shm"):  # "cleaning up" the side files of a live broker
            os.unlink(db + suffix)
        with pytest.raises(BrokerFileError) as info:
            broker.send("orders", messages("after", 0, 5), timeout=30)
        assert "-wal" in str(info.value)
