"""One AMQP connection per Service Bus namespace and credential per process, lanes as links.

Beneath the client, on azure-servicebus's vendored pyamqp layer (``azure.servicebus._pyamqp``,
pinned to the tested versions by ``_sharing``): the client's own sharing path is broken
(docs/servicebus.md, Connections). A ``SharedConnection`` lives on the process's connection
loop (``_loop``) and holds:

- one pyamqp connection at a time (a *generation*); the next use after a loss reconnects,
  once for every lane;
- one ``$cbs`` token link (``_cbs.TokenLink``) that authorises each entity's audience;
- one reader task that reads every frame, so no lane ever reads the socket itself. A write
  does not wait behind that read: the transport's writes get their own lock (reads and
  writes of an asyncio stream are independent), which is what stalled 16 handlers sharing
  one connection in the earlier prototype;
- the transfers in flight: when the connection is lost each one ends on its own, in doubt
  if any byte of it may have been written, *never written* (nothing stored) otherwise.

Links open one at a time (``_open_lock``). The registry hands one ``SharedConnection`` per
key to every backend of the process and closes it with its last user.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from azure.servicebus._pyamqp.aio import Connection
from azure.servicebus._pyamqp.aio._sasl_async import SASLAnonymousCredential
from azure.servicebus._pyamqp.constants import (
    SEND_DISPOSITION_ACCEPT,
    SEND_DISPOSITION_REJECT,
    ConnectionState,
    LinkDeliverySettleReason,
    LinkState,
    ReceiverSettleMode,
    SenderSettleMode,
)
from azure.servicebus._pyamqp.error import (
    AMQPConnectionError,
    AMQPLinkError,
    ErrorCondition,
    MessageException,
)
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusConnectionError

from ._cbs import TokenLink

__all__ = [
    "ConnectionKey",
    "NotWritten",
    "SharedConnection",
    "acquire",
    "connection_key",
    "release",
]

logger = logging.getLogger("sendonce.servicebus")

_WINDOW = 64 * 1024  # the client's session windows
_KEEP_ALIVE_CHECK = 5.0
"""How often the keep-alive task asks pyamqp whether an empty frame is due (the peer's idle
timeout): the reader blocks on the socket until the next frame, so it cannot."""
_CLOSED_STATES = (
    ConnectionState.END,
    ConnectionState.CLOSE_RCVD,
    ConnectionState.CLOSE_SENT,
    ConnectionState.DISCARDING,
)
_SALT = os.urandom(16)  # a credential's identity in a key: a digest no log can reverse


class NotWritten(Exception):
    """The transfer never reached the wire: nothing can have been stored (``error`` says why)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True, slots=True)
class ConnectionKey:
    """Which connection a backend may share: the endpoint and the credential's identity.

    ``identity`` is a salted digest of a key or signature, or the credential object's id:
    never the secret, so the key can be logged and repr'd.
    """

    host: str
    use_tls: bool
    custom_endpoint: str | None
    identity: str = field(repr=False)


def connection_key(client: Any) -> ConnectionKey:
    """The key of ``client``'s namespace and credential (a ``ServiceBusClient``)."""
    credential = client._credential
    secret = (
        getattr(credential, "key", None)
        or getattr(credential, "token", None)
        or getattr(getattr(credential, "_credential", None), "signature", None)
    )
    policy = getattr(credential, "policy", "")
    if isinstance(secret, str | bytes) and secret:
        raw = secret.encode() if isinstance(secret, str) else secret
        identity = hmac.new(_SALT, f"{policy}\0".encode() + raw, hashlib.sha256).hexdigest()[:24]
    else:  # a token credential: the same object shares, another one does not
        identity = f"{type(credential).__name__}@{id(credential):x}"
    config = client._config
    return ConnectionKey(
        host=client.fully_qualified_namespace,
        use_tls=bool(getattr(config, "use_tls", True)),
        custom_endpoint=getattr(config, "custom_endpoint_address", None),
        identity=identity,
    )


@dataclass(eq=False, slots=True)
class _Transfer:
    delivery: Any
    outcome: asyncio.Future[tuple[Any, Any]]


class SharedConnection:
    """One namespace's connection for every lane of the process (state lives on the loop)."""

    def __init__(self, key: ConnectionKey, config: Any, properties: Any, timeout: float) -> None:
        self.key = key
        self.users = 0  # the registry's count, under its lock
        self.generation = 0
        self._config = config
        self._properties = properties
        self._timeout = timeout
        self._conn: Any = None
        self._tokens: TokenLink | None = None
        self._reader: asyncio.Task[None] | None = None
        self._open_lock: asyncio.Lock | None = None
        self._inflight: set[_Transfer] = set()
        self._links: set[Any] = set()
        self.connects = 0

    def __repr__(self) -> str:
        return (
            f"SharedConnection(host={self.key.host!r}, users={self.users}, "
            f"generation={self.generation}, links={len(self._links)})"
        )

    # -- the connection ---------------------------------------------------------------

    def _alive(self) -> bool:
        conn = self._conn
        return conn is not None and conn._error is None and conn.state not in _CLOSED_STATES

    async def _connect(self, deadline: float) -> None:
        config = self._config
        ssl_opts: dict[str, Any] = {}
        if config.ssl_context:
            ssl_opts["context"] = config.ssl_context
        else:
            import certifi

            ssl_opts["ca_certs"] = config.connection_verify or certifi.where()
        scheme = "amqps://" if config.use_tls else "amqp://"
        conn = Connection(
            scheme + config.hostname,
            sasl_credential=SASLAnonymousCredential(),
            ssl_opts=ssl_opts,
            container_id=f"sendonce-{os.getpid()}-{self.generation + 1}",
            idle_timeout=None,
            properties=self._properties,
            network_trace=False,
            transport_type=config.transport_type,
            http_proxy=config.http_proxy,
            custom_endpoint_address=config.custom_endpoint_address,
            socket_timeout=config.socket_timeout,
            use_tls=config.use_tls,
        )
        self.generation += 1
        self.connects += 1
        self._conn = conn
        try:
            await asyncio.wait_for(conn.open(), max(deadline - time.monotonic(), 0.001))
            _separate_writes(conn._transport)
            generation = self.generation
            self._reader = asyncio.ensure_future(self._read(conn, generation))
            while conn.state != ConnectionState.OPENED:
                if not self._alive():
                    raise conn._error or AMQPConnectionError(
                        ErrorCondition.SocketError,
                        description="the connection closed while opening",
                    )
                if time.monotonic() >= deadline:
                    raise TimeoutError("opening the connection timed out")
                await asyncio.sleep(0.002)
            tokens = TokenLink(conn, timeout=self._timeout)
            await tokens.open(deadline)
            self._tokens = tokens
        except BaseException:
            await self._drop(conn)
            raise
        logger.info(
            "opened the shared connection to %s (generation %d)", self.key.host, self.generation
        )

    async def _read(self, conn: Any, generation: int) -> None:
        """Read and dispatch every frame of ``conn`` until it ends; then fan the loss out."""
        error: BaseException | None = None
        keep_alive = asyncio.ensure_future(_keep_alive(conn))
        try:
            while True:
                # Without a timeout: pyamqp would wrap each read in a task of its own.
                await conn.listen(wait=True)
                if conn._error is not None or conn.state in _CLOSED_STATES:
                    error = conn._error
                    break
        except asyncio.CancelledError:
            return
        except Exception as exc:
            error = exc
        finally:
            keep_alive.cancel()
        self._lost(conn, generation, error)

    def _lost(self, conn: Any, generation: int, error: BaseException | None) -> None:
        """``conn`` is gone: every transfer in flight on it ends now, each by its own rule."""
        if generation != self.generation or self._conn is not conn:
            return
        logger.warning(
            "the shared connection to %s was lost (%s); %d transfer(s) in flight end now, "
            "the next use reconnects",
            self.key.host,
            type(error).__name__ if error is not None else "closed",
            len(self._inflight),
        )
        if self._tokens is not None:
            self._tokens.stop()
        self._conn = None
        self._links.clear()
        for transfer in list(self._inflight):
            if not transfer.outcome.done():
                transfer.outcome.set_result(("lost", error))
        _close_transport(conn)

    async def _drop(self, conn: Any) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._tokens is not None:
            self._tokens.stop()
            self._tokens = None
        if self._conn is conn:
            self._conn = None
        _close_transport(conn)

    # -- links ------------------------------------------------------------------------

    async def open_link(self, target: str, auth: Any, timeout: float) -> tuple[Any, int]:
        """Attach a sender link to ``target`` (its own session); ``(link, generation)``.

        One at a time: connecting, authorising the audience and attaching are serialised.
        """
        deadline = time.monotonic() + timeout
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if not self._alive():
                await self._connect(deadline)
            assert self._tokens is not None
            await self._tokens.authorize(auth.audience, auth, deadline)
            changed = asyncio.Event()

            async def on_state(_previous: Any, _new: Any) -> None:
                changed.set()

            session = self._conn.create_session(incoming_window=_WINDOW, outgoing_window=_WINDOW)
            await session.begin()
            link = session.create_sender_link(
                target_address=target,
                send_settle_mode=SenderSettleMode.Unsettled,
                rcv_settle_mode=ReceiverSettleMode.First,
                on_link_state_change=on_state,
                properties=None,
            )
            await link.attach()
            while link.state != LinkState.ATTACHED:
                if link.state in (LinkState.DETACHED, LinkState.ERROR, LinkState.DETACH_RCVD):
                    error = link._error or AMQPLinkError(
                        condition=ErrorCondition.LinkDetachForced, description="link refused"
                    )
                    await _end(session)
                    raise error
                if not self._alive():
                    raise self._conn_error()
                left = deadline - time.monotonic()
                if left <= 0:
                    await _end(session)
                    raise TimeoutError("attaching the link timed out")
                changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, 0.05))
            self._links.add(link)
            return link, self.generation

    def link_alive(self, link: Any, generation: int) -> bool:
        """Whether ``link`` is attached on the current connection."""
        return (
            generation == self.generation
            and self._alive()
            and link in self._links
            and link.state == LinkState.ATTACHED
        )

    def _conn_error(self) -> BaseException:
        error = self._conn._error if self._conn is not None else None
        return error or AMQPConnectionError(
            ErrorCondition.SocketError, description="the shared connection was lost"
        )

    async def close_link(self, link: Any) -> None:
        """Detach ``link`` and end its session (best effort: a dead one is just dropped)."""
        self._links.discard(link)
        if link._session._connection is self._conn and self._alive():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_end(link._session), 2.0)

    # -- transfers --------------------------------------------------------------------

    async def transfer(self, link: Any, generation: int, message: Any, timeout: float) -> None:
        """Send one message (or batch message) on ``link`` and wait for its disposition.

        Raises the client's own exception for the outcome (mapped by ``_errors`` as any
        client failure is), or ``NotWritten`` when no byte of it can have left.
        """
        if not self.link_alive(link, generation):
            raise NotWritten(ServiceBusConnectionError(message="the link is no longer attached"))
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[tuple[Any, Any]] = loop.create_future()

        async def settled(reason: Any, state: Any) -> None:
            if not outcome.done():
                outcome.set_result((reason, state))

        delivery = await link.send_transfer(message, on_send_complete=settled, timeout=None)
        transfer = _Transfer(delivery, outcome)
        self._inflight.add(transfer)
        timer = loop.call_later(timeout, _expire, outcome)  # cheaper than wait_for's task
        try:
            reason, state = await outcome
        except asyncio.CancelledError:
            _forget(link, delivery)
            raise
        finally:
            timer.cancel()
            self._inflight.discard(transfer)
        if reason == _EXPIRED:
            _forget(link, delivery)
            if not delivery.sent:
                raise NotWritten(
                    OperationTimeoutError(message="the link had no credit for the transfer")
                )
            raise OperationTimeoutError(message="Send operation timed out")
        _raise_for(reason, state, delivery, link)

    # -- lifecycle --------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Close the connection (its last user left): Close sent, the peer's answered."""
        conn = self._conn
        if conn is None:
            return
        if self._tokens is not None:
            await self._tokens.close()
            self._tokens = None
        self._conn = None  # the reader sees the end as a close of its own, not a loss
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 2.0)
            deadline = time.monotonic() + 2.0
            while conn.state != ConnectionState.END and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        _close_transport(conn)
        logger.info("closed the shared connection to %s", self.key.host)


def _raise_for(reason: Any, state: Any, delivery: Any, link: Any) -> None:
    """The outcome of one transfer, as the client reports it."""
    if reason == LinkDeliverySettleReason.DISPOSITION_RECEIVED:
        if state and SEND_DISPOSITION_ACCEPT in state:
            return
        if state and SEND_DISPOSITION_REJECT in state:
            condition, description, info = (list(state[SEND_DISPOSITION_REJECT][0]) + [None] * 3)[
                :3
            ]
            raise _client_error(MessageException(condition, description=description, info=info))
        if state and ("modified" in state or "released" in state):
            raise NotWritten(
                ServiceBusConnectionError(message=f"the broker released it ({state!r})")
            )
        raise _client_error(MessageException(ErrorCondition.UnknownError, description=repr(state)))
    if reason == LinkDeliverySettleReason.SETTLED:
        return
    # Lost with its link or connection (NOT_DELIVERED, "lost"): in doubt once written.
    cause = state if isinstance(state, BaseException) else link._error
    error = (
        _client_error(cause)
        if isinstance(cause, AMQPLinkError | AMQPConnectionError)
        else ServiceBusConnectionError(message="the shared connection was lost", error=cause)
    )
    if not delivery.sent:
        raise NotWritten(error)
    raise error


def _client_error(exc: Exception) -> BaseException:
    return PyamqpTransport.create_servicebus_exception(logger, exc)


_EXPIRED = "expired"


def _expire(outcome: asyncio.Future[tuple[Any, Any]]) -> None:
    if not outcome.done():
        outcome.set_result((_EXPIRED, None))


async def _keep_alive(conn: Any) -> None:
    """Send the empty frames the peer's idle timeout asks for, while the reader waits."""
    while True:
        # Half the peer's idle timeout, known once its Open frame is read (or None: none).
        due = conn._remote_idle_timeout_send_frame
        opened = conn.state == ConnectionState.OPENED
        await asyncio.sleep(
            min(_KEEP_ALIVE_CHECK, due / 2) if due else _KEEP_ALIVE_CHECK if opened else 0.05
        )
        if conn._error is not None or conn.state in _CLOSED_STATES:
            return
        with contextlib.suppress(Exception):
            await conn._get_remote_timeout(time.time())


def _forget(link: Any, delivery: Any) -> None:
    with contextlib.suppress(ValueError):
        link._pending_deliveries.remove(delivery)


def _separate_writes(transport: Any) -> None:
    """Let writes pass a read in progress: the reader task holds ``socket_lock`` while it
    waits for the next frame, and a transfer must not wait behind it."""
    write_lock = asyncio.Lock()
    write_raw = transport._write

    async def write(data: Any) -> None:
        async with write_lock:
            try:
                await write_raw(data)
            except OSError:
                transport.connected = False
                raise

    transport.write = write


async def _end(session: Any) -> None:
    """Detach the session's links, then end it (pyamqp's ``end`` detaches after the End
    frame, on a channel the peer has already let go)."""
    with contextlib.suppress(Exception):
        for link in list(session.links.values()):
            await link.detach(close=True)
        await session.end()


def _close_transport(conn: Any) -> None:
    """Close the socket under ``conn`` now (the writer's close needs no await)."""
    transport = getattr(conn, "_transport", None)
    writer = getattr(transport, "writer", None)
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.close()
    with contextlib.suppress(Exception):
        conn.state = ConnectionState.END


# -- the registry ---------------------------------------------------------------------

_registry: dict[ConnectionKey, SharedConnection] = {}
_registry_lock = threading.Lock()
_registry_pid = os.getpid()


def acquire(client: Any, timeout: float) -> SharedConnection:
    """The process's shared connection for ``client``'s namespace and credential, counted."""
    from azure.servicebus._common.utils import create_properties

    global _registry_pid
    key = connection_key(client)
    with _registry_lock:
        if _registry_pid != os.getpid():  # a forked child: the parent's connections are not its
            _registry.clear()
            _registry_pid = os.getpid()
        shared = _registry.get(key)
        if shared is None:
            properties = create_properties(
                client._config.user_agent,
                amqp_transport=PyamqpTransport,  # type: ignore[arg-type]
            )
            shared = _registry[key] = SharedConnection(key, client._config, properties, timeout)
        shared.users += 1
        return shared


def release(shared: SharedConnection) -> bool:
    """One user less; ``True`` when it was the last (the caller closes it on the loop)."""
    with _registry_lock:
        shared.users -= 1
        if shared.users > 0:
            return False
        if _registry.get(shared.key) is shared:
            del _registry[shared.key]
        return True


def registered() -> list[SharedConnection]:
    """The shared connections of the process (for tests and diagnostics)."""
    with _registry_lock:
        return list(_registry.values())
