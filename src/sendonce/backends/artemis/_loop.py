"""The proton event loop of one ``ArtemisBackend``: one thread owns every proton object.

proton-python is single-threaded: its ``Container`` runs in one thread per backend, and
callers hand it work through a ``Doorbell`` (a pipe the loop selects on:
``_doorbell``) as ``Request`` objects whose results they wait for
(``_requests``). Nothing outside this thread touches a proton object. Broker
management calls go through ``_management`` on the same connection.

One AMQP connection carries everything: a sender link per (address, routing capability)
(``_links``), each with as many unsettled deliveries as the broker's credit allows (Artemis
grants 1,000 by default), so many transfers are in flight at once on one link; the sender
keeps order per key by never having two transfers of a key outstanding. A transactional
transfer declares its own AMQP transaction on the connection, one at a time
(``_transactions``).

The connection is opened on first use and verified before any transfer goes out: the
peer must say it is Artemis (``product`` in its open frame) and, where management may be
read, the acceptor it came in on must have ``amqpDuplicateDetection`` on. A lost
connection fails every request on it — in doubt for deliveries sent and not settled,
"not sent" for the rest — and the next request opens a new one.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from proton import (
    Condition,
    Delivery,
    Endpoint,
    Handler,
    ProtonException,
    SSLDomain,
)
from proton.handlers import (
    IOHandler,
    MessagingHandler,
    OutgoingMessageHandler,
)
from proton.reactor import Container

from ...errors import ConfigurationError, NotSentError, SendError, redact
from ._cache import Incarnation, queue_filter
from ._doorbell import Doorbell
from ._errors import (
    attach_error,
    connection_error,
    lost_error,
    outcome_name,
    peer_error,
)
from ._links import Capability, SenderLink
from ._management import (
    ManagementCall,
    ManagementChannel,
    ManagementRefused,
    flag,
    our_acceptor,
)
from ._requests import Connect, Request, Transfer
from ._transactions import Transactions

__all__ = ["ArtemisLoop"]

logger = logging.getLogger("sendonce.artemis")

ARTEMIS_PRODUCT = "apache-activemq-artemis"
_TRANSACTIONAL_STATE = 0x34
_BOTH_ACTIVE = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


class _Deadlines(Handler):
    """The timer that gives up on requests whose deadline passed (``ArtemisLoop._expire``)."""

    def __init__(self, loop: ArtemisLoop) -> None:
        self.loop = loop

    def on_timer_task(self, event: Any) -> None:
        self.loop._expire_due()


class _Stop(Handler):
    """A timer task that stops the container (closing, when the broker does not answer)."""

    def __init__(self, container: Container) -> None:
        self.container = container

    def on_timer_task(self, event: Any) -> None:
        self.container.stop()


class ArtemisLoop(MessagingHandler):
    """The event loop thread and everything it owns (see the module docstring)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        user: str | None,
        password: str | None,
        ssl_domain: SSLDomain | None,
        heartbeat: float,
        require_artemis: bool,
        check_acceptor: bool,
    ) -> None:
        super().__init__(prefetch=0, auto_accept=True, auto_settle=True)
        # Sender deliveries and credit are handled here (on_delivery, on_link_flow): one
        # handler fewer to dispatch every event of the connection to.
        children = cast("list[Any]", self.handlers)
        self.handlers = [h for h in children if not isinstance(h, OutgoingMessageHandler)]
        self.host, self.port = host, port
        self.where = f"{host}:{port}"
        self._user, self._password = user, password
        self._ssl_domain = ssl_domain
        self._heartbeat = heartbeat
        self._require_artemis = require_artemis
        self._check_acceptor = check_acceptor
        self._doorbell = Doorbell(after=self._flush)
        # This handler is the connection's, not the container's: the container's own events
        # (each select, each socket update: several per transfer) skip its handler tree.
        self._container = Container()
        self._container.selectable(cast(Any, self._doorbell))  # an EventInjector's duck
        # Connection state (loop thread only).
        self._conn: Any = None
        self._ready = False
        self._waiting: list[Request] = []  # until the connection is ready
        self._links: dict[tuple[str, str | None], SenderLink] = {}
        self._transfers: set[Transfer] = set()
        self._management: ManagementChannel | None = None  # opened with the first call
        self._verify_call: ManagementCall | None = None
        self._transactions = Transactions(self)
        self._deadlines: list[tuple[float, int, Request]] = []  # a heap; finished ones linger
        self._deadline_order = itertools.count()
        self._timer_at = math.inf  # the earliest deadline timer scheduled
        self._last_heard = time.monotonic()
        self._closing = False
        self._stop_task: Any = None
        self.acceptor: dict[str, Any] | None = None  # the acceptor's parameters, when read
        self._connections = 0
        self.incarnation: Incarnation | None = None  # the broker of the current connection
        self.uptime_call: ManagementCall | None = None  # reads the current broker's start
        self.queue_snapshots: dict[str, ManagementCall] = {}  # each address's first queues
        self.peer: dict[str, Any] = {}
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._run, name=f"sendonce-artemis-{self.where}", daemon=True
        )
        self._thread.start()

    # -- for caller threads -------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Hand ``request`` to the loop (thread-safe)."""
        self.call(lambda: self._start(request))

    def call(self, command: Callable[[], None]) -> None:
        if os.getpid() != self._pid:
            raise ConfigurationError(
                "an ArtemisBackend cannot cross a fork (its connection and event loop stay in "
                "the parent): open a new one in the child, e.g. connect(url)",
                field="backend",
            )
        if not self._thread.is_alive():
            raise ConfigurationError("the Artemis backend is closed", field="backend")
        if not self._doorbell.ring(command):
            raise ConfigurationError("the Artemis backend is closed", field="backend")

    @property
    def container(self) -> Container:
        """The proton container (loop thread only)."""
        return self._container

    @property
    def connection(self) -> Any:
        """The current AMQP connection, or None (loop thread only)."""
        return self._conn

    @property
    def alive(self) -> bool:
        """The loop thread runs and takes requests (it stops only when closed)."""
        return self._thread.is_alive() and os.getpid() == self._pid

    def abandon(self, request: Request) -> bool:
        """The caller stopped waiting: forget ``request`` (False: it had finished)."""
        if not request.abandon():
            return False
        if os.getpid() == self._pid:  # (a closed loop has forgotten it already)
            self._doorbell.ring(lambda: self._forget(request))
        return True

    def close(self, wait: float) -> None:
        if not self._thread.is_alive():
            return
        self.call(lambda: self._shut(wait))
        self._doorbell.last_call()
        self._thread.join(wait + 1.0)

    # -- the loop thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._container.run()
        except Exception:  # pragma: no cover - a bug in a callback: fail everything, loudly
            logger.exception("the Artemis event loop for %s failed", self.where)
            self._drop(
                lambda r: SendError(f"the Artemis event loop for {self.where} failed"), close=False
            )
        finally:
            self._doorbell.close()

    def _flush(self) -> None:
        """Write what the commands just queued on the connection now, as proton's IO handler
        would on the next pass (select, writable, send): one pass fewer per transfer a
        caller hands over. Whatever cannot be written now stays for that pass."""
        transport: Any = None if self._conn is None else self._conn.transport
        selectable = getattr(transport, "_selectable", None)  # proton's IO handler's socket
        if selectable is None or selectable.is_terminal:
            return
        with contextlib.suppress(OSError, ProtonException):  # its own pass meets them again
            pending = transport.pending()
            if pending > 0:
                transport.pop(selectable.send(transport.peek(pending)))
                # What the IO handler does after a write: whether to wait for writable.
                IOHandler.update(transport, selectable, self._container.now)

    def _start(self, request: Request) -> None:
        if request.abandoned:
            return
        if request.deadline is not None:
            self._watch(request, request.deadline)
        if self._closing:
            request.finish(error=ConfigurationError("the backend is closed", field="backend"))
            return
        if self._conn is None:
            self._open()
        if not self._ready:
            self._waiting.append(request)
            return
        self._dispatch(request)

    def _dispatch(self, request: Request) -> None:
        if isinstance(request, Connect):
            request.finish(None)
        elif isinstance(request, ManagementCall):
            self._manage(request)
        elif isinstance(request, Transfer):
            if request.expect is not None and (
                self.incarnation is None or self.incarnation.connection != request.expect
            ):
                request.finish(
                    error=NotSentError(
                        f"the connection to {self.where} was replaced after the resend to "
                        f"{request.entity!r} was checked; nothing was sent",
                        condition="amqp:connection:forced",
                    )
                )
                return
            self._transfers.add(request)
            if request.atomic:
                self._transactions.add(request)
            else:
                self.route(request)

    def _watch(self, request: Request, deadline: float) -> None:
        """Expire ``request`` at ``deadline`` unless it finished by then: one timer for the
        earliest deadline, however many requests are in flight."""
        heap = self._deadlines
        while heap and (heap[0][2].finished or heap[0][2].abandoned):
            heapq.heappop(heap)  # (deadlines mostly come in order: the heap stays small)
        heapq.heappush(heap, (deadline, next(self._deadline_order), request))
        if deadline < self._timer_at:
            self._timer_at = deadline
            self._container.schedule(max(deadline - time.monotonic(), 0.0), _Deadlines(self))

    def _expire_due(self) -> None:
        now = time.monotonic()
        heap = self._deadlines
        while heap and (heap[0][2].finished or heap[0][2].abandoned or heap[0][0] <= now):
            _, _, request = heapq.heappop(heap)
            if request.finished or request.abandoned:
                continue
            request.expire()  # its own outcome first: in doubt, or not sent
            self._forget(request)  # then a stuck connection is closed (the others fail)
        self._timer_at = math.inf
        if heap:
            self._timer_at = heap[0][0]
            self._container.schedule(max(heap[0][0] - now, 0.0), _Deadlines(self))

    def _open(self) -> None:
        options: dict[str, Any] = {
            "reconnect": False,
            "heartbeat": self._heartbeat,
            "ssl_domain": self._ssl_domain,
            "allow_insecure_mechs": True,
            "sasl_enabled": True,
        }
        if self._user is not None:
            # PLAIN only: never fall back to ANONYMOUS when the credentials are refused.
            options.update(user=self._user, password=self._password or "", allowed_mechs="PLAIN")
        else:
            options["allowed_mechs"] = "ANONYMOUS"
        scheme = "amqps" if self._ssl_domain is not None else "amqp"
        logger.debug("connecting to %s://%s", scheme, self.where)
        self._conn = self._container.connect(
            url=f"{scheme}://{self.where}", handler=self, **options
        )
        self._ready = False
        self._connections += 1
        self.incarnation = None

    def on_connection_opened(self, event: Any) -> None:
        if event.connection != self._conn:
            return
        self.heard()
        props = event.connection.remote_properties or {}
        self.peer = {str(k): v for k, v in props.items()}
        product = self.peer.get("product")
        if self._require_artemis and product != ARTEMIS_PRODUCT:
            self._drop(lambda r: peer_error(self.where, product), close=True)
            return
        incarnation = Incarnation(str(event.connection.remote_container), self._connections)
        self.incarnation = incarnation
        if self._check_acceptor and product == ARTEMIS_PRODUCT:
            uptime = ManagementCall("broker", "getUptimeMillis", [])
            uptime.on_answer = lambda call: _started(incarnation, call)
            self.uptime_call = uptime
            self._manage(uptime)
            call = ManagementCall("broker", "getAcceptorsAsJSON", [])
            self._verify_call = call
            self._manage(call)
            return
        self._become_ready()

    def _become_ready(self) -> None:
        self._ready = True
        waiting, self._waiting = self._waiting, []
        for request in waiting:
            if not request.abandoned:
                self._dispatch(request)

    def _verified(self, call: ManagementCall) -> None:
        """The acceptor list came back (or could not be read): check ours, then go."""
        self._verify_call = None
        if call.error is None:
            acceptor = self.acceptor = our_acceptor(call.value, self.port)
            if acceptor is not None and flag(acceptor, "amqpDuplicateDetection") is False:
                name = acceptor.get("name")
                self._drop(
                    lambda r: ConfigurationError(
                        f"the broker's acceptor {name!r} at {self.where} has "
                        "amqpDuplicateDetection=false: it ignores _AMQ_DUPL_ID, so a resend "
                        "after an in-doubt failure would be stored twice. Connect to an "
                        "acceptor with duplicate detection on (the default), or pass "
                        "require_duplicate_detection=False to accept at-least-once delivery.",
                        field="url",
                    ),
                    close=True,
                )
                return
        else:
            logger.info(
                "cannot read the acceptors of %s (%s): its amqpDuplicateDetection is not checked",
                self.where,
                call.error,
            )
        self._become_ready()

    # -- sender links and deliveries ------------------------------------------------------

    def _link_for(self, transfer: Transfer) -> SenderLink:
        key = (transfer.entity, transfer.capability)
        found = self._links.get(key)
        if found is None:
            link = self._container.create_sender(
                self._conn,
                target=transfer.entity,
                name=f"sendonce-{uuid.uuid4().hex[:12]}",
                options=Capability(transfer.capability),
            )
            found = SenderLink(link, transfer.entity, transfer.capability)
            link.sendonce_link = found
            self._links[key] = found
        return found

    def route(self, transfer: Transfer) -> None:
        sl = self._link_for(transfer)
        if not sl.attached:
            sl.waiting.append(transfer)
            return
        sl.queue.append(transfer)
        self._pump(sl)

    def on_link_opened(self, event: Any) -> None:
        self.heard()
        link = event.link
        sl: SenderLink | None = getattr(link, "sendonce_link", None) if link.is_sender else None
        if sl is None:
            if self._management is not None:
                self._management.link_opened(link)
            return
        if link.remote_target is None or link.remote_target.address is None:
            return  # a refused attach: the detach with its error follows
        sl.attached = True
        if self._check_acceptor and sl.address not in self.queue_snapshots:
            # The queues the address has now (an anycast attach creates its queue): the
            # first reading a resend check compares with (_cache).
            snapshot = ManagementCall("broker", "listQueues", [queue_filter(sl.address), 1, 1000])
            self.queue_snapshots[sl.address] = snapshot
            self._manage(snapshot)
        waiting, sl.waiting = sl.waiting, []
        sl.queue.extend(waiting)
        self._pump(sl)

    def on_link_flow(self, event: Any) -> None:
        """Credit came (what proton's ``OutgoingMessageHandler`` turns into ``on_sendable``)."""
        link = event.link
        sl = getattr(link, "sendonce_link", None)
        if sl is not None and link.state & _BOTH_ACTIVE == _BOTH_ACTIVE:
            self._pump(sl)

    def _pump(self, sl: SenderLink) -> None:
        link = sl.link
        queue = sl.queue
        while queue and link.credit > 0:
            transfer = queue[0]
            index = transfer.claim_next()
            if index is None:
                queue.popleft()
                if transfer.atomic and not transfer.abandoned and not transfer.commit_sent:
                    self._transactions.commit(transfer)
                elif transfer.sent == 0 and transfer.abandoned:
                    self._cancelled(transfer)
                continue
            if transfer.sent_on is None:
                transfer.sent_on = self.incarnation
            delivery = link.delivery(link.delivery_tag())
            link.stream(transfer.payloads[index])
            link.advance()
            if transfer.txn is not None:
                delivery.local.data = [transfer.txn.id]
                delivery.update(_TRANSACTIONAL_STATE)
            delivery.sendonce_slot = (transfer, index)
            sl.transfers.add(transfer)
        # A transaction whose last message just went out commits now, not on the next credit.
        if queue and queue[0].atomic and queue[0].sent >= len(queue[0].payloads):
            transfer = queue.popleft()
            if not transfer.abandoned and not transfer.commit_sent:
                self._transactions.commit(transfer)

    def _cancelled(self, transfer: Transfer) -> None:
        """A transfer cancelled before its first delivery: nothing sent; forget it (and end
        its transaction, so the next one can start)."""
        self._transfers.discard(transfer)
        if transfer.atomic:
            self._transactions.cancelled(transfer)

    def on_delivery(self, event: Any) -> None:
        """A sender delivery's disposition came: what proton's ``OutgoingMessageHandler``
        does (receivers are ``IncomingMessageHandler``'s), without its callbacks."""
        delivery = event.delivery
        if delivery.updated and delivery.settled and delivery.link.is_sender:
            self._settled(delivery)
            delivery.settle()

    def _settled(self, delivery: Any) -> None:
        if self._management is not None and self._management.settled(delivery):
            self.heard()
            return
        slot = getattr(delivery, "sendonce_slot", None)
        if slot is None:
            return
        self.heard()
        transfer, index = slot
        delivery.sendonce_slot = None
        transfer.settled += 1
        state = delivery.remote_state
        if state == _TRANSACTIONAL_STATE:
            return  # the commit's outcome decides
        if transfer.outcomes[index] is None:
            condition = delivery.remote.condition if state == Delivery.REJECTED else None
            transfer.outcomes[index] = (
                outcome_name(state),
                None if condition is None else str(condition.name),
                None if condition is None else condition.description,
            )
        if transfer.settled >= len(transfer.payloads) and not transfer.atomic:
            self._complete(transfer)

    def untrack(self, transfer: Transfer) -> None:
        """``transfer`` has its outcome (or was forgotten): the connection no longer holds it."""
        self._transfers.discard(transfer)
        for sl in self._links.values():
            sl.transfers.discard(transfer)

    def _complete(self, transfer: Transfer) -> None:
        """Every delivery of a plain transfer is settled: its acks, or its first refusal."""
        self.untrack(transfer)
        transfer.conclude()

    # -- management -------------------------------------------------------------------------

    def _manage(self, call: ManagementCall) -> None:
        if self._management is None:
            self._management = ManagementChannel(self._container, self._conn, self._answered)
        self._management.ask(call)

    def _answered(self, call: ManagementCall) -> None:
        if call is self._verify_call:
            self._verified(call)

    def on_message(self, event: Any) -> None:
        self.heard()
        if self._management is not None:
            self._management.message(event.link, event.message)

    # -- failures -------------------------------------------------------------------------

    def heard(self) -> None:
        self._last_heard = time.monotonic()

    def on_link_error(self, event: Any) -> None:
        self._link_gone(event.link, event.link.remote_condition)

    def on_link_closed(self, event: Any) -> None:
        self._link_gone(event.link, event.link.remote_condition)

    def _link_gone(self, link: Any, condition: Condition | None) -> None:
        if self._management is not None and self._management.owns(link):
            said = "the management link closed" if condition is None else str(condition)
            self._management.fail(said)
            return
        sl: SenderLink | None = getattr(link, "sendonce_link", None)
        if sl is None or self._links.get((sl.address, sl.capability)) is not sl:
            return
        del self._links[(sl.address, sl.capability)]
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()
        name = None if condition is None else str(condition.name)
        description = None if condition is None else condition.description
        affected = set(sl.waiting) | set(sl.queue) | sl.transfers
        for transfer in affected:
            if transfer.in_doubt:
                error: BaseException = lost_error(
                    f"the sender link was detached ({name})",
                    entity=transfer.entity,
                    host=self.where,
                    in_doubt=True,
                    count=transfer.sent - transfer.settled,
                )
            else:
                error = attach_error(name, description, entity=sl.address, host=self.where)
            self._end(transfer, error)

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        self._connection_lost(condition)

    def on_connection_error(self, event: Any) -> None:
        self._connection_lost(event.connection.remote_condition)

    def on_disconnected(self, event: Any) -> None:
        if event.connection == self._conn:
            transport = event.transport
            self._connection_lost(None if transport is None else transport.condition)

    def on_connection_closed(self, event: Any) -> None:
        if event.connection == self._conn and not self._closing:
            self._connection_lost(event.connection.remote_condition)

    def _connection_lost(self, condition: Condition | None) -> None:
        if self._conn is None:
            return
        name = None if condition is None else str(condition.name)
        description = None if condition is None else condition.description
        was_ready = self._ready
        if name is not None:
            logger.info(
                "the connection to %s ended: %s", self.where, redact(f"{name} {description}")
            )

        def error_for(request: Request) -> BaseException:
            if not was_ready or not isinstance(request, Transfer):
                if isinstance(request, ManagementCall) and was_ready:
                    return ManagementRefused(f"the connection to {self.where} was lost")
                return connection_error(name, description, host=self.where)
            return lost_error(
                f"the connection was lost ({name or 'closed'})",
                entity=request.entity,
                host=self.where,
                in_doubt=request.in_doubt,
                count=request.sent - request.settled,
            )

        self._drop(error_for, close=True)

    def _drop(self, error_for: Callable[[Request], BaseException], *, close: bool) -> None:
        """Fail every request of the current connection and forget it."""
        conn, self._conn = self._conn, None
        self._ready = False
        requests: list[Request] = list(self._waiting) + list(self._transfers)
        if self._management is not None:
            requests += self._management.pending()
        for sl in self._links.values():
            requests += sl.waiting + list(sl.queue) + list(sl.transfers)
        requests += self._transactions.drain()
        self._waiting = []
        self._links.clear()
        self._transfers.clear()
        self._management = None
        self._verify_call = None
        seen: set[int] = set()
        for request in requests:
            if id(request) in seen:
                continue
            seen.add(id(request))
            request.finish(error=error_for(request))
        if close and conn is not None and not conn.state & Endpoint.LOCAL_CLOSED:
            conn.close()

    def _end(self, transfer: Transfer, error: BaseException) -> None:
        self.untrack(transfer)
        for sl in self._links.values():
            if transfer in sl.queue:
                sl.queue.remove(transfer)
        transfer.finish(error=error)

    def _forget(self, request: Request) -> None:
        """A caller gave up on ``request``. If nothing was heard from the broker since it
        started, the connection is presumed stuck: it is closed, so the next call opens a
        new one (requests still on it fail, in doubt where something was sent)."""
        if isinstance(request, Transfer):
            self._transfers.discard(request)
            for sl in self._links.values():
                if request in sl.queue:
                    sl.queue.remove(request)
        if isinstance(request, ManagementCall) and self._management is not None:
            self._management.forget(request)
        if self._conn is not None and (not self._ready or self._last_heard < request.started):
            logger.info(
                "nothing heard from %s for %.1f s: closing the connection; the next call "
                "opens a new one",
                self.where,
                time.monotonic() - self._last_heard,
            )
            self._connection_lost(
                Condition("amqp:resource-limit-exceeded", "the broker stopped answering")
            )

    def _shut(self, wait: float) -> None:
        self._closing = True
        connected = self._conn is not None
        self._drop(
            lambda r: ConfigurationError("the backend was closed", field="backend"), close=True
        )
        if connected:  # stop once the broker answered our close, or after ``wait``
            self._stop_task = self._container.schedule(max(wait, 0.0), _Stop(self._container))
        else:
            self._container.stop()

    def on_transport_closed(self, event: Any) -> None:
        # Stop the container now: left alone it would idle in select for up to 3 s more.
        if self._closing:
            self._container.stop()


def _started(incarnation: Incarnation, call: ManagementCall) -> None:
    """The broker's uptime came back: when (on this process's clock) it was started."""
    uptime, asked = call.value, call.asked
    if call.error is None and isinstance(uptime, int) and asked is not None:
        seconds = uptime / 1000.0
        incarnation.started = (asked - seconds, time.monotonic() - seconds)
