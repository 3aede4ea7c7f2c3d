"""Looking at a database the user may not write: a consistent copy, opened instead.

A backup on a read-only volume, or a broker of another user, cannot be opened the
usual way (opening takes its lock and write-ahead log beside it). A broker command
that only reads (``broker stats``, ``peek``, ``backup``) copies it first with SQLite's
online backup, reading it read-only (with the options that create no ``-wal`` or
``-shm`` beside it), and works on the copy: nothing is written beside the original,
and what is shown is one consistent moment of it (a producer writing at the same
time would not show). The ``ledger`` commands read a ledger in place instead, through
a read-only store.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import quote

from .._sqlite_share import read_only_options
from ._words import InputError

__all__ = ["snapshot"]


@contextmanager
def snapshot(path: str, what: str) -> Iterator[str]:
    """The path of a consistent copy of the database at ``path``, removed afterwards."""
    path = os.path.abspath(path)
    with tempfile.TemporaryDirectory(prefix="sendonce-snapshot-") as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        _copy(path, copy, what)
        yield copy


def _copy(path: str, copy: str, what: str) -> None:
    uri = "file:" + quote(path)
    # mode=ro would create a missing -wal and -shm beside the file (and leave them there):
    # the options that read it writing nothing beside it (see read_only_options).
    choices = read_only_options(path)
    if not choices:
        raise InputError(
            f"{what} {path!r} cannot be read without writing beside it: its write-ahead log "
            "holds pages and its index (-shm) is missing. Open it once where it may be "
            "written, or copy the files somewhere writable"
        )
    problem: sqlite3.Error | None = None
    for options in choices:
        try:
            source = sqlite3.connect(f"{uri}?{options}", uri=True)
            try:
                target = sqlite3.connect(copy)
                try:
                    source.backup(target)
                finally:
                    target.close()
            finally:
                source.close()
            return
        except sqlite3.Error as exc:
            problem = exc
            for leftover in (copy, copy + "-journal", copy + "-wal", copy + "-shm"):
                with suppress(FileNotFoundError):
                    os.unlink(leftover)
    raise InputError(
        f"{what} {path!r} cannot be read, even read-only ({problem}): check that it is a "
        "sendonce file and that you may read it"
    )
