"""A Service Bus-compatible AMQP 1.0 endpoint over the local broker file.

The unmodified ``azure-servicebus`` client talks to it with a
``UseDevelopmentEmulator=true`` connection string. Every message is stored
through ``LocalBackend``, so ``local://`` producers and Service Bus producers
share one broker file and one duplicate-detection id space.

The proton reactor runs on one background thread that owns its own
``LocalBackend`` (SQLite connections are per thread). Other threads talk to it
only through the thread-safe fault script and the stop flag.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
from datetime import timedelta
from types import TracebackType
from typing import Any

from proton.reactor import Container

from ..errors import ConfigurationError
from ._faults import FaultScript
from ._handler import EmulatorHandler, Tick

__all__ = ["Emulator"]

_log = logging.getLogger("sendonce.emulator")


class Emulator:
    """Serve a local broker file over AMQP for the ``azure-servicebus`` client.

    ``with Emulator(path) as emu:`` starts the server on a background thread and
    stops it on exit; ``emu.connection_string`` is what the client needs. Only
    loopback addresses may be bound: the emulator accepts any key.

    ``emu.faults`` scripts failures for tests (see :class:`Fault`).
    """

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        lock_duration: timedelta = timedelta(seconds=60),
        poll_interval: float = 0.05,
    ) -> None:
        if not _is_loopback(host):
            raise ConfigurationError(
                f"host {host!r} is not an IPv4 loopback address: the emulator accepts any key, "
                "so it only listens on 127.0.0.1 (or another 127.x address, or localhost)",
                field="host",
            )
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigurationError(f"port must be an int in 0..65535, got {port!r}", field="port")
        if poll_interval <= 0:
            raise ConfigurationError("poll_interval must be positive", field="poll_interval")
        self.db_path = os.fspath(db_path)
        self.host = "127.0.0.1" if host == "localhost" else host
        self._requested_port = port
        self._port: int | None = None
        self.lock_duration = lock_duration
        self.poll_interval = poll_interval
        self.faults = FaultScript()
        self._transfers: dict[str, int] = {}
        self._open_connections = 0
        self._connections_accepted = 0
        self._stats_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None

    # -- public surface -------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port being served (known once started)."""
        if self._port is None:
            raise RuntimeError("the emulator is not started")
        return self._port

    @property
    def connection_string(self) -> str:
        """A connection string for the real client (any key is accepted)."""
        return (
            f"Endpoint=sb://{self.host}:{self.port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )

    def transfers(self, entity: str | None = None) -> int:
        """How many send transfers and schedule requests reached ``entity`` (or any)."""
        with self._stats_lock:
            if entity is None:
                return sum(self._transfers.values())
            return self._transfers.get(entity, 0)

    @property
    def open_connections(self) -> int:
        """Client connections open right now: a test's leak detector (0 once all closed)."""
        with self._stats_lock:
            return self._open_connections

    @property
    def connections_accepted(self) -> int:
        """Client connections accepted since start (how many times clients connected)."""
        with self._stats_lock:
            return self._connections_accepted

    def start(self) -> Emulator:
        """Start serving on a background thread; returns once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("the emulator is already started")
        self._thread = threading.Thread(
            target=self._run, name=f"sendonce-emulator-{self.db_path}", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and close every connection. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the server thread is serving (false before start and after stop)."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self.host}:{self._port}" if self._port else "not started"
        return f"Emulator({self.db_path!r}, {where})"

    # -- reactor thread -------------------------------------------------------------------

    def _connection_change(self, change: int) -> None:
        with self._stats_lock:
            self._open_connections += change
            if change > 0:
                self._connections_accepted += change

    def _count(self, entity: str) -> None:
        with self._stats_lock:
            self._transfers[entity] = self._transfers.get(entity, 0) + 1

    def _open_store(self) -> Any:
        from ..backends.local import LocalBackend

        return LocalBackend(self.db_path)

    def _run(self) -> None:
        store: Any = None
        try:
            store = self._open_store()
            handler = EmulatorHandler(self, store)
            container = Container(handler)
            acceptor = container.acceptor(self.host, str(self._requested_port))
            self._port = int(acceptor._selectable.getsockname()[1])
            handler.acceptor = acceptor
            container.timeout = self.poll_interval
            container.start()
            container.schedule(self.poll_interval, Tick(handler))
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            if store is not None:
                store.close()
            return
        self._ready.set()
        try:
            while container.process():
                pass
        except Exception:  # pragma: no cover - a bug; keep the traceback in the log
            _log.exception("emulator reactor failed")
        finally:
            handler.close_all()
            listener = getattr(acceptor._selectable, "_delegate", None)
            if isinstance(listener, socket.socket):
                listener.close()
            store.close()


def _is_loopback(host: str) -> bool:
    """An IPv4 loopback address (proton's listener is IPv4 only)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 4 and address.is_loopback
