"""The listening socket: a real backlog, and accept() failures that never stop the server.

Proton's acceptor listens with a backlog of 10 (a burst of connects waits
seconds for SYN retries) and lets an ``accept()`` error escape the reactor: out
of file descriptors (EMFILE), the whole emulator died. Here a full descriptor
table pauses accepting for a moment (clients wait in the backlog until
descriptors are free again) and every other accept error is logged and skipped.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

from proton import Handler
from proton._reactor import Acceptor

__all__ = ["BACKLOG", "Listener"]

_log = logging.getLogger("sendonce.emulator")

# Capped by the kernel's net.core.somaxconn.
BACKLOG = 1024
# How long accepting pauses when the process is out of descriptors.
_OUT_OF_FILES_PAUSE = 0.1
_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Listener(Acceptor):
    """An acceptor that survives accept() failures."""

    def __init__(self, container: Any, host: str, port: int, backlog: int = BACKLOG) -> None:
        super().__init__(container, host, port, None)
        self.socket.listen(backlog)
        self._container = container
        self._paused = False
        self.refused = 0  # accept() failures survived (for tests and diagnostics)

    @property
    def socket(self) -> socket.socket:
        sock = self._selectable._delegate
        assert isinstance(sock, socket.socket)
        return sock

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    def on_selectable_readable(self, event: Any) -> None:
        if self._paused:
            return
        try:
            super().on_selectable_readable(event)
        except OSError as exc:
            self.refused += 1
            if exc.errno in _OUT_OF_FILES:
                _log.warning(
                    "out of file descriptors (%s): not accepting for %g s",
                    exc.strerror,
                    _OUT_OF_FILES_PAUSE,
                )
                self._pause()
            elif exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                _log.warning("accept() failed: %s", exc)

    def _pause(self) -> None:
        self._paused = True
        selectable = self._selectable
        selectable.reading = False
        selectable.update()
        self._container.schedule(_OUT_OF_FILES_PAUSE, _Resume(self))

    def resume(self) -> None:
        if not self._paused or self._selectable.is_terminal:
            return
        self._paused = False
        self._selectable.reading = True
        self._selectable.update()


class _Resume(Handler):
    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def on_timer_task(self, event: Any) -> None:
        self.listener.resume()
