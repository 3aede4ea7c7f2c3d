"""Looking at a database the user may not write: a consistent copy, opened instead.

A backup on a read-only volume, or a broker of another user, cannot be opened the
usual way (opening takes its lock and write-ahead log beside it). A command that
only reads (``broker stats``, ``peek``, ``backup``; ``ledger stats``, ``in-doubt``)
copies it first with SQLite's online backup, reading it read-only, and works on the
copy: nothing is written beside the original, and what is shown is one consistent
moment of it (a producer writing at the same time would not show).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import quote

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
    # mode=ro still needs the -shm beside a database in WAL mode (created if missing);
    # on a read-only directory or volume, immutable=1 reads the file alone.
    problem: sqlite3.Error | None = None
    for options in ("mode=ro", "mode=ro&immutable=1"):
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
