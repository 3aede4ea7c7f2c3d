"""How caller threads hand work to an Artemis event loop: one wake-up per batch of commands.

proton's ``EventInjector`` writes a byte to its pipe and queues an event for every trigger,
and each event is dispatched through every handler of the container: a transfer handed
over while the loop is busy costs the loop one more pass. Here a caller queues its command
and writes to the pipe only when no wake-up is pending already; the loop, woken, runs every
command queued by then in one go (several transfers leave in one write to the socket).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Doorbell"]

logger = logging.getLogger("sendonce.artemis")


class Doorbell:
    """A pipe the loop's container selects on, and the commands waiting for the loop."""

    def __init__(self, after: Callable[[], None] | None = None) -> None:
        self._after = after  # run in the loop thread after each batch of commands
        self._lock = threading.Lock()
        self._commands: list[Callable[[], None]] = []
        self._rung = False  # a byte is in the pipe that the loop has not read yet
        self._last = False  # no command after the one queued now
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)  # the loop never waits on it but in select
        self._open = True
        self._transport = None  # what proton's IO handler asks of every selectable: none here

    # -- any thread ------------------------------------------------------------------------

    def ring(self, command: Callable[[], None]) -> bool:
        """Queue ``command`` for the loop thread; False once the loop has stopped."""
        with self._lock:
            if not self._open or self._last:
                return False
            self._commands.append(command)
            if not self._rung:
                self._rung = True
                # Under the lock: ``close`` cannot free the descriptor in between (a number
                # the system could hand to another file). One byte at most is pending.
                os.write(self._write_fd, b"!")
        return True

    def last_call(self) -> None:
        """Refuse further commands; the loop stops watching the pipe once it has run the
        queued ones."""
        with self._lock:
            if not self._open or self._last:
                return
            self._last = True
            if not self._rung:
                self._rung = True
                os.write(self._write_fd, b"!")

    def close(self) -> None:
        """Free the pipe (the loop thread has ended, or proton drops the selectable)."""
        with self._lock:
            if not self._open:
                return
            self._open = False
            for fd in (self._read_fd, self._write_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)

    # -- the loop thread (proton calls these on the selectable's events) --------------------

    def fileno(self) -> int:
        return self._read_fd

    def on_selectable_init(self, event: Any) -> None:
        selectable = event.context
        selectable.reading = True
        selectable.update()

    def on_selectable_readable(self, event: Any) -> None:
        with self._lock:
            if self._open:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._read_fd, 512)
            commands, self._commands = self._commands, []
            self._rung = False
            last = self._last
        for command in commands:
            try:
                command()
            except Exception:  # pragma: no cover - keep the loop alive for the others
                logger.exception("an Artemis loop command failed")
        if commands and self._after is not None:
            self._after()
        if last:
            selectable = event.context
            selectable.terminate()
            selectable.update()
