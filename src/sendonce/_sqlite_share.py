"""One SQLite connection per database file per process, shared by every handle on it.

SQLite in WAL mode is safe for many processes only while each process's POSIX
locks on the file stay where SQLite put them. They are lost in ordinary ways
(DESIGN.md §6, SQLite's "How To Corrupt An SQLite Database File"):

- closing *any* descriptor of the file drops every POSIX lock the process holds
  on it, so a second connection (or a stray ``open()``) in the same process that
  closes while the first is open makes other processes believe the file is
  unused: they checkpoint and delete the WAL under the open connection and
  acknowledged writes vanish;
- a forked child inherits SQLite's lock bookkeeping but none of the kernel
  locks, so its own new connection runs unlocked;
- opening the file under another name (a symlink, a hard link) splits the WAL
  and the opener lock, and a file deleted or renamed while open takes the
  writes with it.

So every handle of a file in a process shares one :class:`_SharedFile`, keyed by
the file's device and inode and reference-counted: the process holds exactly one
SQLite connection and one opener-lock descriptor per file and never closes
either while a handle is open. Around ``fork`` the connections are closed in the
parent and reopened after it, so a child inherits no SQLite state at all: it
opens its own connections (lazily, even through handles it inherited) with real
locks of its own. Every transaction begins and ends inside one block that rolls
back whatever an interruption (``KeyboardInterrupt``) left open, and checks that
the file on disk is still the one it wrote to.

Why one module of ~850 lines: the registry, the opener lock, the fork hooks, the
read-only opening and the transactions keep one invariant together (one
connection and one opener lock per file per process, taken in one lock order:
the registry's lock, then a file's mutex). Each part reads and changes the others'
state under those locks; split apart, the invariant would have no single place.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import tenacity

from .errors import ConfigurationError

__all__ = [
    "FileErrors",
    "SharedHandle",
    "Synchronous",
    "creator",
    "is_busy",
    "open_shared",
    "read_only_options",
]

T = TypeVar("T")
Synchronous = Literal["NORMAL", "FULL"]
Identity = tuple[int, int]

# How long a file may show two links right after it was created (``os.link`` of a
# fully built file into place, then the temporary name is removed).
_CREATION_LINK_GRACE = 2.0


def _sqlite_error_in(exc: BaseException, codes: tuple[int, ...], words: tuple[str, ...]) -> bool:
    """Whether ``exc`` is an SQLite error with one of ``codes`` (or, without a code, ``words``)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in codes
    text = str(exc).lower()
    return any(word in text for word in words)


def is_busy(exc: BaseException) -> bool:
    """A lock held by another connection: retrying later will help."""
    return isinstance(exc, sqlite3.OperationalError) and _sqlite_error_in(
        exc, (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED), ("locked", "busy")
    )


def _is_damage(exc: BaseException) -> bool:
    return not is_busy(exc) and _sqlite_error_in(
        exc,
        (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB),
        ("malformed", "not a database", "corrupt"),
    )


def _is_storage_failure(exc: BaseException) -> bool:
    """The disk (or a file size limit) refused a write: nothing of this transaction stays."""
    return isinstance(exc, sqlite3.OperationalError) and _sqlite_error_in(
        exc, (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR), ("disk is full", "disk i/o error")
    )


def creator(schema: str) -> Callable[[str], None]:
    """``create(path)`` for :func:`open_shared`: build a WAL file with ``schema`` aside, then
    link it into place, so no process ever sees a half-built file (and a file another
    process created first wins)."""

    def create(path: str) -> None:
        tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new"
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(f"BEGIN;{schema}COMMIT;")
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

    return create


@dataclass(frozen=True, slots=True)
class FileErrors:
    """How the owner of a file (the broker, the ledger) words failures of its file."""

    damaged: Callable[[str, str], Exception]
    """(path, reason): the file is unusable (not the expected file, damaged, gone)."""
    storage: Callable[[str, str], Exception]
    """(path, detail): a write was refused by the disk; nothing of it was kept."""
    kind: str = "broker"
    """What the file is to its owner: one file cannot be a broker and a ledger at once."""
    field: str = "path"
    """The argument that named the file, for a ConfigurationError."""


def _identity(path: str) -> tuple[Identity, int] | None:
    """(device, inode) and link count of ``path``, or None if it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
    return (st.st_dev, st.st_ino), st.st_nlink


def _not_writable(path: str, lock: str, exc: OSError) -> ConfigurationError:
    """Opening for writing needs the ``.lock`` beside the file: say which file, and what to do."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        where = (
            f"the file system of {path!r} is read-only"
            if exc.errno == errno.EROFS
            else f"this user may not write {lock!r} (or create it in its directory)"
        )
        return ConfigurationError(
            f"cannot open {path!r} for writing: {where}. To look at it without writing, "
            "open it read-only (read_only=True); to write, fix the permissions",
            field="path",
        )
    return ConfigurationError(
        f"cannot open {path!r}: {lock!r} cannot be used ({exc.strerror})", field="path"
    )


class _OpenerLock:
    """A shared/exclusive ``flock`` on ``<file>.lock``: one per file per process.

    The first process to open the file (no other process holds it) gets the lock
    exclusively, does its start-up work (verification, resetting caches that do
    not survive a "restart"), then downgrades to shared. A later opener waits
    (bounded) until start-up is done. The descriptor is never inherited usefully:
    a forked child closes its copy at once (closing a copy does not release the
    parent's lock, since ``flock`` locks belong to the open file description).
    """

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path + ".lock"
        self._fd: int | None = None
        self.created = False
        flags = os.O_RDWR | os.O_CLOEXEC
        while self._fd is None:  # created here, or opened as found (it may vanish between)
            try:
                self._fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                self.created = True
            except FileExistsError:
                try:
                    self._fd = os.open(self.path, flags)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise _not_writable(path, self.path, exc) from None
            except OSError as exc:
                raise _not_writable(path, self.path, exc) from None
        self.first = False
        try:
            self.first = self._acquire(timeout)
        except BaseException:
            self.close()
            raise

    def _acquire(self, timeout: float) -> bool:
        fd = self._fd
        assert fd is not None

        def attempt() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True  # nobody else has the file open: this is a (re)start
            except BlockingIOError:
                pass
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # open elsewhere and ready
            return False

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(BlockingIOError),
            stop=tenacity.stop_after_delay(timeout),
            wait=tenacity.wait_random_exponential(multiplier=0.005, max=0.1),
            reraise=True,
        )
        try:
            return retrying(attempt)
        except BlockingIOError:
            raise ConfigurationError(
                f"{self.path[:-5]!r} stayed locked by another process starting it up for "
                f"{timeout} s",
                field="path",
            ) from None

    def downgrade(self) -> None:
        if self._fd is not None and self.first:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def last_out(self) -> bool:
        """True if no other process holds the file open."""
        if self._fd is None:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def abandon(self) -> None:
        """Close after a failed first open, removing the side file if this open made it.

        Opening a file that turns out not to be a database must leave nothing behind.
        """
        if self.created and self.first:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self.close()

    def forget_inherited(self) -> None:
        """In a forked child: drop the copy of the parent's descriptor, keep its lock."""
        self.close()


Setup = Callable[[sqlite3.Connection, bool], None]
Configure = Callable[[sqlite3.Connection], None]


class _SharedFile:
    """The process's one connection and opener lock for one database file."""

    def __init__(
        self,
        real_path: str,
        identity: Identity,
        opener: _OpenerLock | None,
        setup: Setup,
        configure: Configure,
        errors: FileErrors,
        on_last_close: Callable[[sqlite3.Connection], None] | None,
        busy_timeout: float,
    ) -> None:
        self.real_path = real_path
        self.identity = identity
        self.opener = opener
        self.setup = setup
        self.configure = configure
        self.busy_timeout = busy_timeout
        self.errors = errors
        self.on_last_close = on_last_close
        self.mutex = threading.RLock()
        self.conn: sqlite3.Connection | None = None
        self.refs = 0
        self.pid = os.getpid()
        self.broken: str | None = None
        self.busy_ms = -1000
        self.synchronous: Synchronous | None = None
        self.wal_identity: Identity | None = None  # of the -wal, once it exists
        self.suspended = False  # closed around a fork, to be reopened in the parent
        self.fork_locked = False  # its mutex is held across a fork
        # Read-only: the SQLite URI options the file opened with (None: read-write).
        self.read_only: str | None = None

    def connect(self) -> sqlite3.Connection:
        target, uri = self.real_path, False
        if self.read_only is not None:
            target, uri = f"file:{urllib.parse.quote(self.real_path)}?{self.read_only}", True
        conn = sqlite3.connect(
            target,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            uri=uri,
        )
        try:
            self.configure(conn)
        except BaseException:
            conn.close()
            raise
        self.busy_ms = int(self.busy_timeout * 1000)
        self.synchronous = None
        self.wal_identity = None
        return conn

    def check_identity(self) -> None:
        """Refuse to go on once the path no longer names the file we write to."""
        try:
            found = _identity(self.real_path)
        except OSError as exc:
            found, why = None, exc.strerror or str(exc)
        else:
            why = "was deleted"
        if found is None or found[0] != self.identity:
            if found is not None:
                why = "was replaced by another file"
            self.broken = (
                f"{why} while open (moved, deleted or replaced under a running process); "
                "nothing more is written to it"
            )
            raise self.errors.damaged(self.real_path, self.broken)
        if self.read_only is None:  # a reader's writes cannot be lost with the WAL: it has none
            self._check_wal()

    def _check_wal(self) -> None:
        """Refuse to go on once the write-ahead log was deleted or replaced under us.

        SQLite deletes the ``-wal`` only when the last connection closes, so while
        ours is open it keeps one inode; a different one (or none) means someone
        removed it by hand, and our later commits would go where no one reads them.
        """
        try:
            found = _identity(self.real_path + "-wal")
        except OSError:
            found = None
        if self.wal_identity is None:
            self.wal_identity = found[0] if found is not None else None
            return
        if found is None or found[0] != self.wal_identity:
            self.broken = (
                "lost its -wal file (the write-ahead log) while open: it was deleted or "
                "replaced by hand; nothing more is written to it. Stop every process using it, "
                "then check it with `sendonce broker stats`"
            )
            raise self.errors.damaged(self.real_path, self.broken)

    def close_connection(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


# The registry: identity -> shared file. Lock order: _registry_lock, then a file's mutex.
_registry: dict[Identity, _SharedFile] = {}
_registry_lock = threading.RLock()
# Files whose connection could not be closed before a fork (a transaction stayed
# open too long in another thread): the child must not open them.
_unsafe_after_fork: dict[Identity, str] = {}
# Connections a child inherited in that state: never closed nor collected in the child.
_inherited_leftovers: list[sqlite3.Connection] = []
_FORK_WAIT = 10.0


def _before_fork() -> None:
    _registry_lock.acquire()
    for shared in list(_registry.values()):
        if not shared.mutex.acquire(timeout=_FORK_WAIT):
            continue
        conn = shared.conn
        if conn is not None and not conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                shared.close_connection()
                shared.suspended = True
        shared.fork_locked = True


def _after_fork_in_parent() -> None:
    for shared in list(_registry.values()):
        if shared.fork_locked:
            shared.fork_locked = False
            if shared.suspended:
                shared.suspended = False
                try:
                    shared.conn = shared.connect()
                    shared.check_identity()
                except Exception as exc:  # reported on the next use
                    shared.close_connection()
                    shared.broken = shared.broken or f"could not be reopened after fork ({exc})"
            shared.mutex.release()
    _registry_lock.release()


def _after_fork_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.RLock()
    inherited = list(_registry.values())
    _registry.clear()
    for shared in inherited:
        shared.mutex = threading.RLock()
        shared.fork_locked = False
        if shared.conn is not None:
            # Still open (a transaction was in progress elsewhere): closing it here
            # could checkpoint under the parent. Keep it untouched for good.
            _inherited_leftovers.append(shared.conn)
            shared.conn = None
            _unsafe_after_fork[shared.identity] = (
                "this process was forked while another thread of its parent was inside a "
                "transaction on it"
            )
        shared.suspended = False
        if shared.opener is not None:
            shared.opener.forget_inherited()
        shared.refs = 0


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


def _wait_single_link(path: str, errors: FileErrors) -> Identity:
    """The file's identity, once it has exactly one name (refusing hard-linked files)."""
    deadline = time.monotonic() + _CREATION_LINK_GRACE
    while True:
        try:
            found = _identity(path)
        except OSError as exc:
            raise errors.damaged(path, f"cannot be used ({exc.strerror})") from None
        if found is None:
            raise errors.damaged(path, "disappeared while it was being opened")
        identity, links = found
        if links == 1:
            return identity
        if time.monotonic() >= deadline:
            raise errors.damaged(
                path,
                f"has {links} hard links: SQLite keeps its write-ahead log beside the name a "
                "file is opened by, so two names for one broker split it and lose writes; "
                "keep one name (use a symbolic link for a second path)",
            )
        time.sleep(0.02)


def open_shared(
    path: str,
    *,
    create: Callable[[str], None] | None,
    setup: Setup,
    configure: Configure,
    errors: FileErrors,
    on_last_close: Callable[[sqlite3.Connection], None] | None = None,
    synchronous: Synchronous = "NORMAL",
    busy_timeout: float = 60.0,
    read_only: bool = False,
) -> SharedHandle:
    """A handle on the process's shared connection to the database file at ``path``.

    ``create(real_path)`` builds a missing file atomically (None: a missing file
    is an error). ``configure(conn)`` runs on every new connection (pragmas).
    ``setup(conn, first)`` runs once per process when its connection first opens;
    ``first`` is True when no other process had the file open (a restart).
    ``on_last_close(conn)`` runs when the last handle of the last process closes.

    ``read_only`` opens a file this user may not write (a read-only file, directory
    or file system; another user's ``.lock``) without writing anything beside it:
    no opener lock, a ``mode=ro`` connection (``immutable=1`` where the WAL index
    cannot be created and no write-ahead log holds pages), and write transactions
    refused. In a process that has the file open for writing, it shares that
    connection.
    """
    real = os.path.realpath(path)
    with _registry_lock:
        try:
            found = _identity(real)
        except OSError as exc:
            raise errors.damaged(real, f"cannot be used ({exc.strerror})") from None
        if found is not None:
            shared = _registry.get(found[0])
            if shared is not None and shared.broken is None:
                if shared.errors.kind != errors.kind:
                    raise ConfigurationError(
                        f"{real!r} is open in this process as a {shared.errors.kind}; it "
                        f"cannot also be used as a {errors.kind}: give each its own file",
                        field=errors.field,
                    )
                if shared.read_only is not None and not read_only:
                    raise ConfigurationError(
                        f"{real!r} is open read-only in this process: close those handles "
                        "before opening it for writing",
                        field="path",
                    )
                shared.refs += 1
                return SharedHandle(shared, synchronous)
            reason = _unsafe_after_fork.get(found[0])
            if reason is not None:
                raise ConfigurationError(
                    f"{real!r} cannot be opened here: {reason}. Open it in a process started "
                    "with multiprocessing's 'spawn' or 'forkserver' method, or fork before "
                    "opening it",
                    field="path",
                )
        elif create is None:
            raise ConfigurationError(
                f"there is no file {real!r} (and this open creates none)", field="path"
            )
        if read_only:
            shared = _open_read_only(real, setup, configure, errors, busy_timeout)
        else:
            shared = _open_new(real, create, setup, configure, errors, on_last_close, busy_timeout)
        _registry[shared.identity] = shared
        shared.refs = 1
        return SharedHandle(shared, synchronous)


def _open_new(
    real: str,
    create: Callable[[str], None] | None,
    setup: Setup,
    configure: Configure,
    errors: FileErrors,
    on_last_close: Callable[[sqlite3.Connection], None] | None,
    busy_timeout: float,
) -> _SharedFile:
    opener = _OpenerLock(real, busy_timeout)
    try:
        if _identity(real) is None:
            _create_missing(real, create, opener.first, errors)
        identity = _wait_single_link(real, errors)
        shared = _SharedFile(
            real, identity, opener, setup, configure, errors, on_last_close, busy_timeout
        )
        try:
            shared.conn = shared.connect()
            setup(shared.conn, opener.first)
            shared.check_identity()
        except sqlite3.DatabaseError as exc:
            shared.close_connection()
            raise _open_error(exc, real, errors, busy_timeout) from None
        except BaseException:
            shared.close_connection()
            raise
        opener.downgrade()
        return shared
    except BaseException:
        opener.abandon()
        raise


def _open_read_only(
    real: str, setup: Setup, configure: Configure, errors: FileErrors, busy_timeout: float
) -> _SharedFile:
    """Open ``real`` with a read-only connection, writing nothing beside it."""
    if not os.access(real, os.R_OK):
        raise ConfigurationError(
            f"cannot read {real!r}: this user may not read it (check its permissions)",
            field="path",
        )
    identity = _wait_single_link(real, errors)
    choices = read_only_options(real)
    if not choices:
        raise _unreadable_wal(real)
    failure: sqlite3.DatabaseError | None = None
    for options in choices:
        shared = _SharedFile(real, identity, None, setup, configure, errors, None, busy_timeout)
        shared.read_only = options
        try:
            shared.conn = shared.connect()
            setup(shared.conn, False)
            shared.check_identity()
            return shared
        except sqlite3.DatabaseError as exc:
            shared.close_connection()
            failure = exc
            if not _cannot_write(exc):
                break
        except BaseException:
            shared.close_connection()
            raise
    assert failure is not None
    if _cannot_write(failure):
        raise _unreadable_wal(real) from None
    raise _open_error(failure, real, errors, busy_timeout) from None


def _unreadable_wal(real: str) -> ConfigurationError:
    return ConfigurationError(
        f"cannot read {real!r} read-only: its write-ahead log {real + '-wal'!r} holds "
        "pages, and its index (-shm) is missing: reading it would create one beside it. "
        "Open it once where it may be written (that folds the log into the file), or copy "
        "the files somewhere writable",
        field="path",
    )


def read_only_options(real: str) -> list[str]:
    """The SQLite URI options that read the database at ``real`` writing nothing beside it.

    A ``mode=ro`` connection to a file in WAL mode creates the ``-wal`` and ``-shm`` it does
    not find (in a directory it may write), and, being read-only, never removes them: they
    stay beside the file, owned by the reader, and later block its writers. So ``mode=ro``
    only when both are there already (a writer has the file open: its index is current);
    otherwise no connection has the file open (the last one to close removes the ``-wal``),
    and ``immutable=1`` reads the file alone. A ``-wal`` holding pages without its ``-shm``
    (left by a crash) cannot be read without creating the index: no options (``[]``).
    """
    try:
        wal_size: int | None = os.path.getsize(real + "-wal")
    except OSError:
        wal_size = None
    if wal_size is not None and os.path.exists(real + "-shm"):
        return ["mode=ro"]
    if not wal_size:
        return ["mode=ro&immutable=1"]
    return []


def _cannot_write(exc: BaseException) -> bool:
    """SQLite could not write or create a file it needs: permissions, not damage."""
    return _sqlite_error_in(
        exc,
        (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM),
        ("readonly database", "unable to open"),
    )


def _open_error(
    exc: sqlite3.DatabaseError, real: str, errors: FileErrors, busy_timeout: float
) -> Exception:
    if is_busy(exc):
        return ConfigurationError(
            f"{real!r} stayed locked by another process for {busy_timeout} s", field="path"
        )
    if _cannot_write(exc):
        return ConfigurationError(
            f"cannot open {real!r} for writing: this user may not write it or its directory "
            f"{os.path.dirname(real)!r}, or its file system is read-only (SQLite: {exc}). To "
            "look at it without writing, "
            "open it read-only (read_only=True); to write, fix the permissions",
            field="path",
        )
    code = getattr(exc, "sqlite_errorcode", None)
    if (code is not None and code & 0xFF == sqlite3.SQLITE_NOTADB) or "not a database" in str(exc):
        return errors.damaged(real, "is not a SQLite database")
    return errors.damaged(real, f"is damaged ({exc})")


def _create_missing(
    real: str, create: Callable[[str], None] | None, first: bool, errors: FileErrors
) -> None:
    if create is None:
        raise ConfigurationError(
            f"there is no file {real!r} (and this open creates none)", field="path"
        )
    if not first:
        raise errors.damaged(
            real,
            "does not exist, yet another process still has it open (it was deleted or moved "
            "while in use); stop that process before starting a new file here",
        )
    leftovers = [s for s in ("-wal", "-shm") if os.path.exists(real + s)]
    if leftovers:
        raise errors.damaged(
            real,
            "is missing but its " + " and ".join(leftovers) + " file is still there: the file "
            "was deleted or moved without them, and a new file here would replay their old "
            "contents. Put the file back, or remove the leftover "
            + " and ".join(leftovers)
            + " to start an empty one",
        )
    create(real)


class SharedHandle:
    """One user of a shared database file (a backend, a ledger). Close it exactly once."""

    def __init__(self, shared: _SharedFile, synchronous: Synchronous) -> None:
        self._shared: _SharedFile | None = shared
        self._pid = os.getpid()
        self._synchronous = synchronous
        self.real_path = shared.real_path

    def __repr__(self) -> str:
        return f"SharedHandle({self.real_path!r})"

    @property
    def closed(self) -> bool:
        return self._shared is None

    def _current(self) -> _SharedFile:
        shared = self._shared
        if shared is None:
            raise ConfigurationError(f"{self.real_path!r} is closed", field="backend")
        if self._pid != os.getpid():
            shared = self._adopt_after_fork(shared)
        return shared

    def _adopt_after_fork(self, inherited: _SharedFile) -> _SharedFile:
        """A handle inherited by a forked child: bind it to this process's own connection."""
        with _registry_lock:
            if self._pid == os.getpid():
                assert self._shared is not None
                return self._shared
            handle = open_shared(
                self.real_path,
                create=None,
                setup=inherited.setup,
                configure=inherited.configure,
                errors=inherited.errors,
                on_last_close=inherited.on_last_close,
                synchronous=self._synchronous,
                busy_timeout=inherited.busy_timeout,
                read_only=inherited.read_only is not None,
            )
            shared = handle._shared
            assert shared is not None
            handle._shared = None  # its reference now belongs to this handle
            self._shared = shared
            self._pid = os.getpid()
            return shared

    def transaction(
        self,
        work: Callable[[sqlite3.Connection], T],
        *,
        timeout: float,
        on_busy: Callable[[str], Exception],
        immediate: bool = True,
    ) -> T:
        """Run ``work`` in one transaction, retrying while the file is busy, up to ``timeout``.

        SQLite's busy handler waits inside each attempt (bounded by the time left);
        tenacity retries what still comes back busy until the deadline, then
        ``on_busy(message)`` builds the caller's error.
        """
        shared = self._current()
        if immediate and shared.read_only is not None:
            raise ConfigurationError(
                f"{shared.real_path!r} is open read-only here: this call would write to it",
                field="read_only",
            )
        deadline = time.monotonic() + max(timeout, 0.0)
        begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"
        synchronous = self._synchronous

        def attempt() -> T:
            with shared.mutex:
                if shared.broken is not None:
                    raise shared.errors.damaged(shared.real_path, shared.broken)
                conn = shared.conn
                if conn is None:
                    conn = shared.conn = shared.connect()
                return _run(shared, conn, work, begin, deadline, synchronous)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_busy),
            stop=_StopAt(deadline),
            wait=tenacity.wait_random_exponential(multiplier=0.002, max=0.05),
            reraise=True,
        )
        try:
            return retrying(attempt)
        except sqlite3.DatabaseError as exc:
            path = shared.real_path
            if is_busy(exc):
                raise on_busy(f"{path!r} stayed locked by other writers for {timeout} s") from None
            if _is_damage(exc):
                raise shared.errors.damaged(path, f"is damaged ({exc})") from None
            if _is_storage_failure(exc):
                raise shared.errors.storage(path, str(exc)) from None
            raise

    def with_connection(self, use: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``use`` with the connection outside any transaction (backups, checks)."""
        shared = self._current()
        with shared.mutex:
            if shared.broken is not None:
                raise shared.errors.damaged(shared.real_path, shared.broken)
            conn = shared.conn
            if conn is None:
                conn = shared.conn = shared.connect()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            result = use(conn)
            shared.check_identity()
            return result

    def close(self) -> None:
        """Release this handle; the last one in the process closes the connection. Idempotent."""
        shared, self._shared = self._shared, None
        if shared is None or self._pid != os.getpid():
            return  # inherited across fork and never used here: nothing of ours to close
        with _registry_lock:
            shared.refs -= 1
            if shared.refs > 0:
                return
            if _registry.get(shared.identity) is shared:
                del _registry[shared.identity]
            with shared.mutex:
                conn = shared.conn
                try:
                    if (
                        conn is not None
                        and shared.broken is None
                        and shared.on_last_close is not None
                        and shared.opener is not None
                        and shared.opener.last_out()
                    ):
                        with contextlib.suppress(Exception):
                            _run(
                                shared,
                                conn,
                                shared.on_last_close,
                                "BEGIN IMMEDIATE",
                                time.monotonic() + 5.0,
                                self._synchronous,
                            )
                finally:
                    shared.close_connection()
                    if shared.opener is not None:
                        shared.opener.close()


def open_files() -> list[str]:
    """Real paths of the database files this process holds open (for diagnostics)."""
    with _registry_lock:
        return sorted(shared.real_path for shared in _registry.values())


class _StopAt(tenacity.stop.stop_base):
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return time.monotonic() + retry_state.upcoming_sleep >= self.deadline


def _run(
    shared: _SharedFile,
    conn: sqlite3.Connection,
    work: Callable[[sqlite3.Connection], T],
    begin: str,
    deadline: float,
    synchronous: Synchronous,
) -> T:
    """One transaction, begun and ended in one block that an interruption cannot split.

    A transaction left open by an interruption that landed between two statements
    (``KeyboardInterrupt`` right after ``BEGIN`` succeeded) is rolled back first,
    so it never locks other processes out or breaks the next call.
    """
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    left_ms = min(max(int((deadline - time.monotonic()) * 1000), 1), 5000)
    if abs(shared.busy_ms - left_ms) >= 100:
        conn.execute(f"PRAGMA busy_timeout={left_ms}")
        shared.busy_ms = left_ms
    if shared.synchronous != synchronous:
        conn.execute(f"PRAGMA synchronous={synchronous}")
        shared.synchronous = synchronous
    try:
        conn.execute(begin)
        result = work(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    shared.check_identity()
    return result
