"""A Service Bus-compatible AMQP 1.0 endpoint over the local broker file.

The unmodified ``azure-servicebus`` client talks to it with a
``UseDevelopmentEmulator=true`` connection string. Every message is stored
through ``LocalBackend``, so ``local://`` producers and Service Bus producers
share one broker file and one duplicate-detection id space.

The proton reactor runs on one background thread; broker-file work that may
wait (the file was found locked, or other work is queued) goes to a storage
worker thread that hands results back, so a lock another process holds on the
file delays only the operations that need it. Other threads talk to the server
only through the thread-safe fault script and the stop flag.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import resource
import select
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any

from proton import ProtonException
from proton._io import IO
from proton.handlers import IOHandler
from proton.reactor import Container

from ..errors import ConfigurationError
from ._faults import FaultScript
from ._handler import EmulatorHandler, Tick
from ._listener import Listener
from ._worker import StorageWorker

__all__ = ["Emulator", "ServerLimits"]

_log = logging.getLogger("sendonce.emulator")


# Frames larger than this are refused by the transport (transfers span frames).
_MAX_FRAME_SIZE = 1024 * 1024
# The largest $management or $cbs request (a schedule of many messages).
_MAX_REQUEST_SIZE = 64 * 1024 * 1024
# Descriptors kept free for the broker file, the worker's pipe and the process itself.
_RESERVED_FILES = 32
# Service Bus: 5,000 AMQP connections per namespace (quotas page).
_SERVICE_BUS_CONNECTIONS = 5000


@dataclass(frozen=True)
class ServerLimits:
    """What one emulator allows its clients (seconds, bytes, connections)."""

    handshake_timeout: float
    idle_timeout: float
    max_connections: int
    max_frame_size: int
    max_request_size: int


def _default_max_connections() -> int:
    """As many as the process's descriptor limit leaves room for (Service Bus's at most)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _SERVICE_BUS_CONNECTIONS
    return max(1, min(_SERVICE_BUS_CONNECTIONS, soft - _RESERVED_FILES))


class Emulator:
    """Serve a local broker file over AMQP for the ``azure-servicebus`` client.

    ``with Emulator(path) as emu:`` starts the server on a background thread and
    stops it on exit; ``emu.connection_string`` is what the client needs. Only
    loopback addresses may be bound: the emulator accepts any key.

    ``emu.faults`` scripts failures for tests (see :class:`Fault`).

    A client must complete its AMQP open within ``handshake_timeout`` seconds (as
    ActiveMQ requires by default); a connection silent for ``idle_timeout``
    seconds is closed (the idle timeout the emulator advertises in its open);
    beyond ``max_connections`` (by default what the descriptor limit leaves room
    for) a client is refused with ``amqp:resource-limit-exceeded``.

    Message and session locks last each queue's or subscription's own lock
    duration (``EntityProfile.lock_duration``, ``SubscriptionProfile.lock_duration``),
    as on Service Bus; ``lock_duration`` overrides them all (for tests that want
    every lock short).
    """

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        lock_duration: timedelta | None = None,
        poll_interval: float = 0.05,
        handshake_timeout: float = 30.0,
        idle_timeout: float = 240.0,
        max_connections: int | None = None,
    ) -> None:
        if not _is_loopback(host):
            raise ConfigurationError(
                f"host {host!r} is not an IPv4 loopback address: the emulator accepts any key, "
                "so it only listens on 127.0.0.1 (or another 127.x address, or localhost)",
                field="host",
            )
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigurationError(f"port must be an int in 0..65535, got {port!r}", field="port")
        for name, value in (
            ("poll_interval", poll_interval),
            ("handshake_timeout", handshake_timeout),
            ("idle_timeout", idle_timeout),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds, got {value!r}", field=name
                )
        if lock_duration is not None and (
            not isinstance(lock_duration, timedelta) or lock_duration <= timedelta(0)
        ):
            raise ConfigurationError(
                "lock_duration must be a positive timedelta, or None for each queue's and "
                "subscription's own",
                field="lock_duration",
            )
        if max_connections is None:
            max_connections = _default_max_connections()
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise ConfigurationError(
                f"max_connections must be an int, got {max_connections!r}", field="max_connections"
            )
        if max_connections < 1:
            raise ConfigurationError("max_connections must be at least 1", field="max_connections")
        self.db_path = os.fspath(db_path)
        self.host = "127.0.0.1" if host == "localhost" else host
        self._requested_port = port
        self._port: int | None = None
        self.lock_duration = lock_duration
        self.poll_interval = poll_interval
        self.limits = ServerLimits(
            handshake_timeout=float(handshake_timeout),
            idle_timeout=float(idle_timeout),
            max_connections=max_connections,
            max_frame_size=_MAX_FRAME_SIZE,
            max_request_size=_MAX_REQUEST_SIZE,
        )
        self._worker: StorageWorker | None = None
        self._handler: EmulatorHandler | None = None
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

    def _open_store(self, busy_timeout: float) -> Any:
        """A store whose writes fail fast when the file is locked (and are retried)."""
        from ..backends.local import LocalBackend

        # Opening waits for a locked file as long as any handle would; the handle
        # used then shares the connection with a short busy timeout.
        with LocalBackend(self.db_path):
            return LocalBackend(self.db_path, busy_timeout=busy_timeout)

    @property
    def held_locks(self) -> int:
        """Peek-locks the server keeps bookkeeping for: a test's leak detector.

        Entries go when the message is settled, its lock expires, or its link or
        connection closes.
        """
        handler = self._handler
        if handler is None:
            return 0
        held = {id(v) for v in list(handler.tokens.values())}
        held.update(id(v) for v in list(handler.locked.values()))
        return len(held)

    @property
    def storage_backlog(self) -> int:
        """Broker-file operations queued for the storage worker (0 when idle)."""
        return self._worker.backlog if self._worker is not None else 0

    def _run(self) -> None:
        worker = StorageWorker(self._open_store)
        try:
            worker.start(name=f"sendonce-emulator-storage-{self.db_path}")
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            return
        self._worker = worker
        listener: Listener | None = None
        try:
            handler = EmulatorHandler(self, worker)
            self._handler = handler
            container = Container()
            # Every event goes to the handler itself, not through a parent that holds it
            # (one dispatch less per event); the socket I/O handler is installed before
            # any selectable exists, since each registers with its selector.
            container.handler = handler
            handler.io = container.global_handler = DirectIO()
            listener = Listener(container, self.host, self._requested_port)
            self._port = listener.port
            handler.acceptor = listener
            container.selectable(_Completions(worker))  # type: ignore[arg-type]
            container.timeout = self.poll_interval
            container.start()
            container.schedule(self.poll_interval, Tick(handler))
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            if listener is not None:
                listener.socket.close()
            worker.stop()
            return
        self._ready.set()
        try:
            while container.process():
                pass
        except Exception:  # pragma: no cover - a bug; keep the traceback in the log
            _log.exception("emulator reactor failed")
        finally:
            handler.close_all()
            listener.socket.close()
            worker.stop()


class DirectIO(IOHandler):
    """Proton's socket I/O, telling its selector of a socket's new state directly.

    Proton's handler announces every change of what a socket waits for (read,
    write, a deadline) as an event of its own, dispatched to every handler and
    back to itself, about three per transfer; here the selector is updated at
    once. A socket that has finished still gets its final event (it is closed
    on it). Installed as the global handler, it is also spared proton's
    override layer around the default one, which this server does not use.
    """

    def __init__(self) -> None:
        super().__init__()
        self._selector = _Selector()

    def update(self, transport: Any, selectable: Any, now: float) -> None:  # type: ignore[override]
        try:
            selectable.reading = transport.capacity() > 0
        except ProtonException:
            if transport.closed:
                selectable.terminate()
                selectable._transport = None
                transport._selectable = None
        try:
            selectable.writing = transport.pending() > 0
        except ProtonException:
            if transport.closed:
                selectable.terminate()
                selectable._transport = None
                transport._selectable = None
        selectable.deadline = transport.tick(now)
        if selectable.is_terminal:
            selectable.update()  # its final event closes it
        else:
            self._selector.update(selectable)


class _Selector(IO.Selector):
    """Proton's selector, keeping its earliest deadline as each socket changes.

    Proton's rescans every socket's deadline at each change of any one (several per
    transfer) and twice more after each select; a deadline only ever changes through
    :meth:`update`, so folding in the changed one is enough.
    """

    def update(self, selectable: Any) -> None:
        if selectable.reading:
            self._reading.add(selectable)
        else:
            self._reading.discard(selectable)
        if selectable.writing:
            self._writing.add(selectable)
        else:
            self._writing.discard(selectable)
        deadline = selectable.deadline
        if deadline and (self._deadline is None or deadline < self._deadline):
            self._deadline = deadline

    def select(self, timeout: float | None) -> tuple[list[Any], list[Any], list[Any]]:
        """Wait for sockets (and the earliest deadline); one pass over deadlines after."""
        reading, writing, deadline = self._reading, self._writing, self._deadline
        wait = timeout
        if deadline is not None:
            left = max(0.0, deadline - time.time())
            wait = left if timeout is None else min(timeout, left)
        readable: list[Any] = []
        writable: list[Any] = []
        if reading or writing or wait is None:
            try:
                readable, writable, failed = select.select(reading, writing, writing, wait)
            except InterruptedError:
                failed = []
            writable += failed
        elif wait > 0:
            time.sleep(wait)
        now = time.time()
        expired = []
        earliest = None
        for selectable in self._selectables:
            at = selectable.deadline
            if at:
                if now > at:
                    expired.append(selectable)
                if earliest is None or at < earliest:
                    earliest = at
        self._deadline = earliest
        return readable, writable, expired


class _Completions:
    """The storage worker's pipe as a reactor selectable: finished work runs on this thread."""

    def __init__(self, worker: StorageWorker) -> None:
        self.worker = worker
        self._transport = None  # proton's I/O handler looks for one on every selectable

    def fileno(self) -> int:
        return self.worker.fileno()

    def on_selectable_init(self, event: Any) -> None:
        selectable = event.context
        selectable.reading = True
        selectable.update()

    def on_selectable_readable(self, event: Any) -> None:
        self.worker.run_completions()


def _is_loopback(host: str) -> bool:
    """An IPv4 loopback address (proton's listener is IPv4 only)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 4 and address.is_loopback
