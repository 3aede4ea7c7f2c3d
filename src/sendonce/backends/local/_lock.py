"""The opener lock: tells a process whether it is the first to open a broker file.

Artemis forgets a non-persisted id cache when the broker restarts. The local
broker has no server process, so "restart" means: the file is opened while no
other process (or backend) holds it open. Each open backend holds a shared
``flock`` on a side file; the first opener gets an exclusive lock instead, does
its start-up work (reset non-persistent caches, verify the file) and only then
downgrades, so later openers wait until the file is ready.
"""

from __future__ import annotations

import fcntl
import os

__all__ = ["OpenerLock"]


class OpenerLock:
    """A shared/exclusive ``flock`` on ``<broker file>.lock``, one per open backend."""

    def __init__(self, path: str) -> None:
        self.path = path + ".lock"
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.first = False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.first = True
        except BlockingIOError:
            # Someone holds the file open (or is starting it): wait until it is ready.
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        except BaseException:
            self.close()
            raise

    def downgrade(self) -> None:
        """Let other openers in once start-up work is done."""
        if self._fd is not None and self.first:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def last_out(self) -> bool:
        """True if no other backend holds the file open (this one may mark it closed)."""
        if self._fd is None:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        """Release the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
