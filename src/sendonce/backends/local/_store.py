"""The broker file: schema, opening and verifying it, and write transactions under contention.

One SQLite file in WAL mode holds everything. Many processes may write at once:
every write runs in ``BEGIN IMMEDIATE`` (the write lock is taken up front, so a
transaction never fails half-way on a lock upgrade) and a busy database is
retried with tenacity until the call's timeout, so ``database is locked`` never
reaches a caller: it becomes a ``TransientSendError`` (or the caller's error type).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal, TypeVar

import tenacity

from ...errors import ConfigurationError
from ._schema import FORMAT, SCHEMA, SCHEMA_VERSION, upgrade

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "BrokerFileError",
    "Durability",
    "from_us",
    "close_store",
    "is_busy",
    "mark_clean",
    "open_store",
    "to_us",
    "write_transaction",
]

T = TypeVar("T")
Durability = Literal["normal", "full"]

_SQLITE_MAGIC = b"SQLite format 3\x00"
# Files below this size are fully checked on every restart, cleanly closed or not.
VERIFY_ALWAYS_BELOW = 64 * 1024 * 1024


class BrokerFileError(ConfigurationError):
    """The broker file is damaged, truncated, or not a sendonce broker.

    Opening it anyway could silently forget duplicate-detection history, so the
    broker refuses it. The message names the path.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"broker file {path!r} {reason}; refusing to open it, because duplicate-detection "
            "history could be lost. Restore it from a backup or remove it (and its -wal, -shm "
            "and .lock files) to start an empty broker.",
            field="path",
        )
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[type[BrokerFileError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


def to_us(moment: datetime) -> int:
    """Microseconds since the epoch of an aware datetime: how times are stored."""
    return (moment - _EPOCH) // _MICROSECOND


def from_us(value: int) -> datetime:
    return _EPOCH + value * _MICROSECOND


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - _EPOCH


def is_busy(exc: BaseException) -> bool:
    """A lock held by another connection: retrying later will help."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _is_damage(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.DatabaseError) or is_busy(exc):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return True
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text or "corrupt" in text


# The busy_timeout in force per connection (by id, reset whenever a connection opens).
_busy_ms: dict[int, int] = {}


def _connect(path: str, durability: Durability, busy_timeout: float) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    _busy_ms[id(conn)] = int(busy_timeout * 1000)  # what sqlite3.connect set
    conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
    conn.execute("PRAGMA cache_size=-65536")  # 64 MiB: keeps the id index hot
    # Checkpoint every ~16 MB of WAL rather than 4 MB: a page rewritten by many
    # commits is copied back once, and the sync of a checkpoint is paid less often.
    conn.execute("PRAGMA wal_autocheckpoint=4000")
    conn.execute("PRAGMA temp_store=MEMORY")
    return conn


def close_store(conn: sqlite3.Connection) -> None:
    """Close a connection opened by :func:`open_store`."""
    _busy_ms.pop(id(conn), None)
    conn.close()


def _create(path: str) -> None:
    """Create an empty broker atomically: build it aside, then link it into place."""
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new"
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(f"BEGIN;{SCHEMA}COMMIT;")
    finally:
        conn.close()
    try:
        os.link(tmp, path)  # fails if another process created it first: use theirs
    except FileExistsError:
        pass
    finally:
        for leftover in (tmp, tmp + "-wal", tmp + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _check_header(path: str) -> None:
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise BrokerFileError(path, f"cannot be read ({exc.strerror})") from None
    if len(header) < 100:
        raise BrokerFileError(path, f"is truncated ({len(header)} bytes, not a SQLite database)")
    if not header.startswith(_SQLITE_MAGIC):
        raise BrokerFileError(path, "is not a SQLite database (bad header)")
    _check_size(path, header)


def _check_size(path: str, header: bytes) -> None:
    """A file shorter than its header says is truncated (checked when no WAL holds pages)."""
    wal = path + "-wal"
    if os.path.exists(wal) and os.path.getsize(wal) > 0:
        return  # pages may legitimately live in the WAL until the next checkpoint
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[92:96] != header[24:28] or page_size < 512:
        return  # the in-header size is not valid: leave it to quick_check
    size = os.path.getsize(path)
    if size < pages * page_size or size % page_size:
        raise BrokerFileError(
            path, f"is truncated ({size} bytes, its header says {pages * page_size})"
        )


def _check_meta(conn: sqlite3.Connection, path: str, *, may_upgrade: bool) -> dict[str, str]:
    try:
        rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError as exc:
        if is_busy(exc):
            raise
        raise BrokerFileError(path, "is a SQLite database but not a sendonce broker") from None
    if rows.get("format") != FORMAT:
        raise BrokerFileError(path, "is a SQLite database but not a sendonce broker")
    version = rows.get("schema_version")
    if version != SCHEMA_VERSION and may_upgrade and version is not None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            upgraded = upgrade(conn, version)
            conn.execute("COMMIT" if upgraded else "ROLLBACK")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if upgraded:
            rows["schema_version"] = version = SCHEMA_VERSION
    if version != SCHEMA_VERSION:
        raise BrokerFileError(
            path, f"has schema version {version!r}; this sendonce reads {SCHEMA_VERSION!r}"
        )
    return rows


def mark_clean(conn: sqlite3.Connection, clean: bool) -> None:
    """Record whether every backend closed the file normally (the last one out sets it)."""
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('clean', ?)", ("1" if clean else "0",)
    )


def open_store(
    path: str, *, durability: Durability, busy_timeout: float, verify: bool
) -> sqlite3.Connection:
    """Open (creating if absent) and check the broker file.

    Every open checks the header, the file size against it, and the format
    marker. ``verify`` (the first opener, i.e. a broker "restart") also runs
    ``PRAGMA quick_check`` over the whole file when the last run did not end
    with a clean close (a crash, a kill -9) or the file is small enough for the
    check to be cheap; it then marks the file as in use until the last close.
    """
    if not os.path.exists(path):
        _create(path)
    _check_header(path)
    try:
        conn = _connect(path, durability, busy_timeout)
    except sqlite3.DatabaseError as exc:
        raise BrokerFileError(path, f"cannot be opened ({exc})") from None
    try:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        meta = _check_meta(conn, path, may_upgrade=verify)
        if verify:
            small = os.path.getsize(path) < VERIFY_ALWAYS_BELOW
            if meta.get("clean") != "1" or small:
                problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)").fetchall()]
                if problems != ["ok"]:
                    raise BrokerFileError(path, "is damaged: " + "; ".join(problems)[:300])
            mark_clean(conn, False)
    except sqlite3.DatabaseError as exc:
        conn.close()
        if is_busy(exc):
            raise ConfigurationError(
                f"broker file {path!r} stayed locked by another process for {busy_timeout} s",
                field="path",
            ) from None
        raise BrokerFileError(path, f"is damaged ({exc})") from None
    except BaseException:
        conn.close()
        raise
    return conn


class _StopAt(tenacity.stop.stop_base):
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return time.monotonic() + retry_state.upcoming_sleep >= self.deadline


def write_transaction(
    conn: sqlite3.Connection,
    work: Callable[[sqlite3.Connection], T],
    *,
    timeout: float,
    path: str,
    on_busy: Callable[[str], Exception],
    immediate: bool = True,
) -> T:
    """Run ``work`` in one transaction, retrying while the file is busy, up to ``timeout``.

    SQLite's own busy handler waits inside each attempt (bounded by the time
    left); tenacity retries what still comes back busy until the deadline, then
    ``on_busy`` builds the caller's error. A damaged file becomes a
    :class:`BrokerFileError`.
    """
    deadline = time.monotonic() + max(timeout, 0.0)
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    def attempt() -> T:
        # SQLite's busy handler waits at most the time left (re-set only when it matters).
        left_ms = min(max(int((deadline - time.monotonic()) * 1000), 1), 5000)
        if abs(_busy_ms.get(id(conn), -1000) - left_ms) >= 100:
            conn.execute(f"PRAGMA busy_timeout={left_ms}")
            _busy_ms[id(conn)] = left_ms
        conn.execute(begin)
        try:
            result = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_busy),
        stop=_StopAt(deadline),
        wait=tenacity.wait_random_exponential(multiplier=0.002, max=0.05),
        reraise=True,
    )
    try:
        return retrying(attempt)
    except sqlite3.DatabaseError as exc:
        if is_busy(exc):
            raise on_busy(
                f"broker file {path!r} stayed locked by other writers for {timeout} s"
            ) from None
        if _is_damage(exc):
            raise BrokerFileError(path, f"is damaged ({exc})") from None
        raise
