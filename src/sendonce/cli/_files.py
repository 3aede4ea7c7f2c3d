"""File and permission problems in the CLI's words: which file, why, and what to do.

A broker or ledger file is one SQLite database plus its companions beside it (the
``-wal`` and ``-shm`` of write-ahead logging, and sendonce's ``.lock``). Opening it
writes to all of them, even for a command that only reads, so a file the user may
not write (a read-only copy, a directory of another user, a ``.lock`` created by
someone else) would otherwise surface as a Python ``PermissionError`` or, worse, as
"damaged" with advice to move a healthy file aside. These checks run before the
file is opened and say what is wrong instead; any other ``OSError`` becomes a CLI
error naming its file.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager

from ._words import InputError

__all__ = ["check_writable", "os_errors", "writable_problem"]

_COMPANIONS = ("-wal", "-shm", ".lock")


def check_writable(path: str, what: str, *, reading_only: bool = False) -> None:
    """Refuse, before opening, a database the user cannot open for writing.

    ``what`` names the file for the user (``broker file``, ``ledger file``);
    ``reading_only`` says the command itself only reads, so the message explains why
    write access is still needed.
    """
    problem = writable_problem(path, what, reading_only=reading_only)
    if problem is not None:
        raise InputError(problem)


def writable_problem(path: str, what: str, *, reading_only: bool = False) -> str | None:
    """Why the database at ``path`` cannot be opened for writing, or ``None``."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    if os.path.exists(path) and not os.access(path, os.R_OK):
        return (
            f"{what} {path!r} cannot be read: permission denied. Ask its owner for read "
            "and write access"
        )
    if _read_only_mount(directory):
        return (
            f"{what} {path!r} is on a read-only file system, and opening it writes beside "
            "it (its lock and write-ahead log). Copy it to a writable place and open the "
            "copy; the file itself is not damaged"
        )
    blocked = [p for p in [path, *(path + c for c in _COMPANIONS)] if _not_writable(p)]
    if os.path.exists(directory) and not os.access(directory, os.W_OK | os.X_OK):
        missing = [p for p in (path + c for c in _COMPANIONS) if not os.path.exists(p)]
        if missing or not os.path.exists(path):
            blocked.append(directory)
    if not blocked:
        return None
    why = (
        "this command only reads, but opening the file takes its lock and write-ahead log, "
        "which are written beside it"
        if reading_only
        else "the command writes to it"
    )
    shown = ", ".join(repr(p) for p in blocked)
    return (
        f"{what} {path!r} cannot be opened: no write permission on {shown} ({why}). Give "
        "your user write access to them (chmod / chown), or copy the file into a directory "
        "you may write and open the copy; the file itself is not damaged"
    )


def _read_only_mount(directory: str) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _not_writable(path: str) -> bool:
    return os.path.exists(path) and not os.access(path, os.W_OK)


_ADVICE = {
    errno.EACCES: "check the permissions of the file and its directory",
    errno.EPERM: "check the permissions of the file and its directory",
    errno.EROFS: "the file system is mounted read-only: copy the file to a writable place",
    errno.ENOSPC: "the disk is full: free some space",
    errno.ENOENT: "check the path",
    errno.EISDIR: "give a file, not a directory",
}


@contextmanager
def os_errors(what: str) -> Iterator[None]:
    """Any ``OSError`` inside as a CLI error (exit 2) naming the file and what to do."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or what
        advice = _ADVICE.get(exc.errno or 0, "check the file and its directory")
        raise InputError(f"{what}: {where}: {exc.strerror or exc}; {advice}") from None
