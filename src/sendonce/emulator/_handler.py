"""Service Bus behaviour on proton events: links, transfers, $cbs, $management, receivers.

One ``_Handler`` serves every connection of one emulator, on the reactor
thread, storing and reading through that thread's ``LocalBackend``. Faults
from the emulator's script are applied here, one per incoming transfer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from proton import Condition, Delivery, Endpoint, Handler, Link, Message, Terminus, symbol

from ..errors import (
    MessageSizeError,
    NoSessionAvailableError,
    PermanentSendError,
    SendError,
    SendOnceError,
    SessionCannotBeLockedError,
    SessionLockLostError,
    TransientSendError,
    ValidationError,
)
from . import _codec
from ._faults import FaultAction

if TYPE_CHECKING:
    from ..backends.local import LocalSession
    from ._server import Emulator

__all__ = ["EmulatorHandler", "Tick"]

_log = logging.getLogger("sendonce.emulator")

SERVER_BUSY = "com.microsoft:server-busy"
UNAUTHORIZED = "amqp:unauthorized-access"
NOT_FOUND = "amqp:not-found"
NOT_IMPLEMENTED = "amqp:not-implemented"
DETACH_FORCED = "amqp:link:detach-forced"
MESSAGE_SIZE = "amqp:link:message-size-exceeded"
ARGUMENT_ERROR = "com.microsoft:argument-error"
DECODE_ERROR = "amqp:decode-error"
INTERNAL_ERROR = "amqp:internal-error"
LOCK_LOST = "com.microsoft:message-lock-lost"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
TIMEOUT = "com.microsoft:timeout"
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
# How long a NEXT_AVAILABLE_SESSION attach waits for a session before the broker
# answers com.microsoft:timeout (the service's default operation timeout is 60 s).
_SESSION_WAIT = timedelta(seconds=60)
SESSION_FILTER = symbol("com.microsoft:session-filter")
SESSION_LOCKED_UNTIL = symbol("com.microsoft:locked-until-utc")
_DOTNET_EPOCH_TICKS = 621355968000000000  # 0001-01-01 to 1970-01-01 in 100 ns ticks

_STORE_TIMEOUT = 30.0
_RECEIVE_CREDIT = 200
_SUBSCRIPTIONS = "/subscriptions/"
_DEAD_LETTER_QUEUE = "/$deadletterqueue"
DEAD_LETTER = "com.microsoft:dead-letter"
DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"


_F = TypeVar("_F", bound=Callable[..., None])


def _guarded(method: _F) -> _F:
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
                EmulatorHandler._hard_close(connection)

    return wrapper  # type: ignore[return-value]


def _condition(name: str, description: str) -> Condition:
    # The client crashes on an error without an info map: always send one.
    return Condition(name, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})


def _strip_address(address: str | None) -> str:
    """The node path of a link address (``amqps://host:port/orders`` -> ``orders``)."""
    text = address or ""
    if "://" in text:
        text = text.split("://", 1)[1]
        text = text.split("/", 1)[1] if "/" in text else ""
    return text.strip("/")


@dataclass
class _Node:
    """What a link is attached to."""

    kind: str  # "entity" | "management" | "cbs"
    entity: str = ""
    subscription: str | None = None
    session_id: str | None = None  # a session receiver's locked session
    sub_queue: Any = None  # "dead_letter" for <entity>/$DeadLetterQueue


@dataclass(eq=False)
class _Locked:
    entity: str
    subscription: str | None
    lock_token: str
    key: uuid.UUID  # the lock token as the client reads it from the delivery tag
    sub_queue: Any = None
    session: LocalSession | None = None  # received in a session: settled through it


@dataclass
class _ConnState:
    connection: Any
    outbox: dict[Any, list[bytes]] = field(default_factory=dict)


def _parse_node(path: str) -> _Node:
    if path == "$cbs":
        return _Node("cbs")
    if path.endswith("/$management") or path == "$management":
        entity = path[: -len("$management")].rstrip("/")
        base = _parse_node(entity) if entity else _Node("entity")
        return _Node("management", base.entity, base.subscription, sub_queue=base.sub_queue)
    if path.lower().endswith(_DEAD_LETTER_QUEUE):
        base = _parse_node(path[: -len(_DEAD_LETTER_QUEUE)])
        base.sub_queue = "dead_letter"
        return base
    lowered = path.lower()
    if _SUBSCRIPTIONS in lowered:
        i = lowered.index(_SUBSCRIPTIONS)
        return _Node("entity", path[:i], path[i + len(_SUBSCRIPTIONS) :])
    return _Node("entity", path)


class Tick(Handler):
    """The periodic timer: polls the store for receivers and honours the stop flag."""

    def __init__(self, handler: EmulatorHandler) -> None:
        self.handler = handler

    def on_timer_task(self, event: Any) -> None:
        h = self.handler
        if h.emulator._stop.is_set():
            h.shutdown(event.container)
            return
        try:
            h.poll()
        except Exception:
            _log.exception("emulator poll failed")
        event.container.schedule(h.emulator.poll_interval, self)


class EmulatorHandler(Handler):
    """Proton events -> Service Bus behaviour."""

    def __init__(self, emulator: Emulator, store: Any) -> None:
        self.emulator = emulator
        self.store = store
        self.acceptor: Any = None
        self.connections: dict[Any, _ConnState] = {}
        self.nodes: dict[Any, _Node] = {}
        self.locked: dict[Any, _Locked] = {}
        self.tokens: dict[uuid.UUID, _Locked] = {}
        self.senders: list[Any] = []  # links delivering to clients' receivers
        # Session receivers: the broker's session (lock in the broker file) each link holds.
        self.sessions: dict[Any, LocalSession] = {}
        # NEXT_AVAILABLE_SESSION receivers waiting for a session: link -> (node, give-up time).
        self.waiting: dict[Any, tuple[_Node, datetime]] = {}

    # -- lifecycle ------------------------------------------------------------------------

    @_guarded
    def on_connection_bound(self, event: Any) -> None:
        sasl = event.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        self.connections[event.connection] = _ConnState(event.connection)
        self.emulator._connection_change(+1)

    @_guarded
    def on_connection_remote_open(self, event: Any) -> None:
        conn = event.connection
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
        self._forget(event.connection)

    def on_transport_closed(self, event: Any) -> None:
        if event.connection is not None:
            self._forget(event.connection)

    def _forget(self, connection: Any) -> None:
        if self.connections.pop(connection, None) is not None:
            self.emulator._connection_change(-1)
        for link in [k for k in self.nodes if k.connection == connection]:
            self.nodes.pop(link, None)
        self.senders = [s for s in self.senders if s.connection != connection]
        for link in [k for k in self.sessions if k.connection == connection]:
            self._release_session(link)
        for link in [k for k in self.waiting if k.connection == connection]:
            self.waiting.pop(link, None)
        for dlv in [d for d in self.locked if d.link.connection == connection]:
            self.locked.pop(dlv, None)

    @_guarded
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if link.is_receiver:
            path = _strip_address(link.remote_target.address)
        else:
            path = _strip_address(link.remote_source.address)
        node = _parse_node(path)
        if node.kind == "entity":
            refusal = self._check_entity(node, receiving=link.is_sender)
            if refusal is None and link.is_sender:
                refusal = self._lock_session(link, node)
                if refusal is not None and refusal[0] == TIMEOUT:
                    # NEXT_AVAILABLE_SESSION and none free: Service Bus holds the attach
                    # until a session can be locked, at most the link's
                    # com.microsoft:timeout (the client sends its max_wait_time there).
                    self.waiting[link] = (node, datetime.now(UTC) + _attach_wait(link))
                    return
            if refusal is not None:
                self._refuse(link, refusal)
                return
        self._accept(link, node)

    @staticmethod
    def _refuse(link: Any, refusal: tuple[str, str]) -> None:
        # As Service Bus does: an attach with a null terminus, then a detach
        # with the error (the client fails the open on the null terminus).
        link.source.type = Terminus.UNSPECIFIED
        link.target.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = _condition(*refusal)
        link.close()

    def _accept(self, link: Any, node: _Node) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if node.session_id is not None:
            link.source.filter.clear()
            link.source.filter.put_dict({SESSION_FILTER: node.session_id})
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if link.is_receiver:
            link.max_message_size = self._max_size(node)
        link.open()
        self.nodes[link] = node
        if link.is_receiver:
            link.flow(_RECEIVE_CREDIT)
        elif node.kind == "entity":
            self.senders.append(link)

    def _release_session(self, link: Any) -> None:
        """Give back the session a link holds (its unsettled messages become available)."""
        session = self.sessions.pop(link, None)
        if session is not None:
            try:
                session.close()
            except Exception:  # the lock runs out by itself
                _log.exception("releasing session %r failed", session.session_id)

    def _held_session(self, node: _Node, session_id: str | None) -> LocalSession | None:
        """The session this emulator holds for a management request's session-id."""
        for session in self.sessions.values():
            if (
                session.session_id == session_id
                and session.entity == node.entity
                and session.subscription == node.subscription
            ):
                return session
        return None

    def _lose_session(self, link: Any, description: str) -> None:
        """Detach a session receiver whose session lock is gone, as Service Bus does.

        The client raises ``SessionLockLostError``; the session is free for the next
        receiver.
        """
        self._release_session(link)
        self.nodes.pop(link, None)
        if link in self.senders:
            self.senders.remove(link)
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.condition = _condition(SESSION_LOCK_LOST, description)
            link.close()

    def _expire_session_locks(self) -> None:
        """Release session locks not renewed in time (the broker's lock has expired)."""
        now = datetime.now(UTC)
        for link, session in list(self.sessions.items()):
            if session.locked_until <= now:
                self._lose_session(link, f"the lock on session {session.session_id!r} expired")

    def _retry_waiting(self) -> None:
        """Give waiting NEXT_AVAILABLE_SESSION receivers a session that became free."""
        now = datetime.now(UTC)
        for link, (node, give_up) in list(self.waiting.items()):
            if link.state & Endpoint.REMOTE_CLOSED:
                self.waiting.pop(link, None)
                continue
            refusal = self._lock_session(link, node)
            if refusal is None:
                self.waiting.pop(link, None)
                self._accept(link, node)
            elif refusal[0] != TIMEOUT or now >= give_up:
                self.waiting.pop(link, None)
                self._refuse(link, refusal)

    def _check_entity(self, node: _Node, *, receiving: bool) -> tuple[str, str] | None:
        if not node.entity:
            return NOT_FOUND, "no entity named in the link address"
        if "$" in node.entity or (node.subscription and "$" in node.subscription):
            return NOT_FOUND, f"{node.entity!r}: dead-letter and system queues are not emulated"
        try:
            profile = self.store.describe(node.entity)
        except Exception:
            return NOT_FOUND, f"the messaging entity {node.entity!r} could not be found"
        if not receiving and node.subscription is not None:
            return NOT_FOUND, "cannot send to a subscription"
        if not receiving and node.sub_queue is not None:
            return NOT_FOUND, "cannot send to a dead-letter queue"
        if getattr(profile, "kind", "queue") == "topic" and receiving and not node.subscription:
            return NOT_FOUND, (
                f"{node.entity!r} is a topic: receive from {node.entity}/Subscriptions/<name>"
            )
        return None

    def _lock_session(self, link: Any, node: _Node) -> tuple[str, str] | None:
        """Give a session receiver its session (the one asked for, or the next available).

        Returns an error (condition, description) when it cannot be locked.
        """
        if node.sub_queue is not None:
            return None  # a dead-letter subqueue has no sessions to lock
        filters = _terminus_map(link.remote_source.filter)
        sessionful = bool(getattr(self.store.describe(node.entity), "sessions", False))
        if str(SESSION_FILTER) not in filters:
            if sessionful:
                return ARGUMENT_ERROR, (
                    f"{node.entity!r} requires sessions: open a session receiver"
                )
            return None
        wanted = filters[str(SESSION_FILTER)]
        # The lock lives in the broker file: local:// session receivers (LocalSession)
        # and other emulators on the same file compete for it with this client.
        try:
            session = self.store.accept_session(
                node.entity,
                _text(wanted) if wanted is not None else None,
                subscription=node.subscription,
                max_wait_time=0,
                lock_duration=self.emulator.lock_duration,
            )
        except SessionCannotBeLockedError as exc:
            return SESSION_CANNOT_BE_LOCKED, _describe(exc)
        except NoSessionAvailableError as exc:
            return TIMEOUT, _describe(exc)
        except ValidationError as exc:  # no sessions on the entity, a bad session id
            return ARGUMENT_ERROR, _describe(exc)
        self.sessions[link] = session
        node.session_id = session.session_id
        ticks = _DOTNET_EPOCH_TICKS + int(session.locked_until.timestamp() * 10_000_000)
        link.properties = {SESSION_LOCKED_UNTIL: ticks}
        return None

    def _max_size(self, node: _Node) -> int:
        if node.kind != "entity":
            return 0
        try:
            return int(self.store.describe(node.entity).max_message_size)
        except Exception:
            return 256 * 1024

    @_guarded
    def on_link_remote_close(self, event: Any) -> None:
        link = event.link
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.close()
        self.waiting.pop(link, None)
        self.nodes.pop(link, None)
        if link in self.senders:
            self.senders.remove(link)
        self._release_session(link)

    @_guarded
    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_sender:
            self._flush_outbox(link)
            if link in self.senders:
                self._pump(link)

    def close_all(self) -> None:
        for link in list(self.sessions):
            self._release_session(link)
        for state in list(self.connections.values()):
            self._hard_close(state.connection, release=True)
        self.emulator._connection_change(-len(self.connections))
        self.connections.clear()

    def shutdown(self, container: Any) -> None:
        if self.acceptor is not None:
            self.acceptor.close()
        self.close_all()
        container.stop()

    @staticmethod
    def _hard_close(connection: Any, *, release: bool = False) -> None:
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

    # -- incoming transfers ---------------------------------------------------------------

    @_guarded
    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        link = event.link
        if link.is_receiver:
            if not dlv.readable or dlv.partial:
                return
            payload = link.recv(dlv.pending) or b""
            payload = bytes(payload)
            link.advance()
            if link.credit < _RECEIVE_CREDIT // 2:
                link.flow(_RECEIVE_CREDIT - link.credit)
            node = self.nodes.get(link)
            if node is None:
                self._settle(dlv, Delivery.REJECTED, _condition(NOT_FOUND, "link not attached"))
            elif node.kind == "cbs":
                self._on_cbs(link, dlv, payload)
            elif node.kind == "management":
                self._on_management(link, dlv, node, payload)
            else:
                self._on_transfer(link, dlv, node, payload)
        elif dlv.updated:
            self._on_settlement(dlv)

    @staticmethod
    def _settle(dlv: Any, outcome: Any, condition: Condition | None = None) -> None:
        if condition is not None:
            dlv.local.condition = condition
        dlv.update(outcome)
        dlv.settle()

    def _on_transfer(self, link: Any, dlv: Any, node: _Node, payload: bytes) -> None:
        entity = node.entity
        self.emulator._count(entity)
        action = self.emulator.faults.take(entity, "send")
        if action is FaultAction.SERVER_BUSY:
            self._settle(dlv, Delivery.REJECTED, _condition(SERVER_BUSY, "server busy (injected)"))
            return
        if action is FaultAction.UNAUTHORIZED:
            refusal = _condition(UNAUTHORIZED, "unauthorized (injected)")
            self._settle(dlv, Delivery.REJECTED, refusal)
            return
        if action is FaultAction.DROP_BEFORE_COMMIT:
            self._hard_close(link.connection)
            return
        try:
            decoded = [_codec.to_message(raw) for raw in _codec.unbatch(payload)]
        except ValidationError as exc:  # e.g. a message id over 128 characters
            self._settle(dlv, Delivery.REJECTED, _condition(ARGUMENT_ERROR, _describe(exc)))
            return
        except (_codec.CodecError, IndexError, ValueError) as exc:
            self._settle(dlv, Delivery.REJECTED, _condition(DECODE_ERROR, _describe(exc)))
            return
        try:
            self.store.send(
                entity,
                [d.message for d in decoded],
                timeout=_STORE_TIMEOUT,
                raw=[d.raw for d in decoded],
            )
        except Exception as exc:
            self._settle(dlv, Delivery.REJECTED, _store_condition(exc))
            return
        self._after_commit(link, dlv, action)

    def _after_commit(self, link: Any, dlv: Any, action: FaultAction) -> None:
        if action is FaultAction.WITHHOLD:
            return  # stored, and the client never hears of it
        if action is FaultAction.DROP_AFTER_COMMIT:
            self._hard_close(link.connection)
            return
        if action is FaultAction.DETACH_AFTER_COMMIT:
            link.condition = _condition(DETACH_FORCED, "link detached (injected)")
            link.close()
            self.nodes.pop(link, None)
            return
        self._settle(dlv, Delivery.ACCEPTED)

    # -- $cbs and $management -------------------------------------------------------------

    def _request(self, dlv: Any, payload: bytes) -> Message | None:
        request = Message()
        try:
            request.decode(payload)
        except Exception as exc:
            self._settle(dlv, Delivery.REJECTED, _condition(DECODE_ERROR, _describe(exc)))
            return None
        self._settle(dlv, Delivery.ACCEPTED)
        return request

    def _on_cbs(self, link: Any, dlv: Any, payload: bytes) -> None:
        request = self._request(dlv, payload)
        if request is None:
            return
        self._reply(
            link,
            request,
            {"status-code": 200, "status-description": "OK"},
            None,
        )

    def _reply(
        self,
        link: Any,
        request: Message,
        properties: dict[str, Any],
        body: Any,
    ) -> None:
        reply = Message()
        reply.correlation_id = request.id
        reply.properties = properties  # type: ignore[assignment]
        if body is not None:
            reply.body = body
        encoded = bytes(reply.encode())
        target = self._reply_link(link, request.reply_to)
        if target is None:
            _log.warning("no reply link for %r", request.reply_to)
            return
        state = self.connections.get(link.connection)
        if state is None:
            return
        state.outbox.setdefault(target, []).append(encoded)
        self._flush_outbox(target)

    def _reply_link(self, link: Any, reply_to: str | None) -> Any:
        source = _strip_address(link.remote_target.address)
        fallback = None
        other = link.connection.link_head(Endpoint.LOCAL_ACTIVE)
        while other is not None:
            if other.is_sender:
                if reply_to and other.remote_target.address == reply_to:
                    return other
                if _strip_address(other.remote_source.address) == source:
                    fallback = other
            other = other.next(Endpoint.LOCAL_ACTIVE)
        return fallback

    def _flush_outbox(self, link: Any) -> None:
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

    def _on_management(self, link: Any, dlv: Any, node: _Node, payload: bytes) -> None:
        request = self._request(dlv, payload)
        if request is None:
            return
        request_props: dict[Any, Any] = dict(request.properties or {})
        props = {str(k): v for k, v in request_props.items()}
        operation = str(props.get("operation", ""))
        body = _codec._copy(request.body)
        try:
            status, reply_body = self._operate(link, node, operation, body)
        except _Fault as fault:
            if fault.action is FaultAction.SERVER_BUSY:
                status, reply_body = (503, SERVER_BUSY), None
            elif fault.action is FaultAction.UNAUTHORIZED:
                status, reply_body = (401, UNAUTHORIZED), None
            else:
                return  # dropped, detached or withheld: no reply
        except _MgmtError as err:
            status, reply_body = (err.status, err.condition), None
            description = err.description
        else:
            description = "OK"
        code, condition = status
        properties: dict[str, Any] = {"statusCode": code, "statusDescription": description}
        if condition:
            properties["errorCondition"] = symbol(condition)
            if description == "OK":
                properties["statusDescription"] = condition
        self._reply(link, request, properties, reply_body)

    def _operate(
        self, link: Any, node: _Node, operation: str, body: Any
    ) -> tuple[tuple[int, str | None], Any]:
        body = body if isinstance(body, dict) else {}
        body = {str(k): v for k, v in body.items()}
        if operation == "com.microsoft:schedule-message":
            return (200, None), {"sequence-numbers": self._schedule(link, node, body)}
        if operation == "com.microsoft:cancel-scheduled-message":
            seqs = [int(s) for s in body.get("sequence-numbers") or []]
            try:
                self.store.cancel_scheduled(node.entity, seqs)
            except Exception as exc:
                raise _MgmtError(404, NOT_FOUND, _describe(exc)) from exc
            return (200, None), {}
        if operation == "com.microsoft:update-disposition":
            return self._update_disposition(node, body), {}
        if operation == "com.microsoft:renew-lock":
            return (200, None), {"expirations": self._renew(body)}
        if operation == "com.microsoft:peek-message":
            return self._peek(node, body)
        if operation == "com.microsoft:receive-by-sequence-number":
            return (200, None), {"messages": self._receive_deferred(node, body)}
        if operation in (
            "com.microsoft:renew-session-lock",
            "com.microsoft:get-session-state",
            "com.microsoft:set-session-state",
        ):
            return self._session_operation(node, operation, body)
        raise _MgmtError(501, NOT_IMPLEMENTED, f"{operation!r} is not emulated")

    def _schedule(self, link: Any, node: _Node, body: dict[str, Any]) -> list[int]:
        entity = node.entity
        self.emulator._count(entity)
        action = self.emulator.faults.take(entity, "schedule")
        if action in (FaultAction.SERVER_BUSY, FaultAction.UNAUTHORIZED):
            raise _Fault(action)
        if action is FaultAction.DROP_BEFORE_COMMIT:
            self._hard_close(link.connection)
            raise _Fault(action)
        items = body.get("messages") or []
        try:
            decoded = [
                _codec.to_message(bytes(dict(item)["message"]) if isinstance(item, dict) else b"")
                for item in items
            ]
        except Exception as exc:
            raise _MgmtError(400, DECODE_ERROR, _describe(exc)) from exc
        if not decoded:
            return []
        at = decoded[0].message.scheduled_enqueue_time
        if at is None:
            raise _MgmtError(400, ARGUMENT_ERROR, "x-opt-scheduled-enqueue-time is missing")
        try:
            acks = self.store.schedule(
                entity,
                [d.message for d in decoded],
                at,
                timeout=_STORE_TIMEOUT,
                raw=[d.raw for d in decoded],
            )
        except Exception as exc:
            cond = _store_condition(exc)
            raise _MgmtError(
                503 if cond.name == SERVER_BUSY else 400, cond.name, cond.description or ""
            ) from exc
        seqs = [int(a.sequence_number) if a.sequence_number is not None else -1 for a in acks]
        if action is not FaultAction.NONE:
            self._after_commit_mgmt(link, action)
            raise _Fault(action)
        return seqs

    def _after_commit_mgmt(self, link: Any, action: FaultAction) -> None:
        if action is FaultAction.DROP_AFTER_COMMIT:
            self._hard_close(link.connection)
        elif action is FaultAction.DETACH_AFTER_COMMIT:
            link.condition = _condition(DETACH_FORCED, "link detached (injected)")
            link.close()
            self.nodes.pop(link, None)

    def _update_disposition(self, node: _Node, body: dict[str, Any]) -> tuple[int, str | None]:
        status = str(body.get("disposition-status", ""))
        settled: set[uuid.UUID] = set()
        for token in body.get("lock-tokens") or []:
            locked = self.tokens.pop(_as_uuid(token), None)
            if locked is None:
                raise _MgmtError(410, LOCK_LOST, "the lock on the message is lost")
            try:
                if status == "completed":
                    self._complete(locked)
                elif status == "defered":  # sic: the client's spelling
                    self._defer(locked)
                elif status == "suspended":  # the management form of dead-lettering
                    self._dead_letter(
                        locked,
                        _text(body.get("deadletter-reason")),
                        _text(body.get("deadletter-description")),
                    )
                else:
                    self._abandon(locked)
            except Exception as exc:
                raise _MgmtError(410, _lost(exc), _describe(exc)) from exc
            settled.add(locked.key)
        for dlv, locked in list(self.locked.items()):
            if locked.key in settled:
                self.locked.pop(dlv, None)
                dlv.settle()
        return (200, None)

    def _renew(self, body: dict[str, Any]) -> list[Any]:
        expirations = []
        for token in body.get("lock-tokens") or []:
            locked = self.tokens.get(_as_uuid(token))
            if locked is None:
                raise _MgmtError(410, LOCK_LOST, "the lock on the message is lost")
            try:
                until = self.store.renew_lock(
                    locked.entity,
                    locked.lock_token,
                    subscription=locked.subscription,
                    lock_duration=self.emulator.lock_duration,
                    sub_queue=locked.sub_queue,
                )
            except Exception as exc:
                raise _MgmtError(410, LOCK_LOST, _describe(exc)) from exc
            expirations.append(_codec._ms(until))
        return expirations

    def _session_operation(
        self, node: _Node, operation: str, body: dict[str, Any]
    ) -> tuple[tuple[int, str | None], Any]:
        session_id = _text(body.get("session-id"))
        session = self._held_session(node, session_id)
        if session is None:
            raise _MgmtError(410, SESSION_LOCK_LOST, f"session {session_id!r} is not locked")
        # Session state lives in the broker file: it outlives the emulator and
        # local:// consumers see it (LocalBackend.get/set_session_state).
        try:
            if operation.endswith("renew-session-lock"):
                # Renews the locks of the session's messages too (they have none of their own).
                return (200, None), {"expiration": _codec._ms(session.renew_lock())}
            if operation.endswith("get-session-state"):
                return (200, None), {"session-state": session.get_state()}
            state = body.get("session-state")
            session.set_state(bytes(state) if state is not None else None)
        except SessionLockLostError as exc:
            raise _MgmtError(410, SESSION_LOCK_LOST, _describe(exc)) from exc
        return (200, None), {}

    def _peek(self, node: _Node, body: dict[str, Any]) -> tuple[tuple[int, str | None], Any]:
        count = int(body.get("message-count") or 1)
        start = body.get("from-sequence-number")
        messages = self.store.peek(
            node.entity,
            max_messages=count,
            subscription=node.subscription,
            from_sequence_number=int(start) if start is not None else None,
            sub_queue=node.sub_queue,
        )
        if not messages:
            return (204, None), None
        return (200, None), {
            "messages": [{"message": self._encode_received(m, peek_lock=False)} for m in messages]
        }

    # -- delivering to receivers ----------------------------------------------------------

    def poll(self) -> None:
        if self.sessions:
            self._expire_session_locks()
        if self.waiting:
            self._retry_waiting()
        for link in list(self.senders):
            if link.credit > 0:
                self._pump(link)

    def _pump(self, link: Any) -> None:
        node = self.nodes.get(link)
        if node is None or not link.state & Endpoint.LOCAL_ACTIVE:
            return
        peek_lock = link.remote_snd_settle_mode != Link.SND_SETTLED
        mode: Literal["peek_lock", "receive_and_delete"] = (
            "peek_lock" if peek_lock else "receive_and_delete"
        )
        session = self.sessions.get(link)
        while link.credit > 0:
            try:
                if session is not None:
                    # Reads first itself; its messages are locked with the session.
                    messages = session.receive(max_messages=min(link.credit, 100), mode=mode)
                # A read first: an empty poll must not take the broker's write lock.
                elif (
                    self.store.count(
                        node.entity, subscription=node.subscription, sub_queue=node.sub_queue
                    )
                    == 0
                ):
                    break
                else:
                    messages = self.store.receive(
                        node.entity,
                        max_messages=min(link.credit, 100),
                        subscription=node.subscription,
                        mode=mode,
                        lock_duration=self.emulator.lock_duration,
                        sub_queue=node.sub_queue,
                    )
            except SessionLockLostError as exc:
                self._lose_session(link, _describe(exc))
                return
            except Exception:
                _log.exception("receive from %r failed", node.entity)
                return
            if not messages:
                break
            for m in messages:
                encoded = self._encode_received(m, peek_lock=peek_lock)
                token = getattr(m, "lock_token", None)
                tag = _codec.lock_token_tag(token) if peek_lock and token else uuid.uuid4().bytes
                dlv = link.delivery(tag)
                link.stream(encoded)
                link.advance()
                if peek_lock and token:
                    key = uuid.UUID(bytes_le=tag)
                    locked = _Locked(
                        node.entity, node.subscription, str(token), key, node.sub_queue, session
                    )
                    self.locked[dlv] = locked
                    self.tokens[key] = locked
                else:
                    dlv.settle()
        if link.drain_mode and link.credit > 0:
            link.drained()

    def _encode_received(self, m: Any, *, peek_lock: bool) -> bytes:
        raw = getattr(m, "raw", None)
        if not raw:
            raw = _codec.encode_fields(
                message_id=m.message_id,
                body=m.body,
                subject=m.subject,
                content_type=m.content_type,
                correlation_id=m.correlation_id,
                session_id=m.session_id,
                application_properties=m.application_properties,
                time_to_live=m.time_to_live,
            )
        count = getattr(m, "delivery_count", None)
        reason = getattr(m, "dead_letter_reason", None)
        description = getattr(m, "dead_letter_error_description", None)
        if reason is not None or description is not None:
            # Service Bus hands the reason out as application properties.
            extra = {DEAD_LETTER_REASON: reason, DEAD_LETTER_DESCRIPTION: description}
            raw = _codec.with_application_properties(
                raw, {k: v for k, v in extra.items() if v is not None}
            )
        return _codec.restamp(
            raw,
            sequence_number=m.sequence_number,
            enqueued_time=m.enqueued_time,
            locked_until=m.locked_until if peek_lock else None,
            partition_key=m.partition_key,
            delivery_count=max(0, int(count) - 1) if count else None,
        )

    def _on_settlement(self, dlv: Any) -> None:
        locked = self.locked.pop(dlv, None)
        state = dlv.remote_state
        if locked is None:
            if dlv.settled:
                dlv.settle()
            return
        self.tokens.pop(locked.key, None)
        try:
            if state == Delivery.ACCEPTED:
                self._complete(locked)
            elif state == Delivery.REJECTED:
                # The client dead-letters with a rejected outcome whose error
                # (com.microsoft:dead-letter) carries the reason and description.
                condition = dlv.remote.condition
                info = {str(k): v for k, v in dict(getattr(condition, "info", None) or {}).items()}
                self._dead_letter(
                    locked,
                    _text(info.get(DEAD_LETTER_REASON)),
                    _text(info.get(DEAD_LETTER_DESCRIPTION)),
                )
            elif state == Delivery.MODIFIED and dlv.remote.undeliverable:
                self._defer(locked)  # the client defers with modified, undeliverable-here
            else:
                self._abandon(locked)
        except Exception as exc:
            self._settle(dlv, Delivery.REJECTED, _condition(_lost(exc), _describe(exc)))
            return
        echo = (
            state
            if state in (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.MODIFIED, Delivery.RELEASED)
            else Delivery.ACCEPTED
        )
        self._settle(dlv, echo)

    def _complete(self, locked: _Locked) -> None:
        if locked.session is not None:
            locked.session.complete(locked.lock_token)
            return
        self.store.complete(
            locked.entity,
            locked.lock_token,
            subscription=locked.subscription,
            sub_queue=locked.sub_queue,
        )

    def _abandon(self, locked: _Locked) -> None:
        if locked.session is not None:
            locked.session.abandon(locked.lock_token)
            return
        self.store.abandon(
            locked.entity,
            locked.lock_token,
            subscription=locked.subscription,
            sub_queue=locked.sub_queue,
        )

    def _defer(self, locked: _Locked) -> None:
        if locked.sub_queue is not None:
            self._abandon(locked)  # nothing to defer to on a dead-letter subqueue
            return
        if locked.session is not None:
            locked.session.defer(locked.lock_token)
            return
        self.store.defer(locked.entity, locked.lock_token, subscription=locked.subscription)

    def _receive_deferred(self, node: _Node, body: dict[str, Any]) -> list[dict[str, Any]]:
        seqs = [int(s) for s in body.get("sequence-numbers") or []]
        settle_mode = body.get("receiver-settle-mode")
        peek_lock = settle_mode is None or int(settle_mode) == 1
        session_id = _text(body.get("session-id"))
        mode: Literal["peek_lock", "receive_and_delete"] = (
            "peek_lock" if peek_lock else "receive_and_delete"
        )
        session = self._held_session(node, session_id) if session_id is not None else None
        try:
            if session is not None:
                messages = session.receive_deferred(seqs, mode=mode)
            else:
                messages = self.store.receive_deferred(
                    node.entity,
                    seqs,
                    subscription=node.subscription,
                    session_id=session_id,
                    mode=mode,
                    lock_duration=self.emulator.lock_duration,
                )
        except SessionLockLostError as exc:
            raise _MgmtError(410, SESSION_LOCK_LOST, _describe(exc)) from exc
        except SessionCannotBeLockedError as exc:
            raise _MgmtError(410, SESSION_LOCK_LOST, _describe(exc)) from exc
        except Exception as exc:
            raise _MgmtError(404, MESSAGE_NOT_FOUND, _describe(exc)) from exc
        out = []
        for m in messages:
            item: dict[str, Any] = {"message": self._encode_received(m, peek_lock=peek_lock)}
            if peek_lock and m.lock_token:
                key = uuid.UUID(bytes_le=_codec.lock_token_tag(m.lock_token))
                self.tokens[key] = _Locked(
                    node.entity, node.subscription, m.lock_token, key, session=session
                )
                item["lock-token"] = key
            out.append(item)
        return out

    def _dead_letter(self, locked: _Locked, reason: str | None, description: str | None) -> None:
        if locked.sub_queue is not None:
            # Service Bus: "you can't dead-letter a message from a DLQ"; the message
            # stays in the dead-letter subqueue, released (the broker decides).
            self.store.dead_letter(
                locked.entity,
                locked.lock_token,
                subscription=locked.subscription,
                sub_queue=locked.sub_queue,
            )
            return
        if locked.session is not None:
            locked.session.dead_letter(
                locked.lock_token, reason=reason, error_description=description
            )
            return
        self.store.dead_letter(
            locked.entity,
            locked.lock_token,
            subscription=locked.subscription,
            reason=reason,
            error_description=description,
        )


class _Fault(Exception):
    def __init__(self, action: FaultAction) -> None:
        super().__init__(action.value)
        self.action = action


class _MgmtError(Exception):
    def __init__(self, status: int, condition: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.condition = condition
        self.description = description


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _attach_wait(link: Any) -> timedelta:
    """How long the client lets a session attach wait: its com.microsoft:timeout, in ms."""
    props = link.remote_properties or {}
    for key, value in dict(props).items():
        if str(key) == TIMEOUT and isinstance(value, int) and value >= 0:
            return timedelta(milliseconds=int(value))
    return _SESSION_WAIT


def _terminus_map(data: Any) -> dict[str, Any]:
    """A terminus filter map with str keys (empty when absent)."""
    if data is None:
        return {}
    data.rewind()
    if not data.next():
        return {}
    value = _codec._copy(data.get_object())
    if not isinstance(value, dict):
        return {}
    return {str(k): (v.value if hasattr(v, "descriptor") else v) for k, v in value.items()}


def _as_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes | bytearray) and len(value) == 16:
        return uuid.UUID(bytes=bytes(value))
    return uuid.UUID(str(value))


def _lost(exc: BaseException) -> str:
    """The lock-lost condition for a failed settlement (a session's or a message's)."""
    return SESSION_LOCK_LOST if isinstance(exc, SessionLockLostError) else LOCK_LOST


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:500]


def _store_condition(exc: BaseException) -> Condition:
    """The AMQP error condition Service Bus would use for a store failure."""
    named = getattr(exc, "condition", None)
    if isinstance(exc, SendError) and isinstance(named, str) and named:
        return _condition(named, _describe(exc))
    if isinstance(exc, MessageSizeError):
        return _condition(MESSAGE_SIZE, _describe(exc))
    if isinstance(exc, ValidationError):
        return _condition(ARGUMENT_ERROR, _describe(exc))
    if isinstance(exc, TransientSendError):
        return _condition(SERVER_BUSY, _describe(exc))
    if isinstance(exc, PermanentSendError):
        return _condition(NOT_FOUND, _describe(exc))
    if isinstance(exc, SendOnceError):
        return _condition(INTERNAL_ERROR, _describe(exc))
    return _condition(INTERNAL_ERROR, f"{type(exc).__name__}: {_describe(exc)}")
