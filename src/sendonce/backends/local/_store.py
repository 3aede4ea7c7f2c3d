"""The broker file: its errors, creating, opening and verifying it, and its transactions.

One SQLite file in WAL mode holds everything; many processes may write at once.
How the file is shared safely (one connection per file per process, fork and
interruption safety, busy retries) lives in :mod:`sendonce._sqlite_share`; this
module adds what makes the file a broker: the format check, start-up
verification, the clean-close marker and the errors users see; :class:`Store` is
how the rest of the broker runs its transactions on the file.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal, TypeVar

from ..._names import ByName
from ..._sqlite_share import FileErrors, SharedHandle, creator, is_busy, open_shared
from ...errors import AttemptNotSentError, ConfigurationError, PermanentSendError
from ._schema import FORMAT, SCHEMA, SCHEMA_VERSION, UpgradeRefused, upgrade

if TYPE_CHECKING:
    from ..._entity import EntityProfile

__all__ = [
    "ERRORS",
    "US",
    "BrokerFileError",
    "BrokerStorageError",
    "Clock",
    "Durability",
    "Store",
    "from_us",
    "mark_clean",
    "open_broker",
    "positive_seconds",
    "to_us",
]

T = TypeVar("T")
Durability = Literal["normal", "full"]
Clock = Callable[[], datetime]
US = timedelta(microseconds=1)

# Files below this size are fully checked on every restart, cleanly closed or not.
VERIFY_ALWAYS_BELOW = 64 * 1024 * 1024
# How long the first opener waits for the write lock to record the restart, and a sender
# opening on a missing entity to create it (seconds): neither is worth waiting the whole
# busy timeout behind another process's write.
RESTART_LOCK_WAIT = 0.5


class BrokerFileError(ConfigurationError):
    """The broker file is damaged, not a sendonce broker, or was moved away while open.

    Opening it anyway could silently forget duplicate-detection history, so the
    broker refuses it. The message names the path and advice that fits the cause:
    a file that is not a broker is left alone (check the path); a damaged one is
    restored from a backup (``sendonce broker backup``).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"broker file {path!r} {reason}{_advice(reason)}", field="path")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[type[BrokerFileError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


def _advice(reason: str) -> str:
    if "not a SQLite database" in reason or "not a sendonce broker" in reason or "empty" in reason:
        return (
            "; sendonce leaves it untouched: check the path (a broker file is created by "
            "`sendonce broker create` or the first LocalBackend that opens a missing path)"
        )
    if "damaged" in reason or "truncated" in reason:
        return (
            "; refusing to open it, because duplicate-detection history could be lost. "
            "Restore it from a backup (`sendonce broker backup` makes one safely), or move it "
            "aside with its -wal and -shm files to start an empty broker"
        )
    return ""


class BrokerStorageError(PermanentSendError):
    """The disk refused a write to the broker file (full, or over a file size limit).

    The transaction was rolled back: nothing of that call was stored, and every
    message acknowledged before it is intact. Free space and send again.
    """

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"broker file {path!r}: the disk refused the write ({detail}); this call was rolled "
            "back and nothing of it was stored. Everything acknowledged before is intact: free "
            "space and send again",
            condition="amqp:resource-limit-exceeded",
        )
        self.path = path
        self.detail = detail

    def __reduce__(self) -> tuple[type[BrokerStorageError], tuple[str, str]]:
        return (type(self), (self.path, self.detail))


ERRORS = FileErrors(damaged=BrokerFileError, storage=BrokerStorageError)


def to_us(moment: datetime) -> int:
    """Microseconds since the epoch of an aware datetime: how times are stored."""
    return (moment - _EPOCH) // _MICROSECOND


def from_us(value: int) -> datetime:
    return _EPOCH + value * _MICROSECOND


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - _EPOCH


_create = creator(SCHEMA)  # an empty broker, built aside and linked into place


def _check_size(conn: sqlite3.Connection, path: str) -> None:
    """A file shorter than its header says is truncated (checked when no WAL holds pages)."""
    wal = path + "-wal"
    if os.path.exists(wal) and os.path.getsize(wal) > 0:
        return  # pages may legitimately live in the WAL until the next checkpoint
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
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
        except UpgradeRefused as refused:
            conn.execute("ROLLBACK")
            raise BrokerFileError(path, str(refused)) from None
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


def configure(durability: Durability) -> Callable[[sqlite3.Connection], None]:
    """The pragmas of every broker connection."""

    def apply(conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        conn.execute("PRAGMA cache_size=-65536")  # 64 MiB: keeps the id index hot
        # Checkpoint every ~16 MB of WAL rather than 4 MB: a page rewritten by many
        # commits is copied back once, and the sync of a checkpoint is paid less often.
        conn.execute("PRAGMA wal_autocheckpoint=4000")
        conn.execute("PRAGMA temp_store=MEMORY")

    return apply


def open_broker(
    path: str,
    *,
    durability: Durability,
    busy_timeout: float,
    create: bool,
    on_restart: Callable[[sqlite3.Connection], None],
    read_only: bool = False,
) -> SharedHandle:
    """A handle on this process's shared connection to the broker file at ``path``.

    The file is identified by its real path, device and inode: every backend,
    sender and url on it in this process shares one connection (see
    :mod:`sendonce._sqlite_share`). When no other process has it open (a broker
    "restart"), the file is verified (``PRAGMA quick_check`` after an unclean
    stop, or always when it is small), marked in use until the last close, and
    ``on_restart(conn)`` runs in a write transaction.
    """
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    if size == 0:
        raise BrokerFileError(os.path.realpath(path), "is empty: not a sendonce broker")

    def setup(conn: sqlite3.Connection, first: bool) -> None:
        _start(conn, os.path.realpath(path), first, on_restart, busy_timeout)

    def check(conn: sqlite3.Connection, first: bool) -> None:
        _check_meta(conn, os.path.realpath(path), may_upgrade=False)

    if read_only:  # nothing written, nothing beside the file: no start-up, no clean mark
        return open_shared(
            path,
            create=None,
            setup=check,
            configure=configure(durability),
            errors=ERRORS,
            busy_timeout=busy_timeout,
            read_only=True,
        )

    return open_shared(
        path,
        create=_create if create else None,
        setup=setup,
        configure=configure(durability),
        errors=ERRORS,
        on_last_close=lambda conn: mark_clean(conn, True),
        synchronous="FULL" if durability == "full" else "NORMAL",
        busy_timeout=busy_timeout,
    )


def _start(
    conn: sqlite3.Connection,
    path: str,
    first: bool,
    on_restart: Callable[[sqlite3.Connection], None],
    busy_timeout: float,
) -> None:
    meta = _check_meta(conn, path, may_upgrade=first)  # before anything could write
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    if str(mode).lower() != "wal":
        conn.execute("PRAGMA journal_mode=WAL")
    _check_size(conn, path)
    if not first:
        return
    small = os.path.getsize(path) < VERIFY_ALWAYS_BELOW
    if meta.get("clean") != "1" or small:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)").fetchall()]
        if problems != ["ok"]:
            raise BrokerFileError(path, "is damaged: " + "; ".join(problems)[:300])
    # The restart's write waits briefly: a process outside sendonce (the sqlite3 shell,
    # a backup tool) holding the write lock has the file open, so this is no restart.
    # Its clean-up then stays undone, on the safe side (volatile ids are kept, stale
    # session locks expire by themselves), and opening does not wait for that process.
    conn.execute(f"PRAGMA busy_timeout={int(min(busy_timeout, RESTART_LOCK_WAIT) * 1000)}")
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if not is_busy(exc):
            raise
        return
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
    try:
        mark_clean(conn, False)
        on_restart(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def positive_seconds(value: object, field: str) -> float:
    """A positive, finite number of seconds (url options arrive as str)."""
    try:
        seconds = float(value)  # type: ignore[arg-type]  # url options arrive as str
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{field} must be a number of seconds, got {value!r}", field=field
        ) from None
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{field} must be positive, got {value!r}", field=field)
    return seconds


def _locked_out(message: str) -> AttemptNotSentError:
    """Another process kept the write lock for the whole timeout: this call stored nothing.

    Every attempt was rolled back before it could commit, so the messages are not
    in doubt (an :class:`AttemptNotSentError`: retried, then reported as never sent).
    """
    # No condition of its own: the emulator maps it to Service Bus's server-busy.
    return AttemptNotSentError(
        f"{message}; nothing of this call was stored, so sending it again is safe"
    )


class Store:
    """One backend's way to the broker file: its transactions, its clock, its known profiles.

    Every concept of the broker (entities, sending, receiving, sessions,
    inspection) works through this, and this only through the file-safety layer.
    """

    def __init__(
        self,
        db: SharedHandle,
        clock: Clock,
        busy_timeout: float,
        label: str,
        *,
        read_only: bool = False,
    ) -> None:
        self.db = db
        self.read_only = read_only
        self.clock = clock
        self.busy_timeout = busy_timeout
        self.label = label
        # Each entity's profile as last read (its stored text, parsed): sends check and
        # encode their messages against it before taking the file's write lock.
        self.profiles: dict[str, tuple[str, EntityProfile]] = {}
        # Entities ``create_entity(..., exist_ok=True)`` found missing while another process
        # held the write lock: each is created by this backend's first send to it, in that
        # send's transaction (which waits as long as the send may), not by the open.
        self.pending: ByName[EntityProfile] = ByName()

    def now(self) -> int:
        """The broker clock's time, in stored microseconds."""
        moment = self.clock()
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise ConfigurationError("clock must return a timezone-aware datetime", field="clock")
        return to_us(moment)

    def write(
        self,
        work: Callable[[sqlite3.Connection], T],
        *,
        timeout: float | None = None,
        immediate: bool = True,
    ) -> T:
        """Run ``work`` in a write transaction (waiting up to ``timeout``, default the busy one)."""
        if self.db.closed:
            raise ConfigurationError(f"{self.label} is closed", field="backend")
        if immediate and self.read_only:
            raise ConfigurationError(
                f"broker file {self.db.real_path!r} is open read-only (read_only=True): this "
                "call would write to it. Open it without read_only to change it",
                field="read_only",
            )
        return self.db.transaction(
            work,
            timeout=self.busy_timeout if timeout is None else timeout,
            on_busy=_locked_out,
            immediate=immediate,
        )

    def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in a read transaction: it never waits for writers."""
        return self.write(work, immediate=False)
