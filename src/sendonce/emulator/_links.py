"""Connection and link lifecycle: open, attach (refusals, session locks), detach, timeouts."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from proton import Endpoint, Terminus

from . import _store_work
from ._base import ConnState, HandlerBase, guarded
from ._conditions import RESOURCE_LIMIT, TIMEOUT, condition, store_condition
from ._nodes import (
    SESSION_FILTER,
    SESSION_LOCKED_UNTIL,
    Node,
    attach_wait,
    parse_node,
    strip_address,
    terminus_map,
)
from ._worker import Outcome

__all__ = ["LinkLifecycle"]

_log = logging.getLogger("sendonce.emulator")

_RECEIVE_CREDIT = 200
# How long a connection that is over may take to flush its last frames.
_CLOSING_GRACE = 1.0
_DOTNET_EPOCH_TICKS = 621355968000000000  # 0001-01-01 to 1970-01-01 in 100 ns ticks


class LinkLifecycle(HandlerBase):
    """Connections and links coming and going, and the limits on them."""

    # NEXT_AVAILABLE_SESSION receivers waiting for a session: link -> (node, filters, give-up).
    waiting: dict[Any, tuple[Node, dict[str, Any], datetime]]
    attaching: set[Any]  # links whose attach waits for the storage worker

    def init_lifecycle(self) -> None:
        self.waiting = {}
        self.attaching = set()

    # -- connections ------------------------------------------------------------------------

    @guarded
    def on_connection_bound(self, event: Any) -> None:
        transport = event.transport
        sasl = transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        settings = self.emulator.limits
        transport.idle_timeout = settings.idle_timeout
        transport.max_frame_size = settings.max_frame_size
        self.connections[event.connection] = ConnState(event.connection)
        self.emulator._connection_change(+1)
        if len(self.connections) > settings.max_connections:
            # A clear refusal, as a broker at its connection limit gives: open, then
            # close with the reason (the client reports it), and no further work.
            connection = event.connection
            connection.condition = condition(
                RESOURCE_LIMIT,
                f"the emulator serves at most {settings.max_connections} connections at once",
            )
            connection.open()
            connection.close()
            self.connections[connection].closing_since = time.monotonic()

    @guarded
    def on_connection_remote_open(self, event: Any) -> None:
        conn = event.connection
        state = self.connections.get(conn)
        if state is not None:
            state.opened = True
        conn.container = "sendonce-emulator"
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.open()

    def on_session_remote_open(self, event: Any) -> None:
        if event.session.state & Endpoint.LOCAL_UNINIT:
            event.session.open()

    def on_session_remote_close(self, event: Any) -> None:
        if not event.session.state & Endpoint.LOCAL_CLOSED:
            event.session.close()

    def on_connection_remote_close(self, event: Any) -> None:
        if not event.connection.state & Endpoint.LOCAL_CLOSED:
            event.connection.close()
        self.forget(event.connection)

    def on_transport_error(self, event: Any) -> None:
        transport = event.transport
        if transport is not None:
            _log.info("closing a connection after a transport error: %s", transport.condition)
        self.on_transport_tail_closed(event)

    def on_transport_tail_closed(self, event: Any) -> None:
        # A malformed frame, an idle timeout, a peer gone: proton stops reading but
        # may leave the socket open (a CLOSE-WAIT leak per bad client). It is closed
        # once proton's last frame (the error, the close) is written.
        state = self.connections.get(event.connection)
        if state is not None and state.closing_since is None:
            state.closing_since = time.monotonic()
        self.close_finished()

    def on_transport_closed(self, event: Any) -> None:
        if event.connection is not None:
            self.forget(event.connection)

    def forget(self, connection: Any) -> None:
        """Drop everything a connection held (its links, sessions, locks)."""
        if self.connections.pop(connection, None) is not None:
            self.emulator._connection_change(-1)
        for link in [k for k in self.nodes if k.connection == connection]:
            self.nodes.pop(link, None)
        self.senders = [s for s in self.senders if s.connection != connection]
        for link in [k for k in self.sessions if k.connection == connection]:
            self.release_session(link)
        for link in [k for k in self.waiting if k.connection == connection]:
            self.waiting.pop(link, None)
        self.attaching = {k for k in self.attaching if k.connection != connection}
        self.forget_locks(lambda link: link.connection == connection, connection)

    def enforce_handshake_timeout(self) -> None:
        """Close connections that have not completed their AMQP open in time (as ActiveMQ does)."""
        limit = self.emulator.limits.handshake_timeout
        now = time.monotonic()
        for state in list(self.connections.values()):
            if not state.opened and now - state.accepted_at > limit:
                _log.info("closing a connection that did not open within %g s", limit)
                self.hard_close(state.connection)
                self.forget(state.connection)

    def close_finished(self) -> None:
        """Close the sockets of connections that are over once their last frames are out."""
        now = time.monotonic()
        for state in list(self.connections.values()):
            if state.closing_since is None:
                continue
            transport = state.connection.transport
            try:
                # Written out only once proton has closed its output (after the close
                # frame): nothing pending may just mean the client's handshake is late.
                flushed = transport is None or transport.pending() < 0
            except Exception:  # proton raises once the transport is closed
                flushed = True
            if flushed or now - state.closing_since > _CLOSING_GRACE:
                self.hard_close(state.connection)
                self.forget(state.connection)

    def close_all(self) -> None:
        for link in list(self.sessions):
            self.release_session(link)
        for state in list(self.connections.values()):
            self.hard_close(state.connection, release=True)
        self.emulator._connection_change(-len(self.connections))
        self.connections.clear()

    def shutdown(self, container: Any) -> None:
        if self.acceptor is not None:
            self.acceptor.close()
        self.close_all()
        container.stop()

    # -- links ------------------------------------------------------------------------------

    @guarded
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if link.is_receiver:
            path = strip_address(link.remote_target.address)
        else:
            path = strip_address(link.remote_source.address)
        node = parse_node(path)
        if node.kind == "management" and node.entity:
            self._attach_management(link, node)
            return
        if node.kind != "entity":
            self.accept(link, node, 0)
            return
        receiving = link.is_sender
        filters = terminus_map(link.remote_source.filter) if receiving else {}
        lock_duration = self.emulator.lock_duration
        wants_session = receiving and str(SESSION_FILTER) in filters

        def work(store: Any) -> tuple[Any, Any, int]:
            refusal = _store_work.check_entity(store, node, receiving=receiving)
            session = None
            if refusal is None and receiving:
                refusal, session = _store_work.lock_session(store, node, filters, lock_duration)
            size = _store_work.max_size(store, node) if refusal is None else 0
            return refusal, session, size

        self.attaching.add(link)
        self.submit(
            work,
            lambda outcome: self._attached(link, node, filters, outcome),
            writes=wants_session,
            connection=link.connection,
        )

    def _attach_management(self, link: Any, node: Node) -> None:
        """A ``$management`` link of a missing entity is refused, as Service Bus does."""

        def work(store: Any) -> Any:
            return _store_work.check_management(store, node)

        def done(outcome: Outcome[Any]) -> None:
            if link.state & Endpoint.REMOTE_CLOSED:
                return
            if outcome.error is not None:
                error = store_condition(outcome.error)
                self.refuse(link, (str(error.name), str(error.description)))
            elif outcome.value is not None:
                self.refuse(link, outcome.value)
            else:
                self.accept(link, node, 0)

        self.submit(work, done, writes=False, connection=link.connection)

    def _attached(
        self, link: Any, node: Node, filters: dict[str, Any], outcome: Outcome[Any]
    ) -> None:
        self.attaching.discard(link)
        if outcome.error is not None:  # the store stayed locked past the operation timeout
            error = store_condition(outcome.error)
            self.refuse(link, (str(error.name), str(error.description)))
            return
        refusal, session, size = outcome.get()
        if link.state & Endpoint.REMOTE_CLOSED:
            if session is not None:
                self.sessions[link] = session
                self.release_session(link)
            return
        if refusal is not None and refusal[0] == TIMEOUT:
            # NEXT_AVAILABLE_SESSION and none free: Service Bus holds the attach
            # until a session can be locked, at most the link's
            # com.microsoft:timeout (the client sends its max_wait_time there).
            self.waiting[link] = (node, filters, datetime.now(UTC) + attach_wait(link))
            return
        if refusal is not None:
            self.refuse(link, refusal)
            return
        if session is not None:
            self.hold_session(link, node, session)
        self.accept(link, node, size)

    def hold_session(self, link: Any, node: Node, session: Any) -> None:
        self.sessions[link] = session
        node.session_id = session.session_id
        ticks = _DOTNET_EPOCH_TICKS + int(session.locked_until.timestamp() * 10_000_000)
        link.properties = {SESSION_LOCKED_UNTIL: ticks}

    @staticmethod
    def refuse(link: Any, refusal: tuple[str, str]) -> None:
        # As Service Bus does: an attach with a null terminus, then a detach
        # with the error (the client fails the open on the null terminus).
        link.source.type = Terminus.UNSPECIFIED
        link.target.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = condition(*refusal)
        link.close()

    def accept(self, link: Any, node: Node, size: int) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if node.session_id is not None:
            link.source.filter.clear()
            link.source.filter.put_dict({SESSION_FILTER: node.session_id})
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if link.is_receiver:
            link.max_message_size = size
        link.open()
        self.nodes[link] = node
        if link.is_receiver:
            link.flow(_RECEIVE_CREDIT)
        elif node.kind == "entity":
            self.senders.append(link)

    @guarded
    def on_link_remote_close(self, event: Any) -> None:
        link = event.link
        self.waiting.pop(link, None)
        self.detach(link, None)
        self.release_session(link)

    def expire_session_locks(self) -> None:
        """Release session locks not renewed in time (the broker's lock has expired)."""
        now = datetime.now(UTC)
        for link, session in list(self.sessions.items()):
            if session.locked_until <= now:
                self.lose_session(link, f"the lock on session {session.session_id!r} expired")

    def retry_waiting(self) -> None:
        """Give waiting NEXT_AVAILABLE_SESSION receivers a session that became free."""
        lock_duration = self.emulator.lock_duration
        for link, (node, filters, give_up) in list(self.waiting.items()):
            if link.state & Endpoint.REMOTE_CLOSED:
                self.waiting.pop(link, None)
                continue
            if link in self.attaching:
                continue

            def work(store: Any, node: Node = node, filters: dict[str, Any] = filters) -> Any:
                return _store_work.lock_session(store, node, filters, lock_duration)

            def done(
                outcome: Outcome[Any],
                link: Any = link,
                node: Node = node,
                give_up: datetime = give_up,
            ) -> None:
                self.attaching.discard(link)
                if outcome.error is not None:  # the file is locked: the next poll asks again
                    return
                refusal, session = outcome.get()
                if link not in self.waiting or link.state & Endpoint.REMOTE_CLOSED:
                    if session is not None:
                        self.sessions[link] = session
                        self.release_session(link)
                    self.waiting.pop(link, None)
                    return
                if refusal is None:
                    self.waiting.pop(link, None)
                    if session is not None:
                        self.hold_session(link, node, session)
                    self.accept(link, node, 0)
                elif refusal[0] != TIMEOUT or datetime.now(UTC) >= give_up:
                    self.waiting.pop(link, None)
                    self.refuse(link, refusal)

            self.attaching.add(link)
            self.submit(work, done, writes=True, connection=link.connection, patience=0)
