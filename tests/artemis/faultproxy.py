"""A TCP proxy between a client and the broker that cuts the connection at a chosen moment.

``cut_after(pattern)``: the next time the client sends bytes containing ``pattern``, they
are forwarded to the broker, the broker's answers are swallowed for ``settle`` seconds (it
processes what it got: stores the message, commits the transaction), then both sockets are
closed. The client sees its connection drop with the outcome unknown: the in-doubt case.
``cut_before(pattern)`` closes both sockets instead of forwarding those bytes: the broker
never sees them. Each arm fires once; later connections pass through untouched, so the
client's resend reaches the broker.

``cut_after(pattern, settle=None)`` swallows the answers until ``cut()``: a test waits until
the broker holds what it was sent (read through another connection), then cuts.
``route_to(host, port)`` sends later connections elsewhere (a load balancer in front of a
cluster that picks another node for the client's reconnection).

Patterns: ``DISCHARGE`` is in a transaction's commit/abort message (proton describes the
``discharge`` list by its symbol); a marker in a message body finds a transfer.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from types import TracebackType
from typing import Self

__all__ = ["DECLARE", "DISCHARGE", "FaultProxy"]

# proton's transaction control messages: a described list whose descriptor is this symbol.
DECLARE = b"amqp:declare:list"
DISCHARGE = b"amqp:discharge:list"


class FaultProxy:
    """Listens on 127.0.0.1:``port``; forwards to ``target_host``:``target_port``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._arm: tuple[str, bytes, float | None] | None = None
        self.fired = threading.Event()
        self.connections = 0
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    def cut_after(self, pattern: bytes, *, settle: float | None = 0.3) -> None:
        """Forward the client's bytes holding ``pattern``, swallow the answers, then cut
        (after ``settle`` seconds, or at ``cut()`` when None)."""
        with self._lock:
            self._arm = ("after", pattern, settle)
            self.fired.clear()

    def cut_before(self, pattern: bytes) -> None:
        """Cut the connection instead of forwarding the bytes holding ``pattern``."""
        with self._lock:
            self._arm = ("before", pattern, 0.0)
            self.fired.clear()

    def cut(self) -> None:
        """Close every proxied connection now (the listener stays: clients may reconnect)."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def route_to(self, host: str, port: int) -> None:
        """Connections accepted from now on go to ``host``:``port``."""
        with self._lock:
            self.target = (host, port)

    def _take(self, seen: bytes) -> tuple[str, float | None] | None:
        with self._lock:
            if self._arm is None or self._arm[1] not in seen:
                return None
            how, _, settle = self._arm
            self._arm = None
        return how, settle

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                target = self.target
            try:
                upstream = socket.create_connection(target, timeout=10)
            except OSError:
                client.close()
                continue
            self.connections += 1
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(
                target=self._pump, args=(client, upstream), name="fault-proxy-pump", daemon=True
            ).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        tail = b""  # the last bytes from the client: a pattern may straddle two reads
        mute_until: float | None = None
        muted = False
        try:
            while True:
                ready, _, _ = select.select([client, upstream], [], [], 0.05)
                if mute_until is not None and time.monotonic() >= mute_until:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is upstream:
                        if not muted:
                            client.sendall(data)
                        continue
                    seen = tail + data
                    tail = seen[-64:]
                    fault = None if muted else self._take(seen)
                    if fault is not None and fault[0] == "before":
                        self.fired.set()
                        return
                    upstream.sendall(data)
                    if fault is not None:
                        muted = True
                        if fault[1] is not None:
                            mute_until = time.monotonic() + fault[1]
                        self.fired.set()
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._closed = True
        # close() alone does not wake a thread blocked in accept() (Linux): shutdown() does,
        # and the accepting thread ends here rather than outliving the test in its worker.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
