"""What the handler's parts share: per-connection state, the storage worker, and safe closing."""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from proton import Condition, Endpoint, Handler, ProtonException

from ._conditions import SESSION_LOCK_LOST, condition
from ._nodes import Locked, Node
from ._worker import Outcome, StorageWorker

if TYPE_CHECKING:
    from ..backends.local import LocalSession
    from ._server import Emulator

__all__ = ["ConnState", "HandlerBase", "guarded"]

_log = logging.getLogger("sendonce.emulator")

_F = TypeVar("_F", bound=Callable[..., None])
T = TypeVar("T")


def guarded(method: _F) -> _F:
    """Log a handler failure and drop only the connection it came from.

    An exception escaping a proton handler would stop the whole reactor (and
    every other client's connection with it).
    """

    @functools.wraps(method)
    def wrapper(self: Any, event: Any) -> None:
        try:
            method(self, event)
        except Exception:
            _log.exception("emulator failed handling %s", getattr(event, "type", event))
            connection = getattr(event, "connection", None)
            if connection is not None:
                HandlerBase.hard_close(connection)

    return wrapper  # type: ignore[return-value]


@dataclass
class ConnState:
    """One client connection: replies waiting for credit, and when it must have opened."""

    connection: Any
    accepted_at: float = field(default_factory=time.monotonic)
    opened: bool = False
    closing_since: float | None = None  # refused, or its input ended: closed once flushed
    outbox: dict[Any, list[bytes]] = field(default_factory=dict)


class HandlerBase(Handler):
    """State of every connection of one emulator, on the reactor thread."""

    def __init__(self, emulator: Emulator, worker: StorageWorker) -> None:
        self.emulator = emulator
        self.worker = worker
        self.acceptor: Any = None
        self.io: Any = None  # the reactor's socket I/O handler (keeps its selector current)
        self.connections: dict[Any, ConnState] = {}
        self.nodes: dict[Any, Node] = {}
        self.locked: dict[Any, Locked] = {}  # delivery -> its lock
        self.tokens: dict[uuid.UUID, Locked] = {}  # lock token -> its lock
        self.senders: list[Any] = []  # links delivering to clients' receivers
        # Session receivers: the broker's session (lock in the broker file) each link holds.
        self.sessions: dict[Any, LocalSession] = {}

    # -- socket events: the I/O handler's alone -------------------------------------------

    def on_selectable_readable(self, event: Any) -> None:
        """Ignored, and answered at once: a socket event per transfer, looked up cheaply."""

    def on_selectable_writable(self, event: Any) -> None:
        """Ignored (see :meth:`on_selectable_readable`)."""

    def on_transport(self, event: Any) -> None:
        """Ignored (see :meth:`on_selectable_readable`)."""

    def flush(self, connection: Any) -> None:
        """Write a connection's pending frames to its socket now, in this turn of the loop.

        Left to the loop, an answer waits for the next turn: a select that finds the
        socket writable and a socket event, per answer. A socket that takes only part
        (or fails) gets the rest from the loop, as before.
        """
        transport = connection.transport
        selectable = getattr(transport, "_selectable", None) if transport is not None else None
        if selectable is None or selectable.is_terminal or self.io is None:
            return
        try:
            pending = transport.pending()
            if pending <= 0:
                return  # nothing to write, or the transport is closed
            transport.pop(selectable.send(transport.peek(pending)))
        except (OSError, ProtonException):
            return  # the socket is full or failed: the loop writes (or fails) as before
        self.io.update(transport, selectable, selectable._reactor.now)

    # -- storage work ---------------------------------------------------------------------

    def submit(
        self,
        work: Callable[[Any], T],
        done: Callable[[Outcome[T]], None],
        *,
        writes: bool,
        connection: Any = None,
        patience: float = 30.0,
    ) -> None:
        """Run ``work(store)`` (here if the worker is idle, else on it), then ``done`` here.

        ``done`` is skipped when ``connection`` has gone meanwhile (nothing to answer).
        """

        def finish(outcome: Outcome[T]) -> None:
            if connection is not None and connection not in self.connections:
                return
            try:
                done(outcome)
            except Exception:
                _log.exception("emulator failed finishing a storage operation")
                if connection is not None:
                    self.hard_close(connection)

        outcome = self.worker.run_inline(work)
        if outcome is not None:
            finish(outcome)
        else:
            self.worker.submit(work, finish, writes=writes, patience=patience)

    # -- sessions ---------------------------------------------------------------------------

    def release_session(self, link: Any) -> None:
        """Give back the session a link holds (its unsettled messages become available)."""
        session = self.sessions.pop(link, None)
        if session is not None:
            self.submit(lambda store: session.close(), _log_failure, writes=True)

    def lose_session(self, link: Any, description: str) -> None:
        """Detach a session receiver whose session lock is gone, as Service Bus does.

        The client raises ``SessionLockLostError``; the session is free for the next
        receiver.
        """
        self.release_session(link)
        self.detach(link, condition(SESSION_LOCK_LOST, description))

    def detach(self, link: Any, error: Condition | None) -> None:
        """Close a link from this side (with ``error``) and forget what it held."""
        self.nodes.pop(link, None)
        if link in self.senders:
            self.senders.remove(link)
        self.forget_locks(lambda locked_link: locked_link == link)
        if not link.state & Endpoint.LOCAL_CLOSED:
            if error is not None:
                link.condition = error
            link.close()

    def forget_locks(self, gone: Callable[[Any], bool], connection: Any = None) -> None:
        """Drop lock bookkeeping of deliveries whose link ``gone(link)`` says is gone.

        With ``connection``, also the locks handed out over it by management requests.
        """
        for dlv in [d for d in self.locked if gone(d.link)]:
            locked = self.locked.pop(dlv)
            self.tokens.pop(locked.key, None)
        if connection is not None:
            for key in [k for k, v in self.tokens.items() if v.connection == connection]:
                self.tokens.pop(key, None)

    def expire_locks(self) -> None:
        """Drop lock bookkeeping whose lock has run out (the broker has released the message).

        A session's messages have no lock of their own: theirs goes with the session.
        """
        now = datetime.now(UTC)
        for key, locked in list(self.tokens.items()):
            if _expired(locked, now):
                self.tokens.pop(key, None)
        for dlv, locked in list(self.locked.items()):
            if _expired(locked, now):
                self.locked.pop(dlv, None)

    def flush_outbox(self, link: Any) -> None:
        """Send the replies waiting for this link's credit."""
        state = self.connections.get(link.connection)
        if state is None:
            return
        queue = state.outbox.get(link)
        while queue and link.credit > 0:
            encoded = queue.pop(0)
            dlv = link.delivery(uuid.uuid4().bytes)
            link.stream(encoded)
            link.advance()
            dlv.settle()

    # -- closing ----------------------------------------------------------------------------

    @staticmethod
    def hard_close(connection: Any, *, release: bool = False) -> None:
        """Drop the TCP connection at once: no close frame, no pending output.

        ``release`` also closes the socket (at shutdown, when the reactor will
        not run again to do it).
        """
        transport = connection.transport
        selectable = getattr(transport, "_selectable", None) if transport else None
        sock = getattr(selectable, "_delegate", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            if release:
                sock.close()
        if transport is not None:
            transport.close_head()
            transport.close_tail()

    @staticmethod
    def settle(dlv: Any, outcome: Any, error: Condition | None = None) -> None:
        """Settle a delivery with ``outcome`` (and an error condition)."""
        if error is not None:
            dlv.local.condition = error
        dlv.update(outcome)
        dlv.settle()


def _expired(locked: Locked, now: datetime) -> bool:
    return locked.session is None and locked.locked_until is not None and locked.locked_until <= now


def _log_failure(outcome: Outcome[Any]) -> None:
    if outcome.error is not None:
        _log.warning("releasing a session failed (its lock runs out by itself): %s", outcome.error)
