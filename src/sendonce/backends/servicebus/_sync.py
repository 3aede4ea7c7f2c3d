"""``AzureServiceBusBackend``: queues and topics through the real azure-servicebus client.

The client is configured so that sendonce owns the retry budget: its own retries
are off (``retry_total=0``) and every send and schedule passes a timeout. Each
``send`` is exactly one transfer (one ``ServiceBusMessageBatch``), because the
sender decides the transfer boundaries by the partition-key and size rules.

Concurrency: a ``ServiceBusSender`` carries one transfer at a time and is not
thread-safe, so the backend keeps up to ``max_in_flight`` senders per entity
(lanes, see ``_lanes``) and lends each to one thread at a time. Up to
``max_in_flight`` threads may call ``send`` / ``schedule`` at once. A send's lane is a link
on the process's one connection to the namespace (``_connection``, ``_link``); a schedule's
lane, and every lane with ``connection_sharing=False``, is a client sender with its own
AMQP connection (the client shares none between senders).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusSender

from ... import _telemetry
from ..._entity import EntityProfile
from ..._message import Message
from ..._names import ByName
from ...errors import (
    ConfigurationError,
    SendError,
    TransientSendError,
    ValidationError,
    redact,
)
from .._base import Ack, Backend
from . import _loop
from . import _shared as shared
from ._connection import NotWritten, SharedConnection, acquire, release
from ._convert import to_servicebus_message
from ._errors import is_connection_level, is_sdk_error, map_error
from ._lanes import Lane, Lanes
from ._link import SharedLink
from ._sharing import sharing_enabled

__all__ = ["AzureServiceBusBackend"]

logger = logging.getLogger("sendonce.servicebus")

_CLOSE_BOUND = 10.0


class AzureServiceBusBackend(shared.ServiceBusShared, Backend):
    """A backend that sends to Azure Service Bus (or its emulator).

    Build it from a connection string (:meth:`from_connection_string`, or
    ``connection_string=``), from ``fully_qualified_namespace`` and a
    ``credential`` (an azure-identity credential; ``DefaultAzureCredential``
    when omitted), or from a ready ``client`` whose retries are off.

    ``profiles`` maps entity names to explicit :class:`EntityProfile` values;
    they win over the administration API, and are required where it cannot be
    read (the emulator, a send-only key). ``kinds`` maps entity names to
    ``"queue"`` or ``"topic"`` when no profile says which.
    """

    _client: ServiceBusClient
    _client_class = ServiceBusClient
    _native_submit = False

    @staticmethod
    def _default_credential() -> Any:
        return _default_sync_credential()

    def _start(self) -> None:
        # Sends use the shared connection's links when sharing is on; schedules (and every
        # call when it is off) use lanes of their own connection each.
        self._lanes: ByName[Lanes[Any]] = ByName()  # any spelling
        self._own_lanes: ByName[Lanes[Any]] = ByName()
        self._lock = threading.RLock()
        self._connection: SharedConnection | None = None

    def _sharing_wanted(self, option: bool | None) -> bool:
        return sharing_enabled(option, self._client)

    @property
    def connection_sharing(self) -> bool:
        """Whether sends go as links on the process's one connection to the namespace."""
        return self._sharing

    def _shared_connection(self) -> SharedConnection:
        with self._lock:
            if self._connection is None:
                self._connection = acquire(self._client, self._link_timeout)
            return self._connection

    # -- entities ---------------------------------------------------------------------

    def describe(self, entity: str) -> EntityProfile:
        """The profile of ``entity``: an explicit profile, else the administration API.

        Raises ``ConfigurationError`` when the properties cannot be read (the
        emulator, or a credential without Manage rights): pass ``profiles=``.
        """
        entity = shared.check_entity(entity)
        with self._lock:
            known = self._profiles.get(entity)
            if known is not None:
                return known
            admin = self._admin_client(entity)
            profile = self._read_profile(admin, entity)
            self._profiles[entity] = profile
            self._kinds[entity] = profile.kind
            logger.debug("described %s as %r", entity, profile)
            return profile

    def declare(self, profile: EntityProfile) -> None:
        """Record an explicit profile (``IdempotentSender`` calls this): it says queue or topic."""
        if not isinstance(profile, EntityProfile):
            raise ConfigurationError("declare() takes an EntityProfile", field="profile")
        with self._lock:
            self._profiles[profile.name] = profile
            opened_as = self._kinds.get(profile.name, "queue")
            opened = profile.name in self._lanes or profile.name in self._own_lanes
            if opened and opened_as != profile.kind:
                self._retire_lanes(profile.name, "the entity kind changed")
            self._kinds[profile.name] = profile.kind

    def _admin_client(self, entity: str) -> Any:
        if self._admin is None and self._emulator:
            raise shared.needs_profile(entity, "the development emulator has no administration API")
        from azure.servicebus.management import ServiceBusAdministrationClient

        return self._build_admin(ServiceBusAdministrationClient, entity)

    def _read_profile(self, admin: Any, entity: str) -> EntityProfile:
        missing = 0
        for kind in shared.lookup_order(self._kinds, entity):
            getter = admin.get_queue if kind == "queue" else admin.get_topic
            try:
                props = getter(entity, **shared.admin_bounds(self._admin_timeout))
            except Exception as exc:
                missing += shared.skipped_kind(exc, entity)
                continue
            return shared.profile_from_properties(entity, kind, props)
        raise self._no_such_entity(entity, missing)

    # -- sending ----------------------------------------------------------------------

    def _entity_lanes(self, entity: str, on_shared: bool) -> Lanes[Any]:
        with self._lock:
            self._check_open(entity)
            table = self._lanes if on_shared else self._own_lanes
            lanes = table.get(entity)
            if lanes is None:
                lanes = table[entity] = Lanes(self.capabilities.max_in_flight)
            return lanes

    def _take_lane(
        self, entity: str, timeout: float, messages: list[Message], on_shared: bool = False
    ) -> tuple[Lanes[Any], Lane[Any], float]:
        """A lane for one transfer and the time left of ``timeout`` once it is free."""
        started = time.monotonic()
        lanes = self._entity_lanes(entity, on_shared)
        lane, got = lanes.take_now()
        if not got:  # every link busy: wait for one
            lane, got = lanes.take(timeout)
            _telemetry.lane_wait("link", entity, time.monotonic() - started)
        if not got:
            raise shared.no_free_link(lanes.size, entity, timeout, messages)
        if lane is None:
            try:
                with self._lock:  # the client keeps a set of its handlers
                    if self._kinds.get(entity) == "topic":
                        sender = self._client.get_topic_sender(topic_name=entity)
                    else:
                        sender = self._client.get_queue_sender(queue_name=entity)
                link: Any = SharedLink(self._shared_connection(), sender) if on_shared else sender
            except BaseException:
                lanes.cancel()
                raise
            logger.debug("opened a sender for %s (%d lanes at most)", entity, lanes.size)
            lane = Lane(link)
        return lanes, lane, timeout - (time.monotonic() - started)

    def _give_back(
        self,
        entity: str,
        lanes: Lanes[Any],
        lane: Lane[Any],
        reason: str | None,
    ) -> None:
        """Return ``lane``; ``reason`` (a failure) closes its sender: the next call opens a new
        link, and the other lanes carry on."""
        if lanes.give_back(lane, keep=reason is None):
            if reason is not None:
                logger.info(
                    "closing a sender for %s (%s); the next call opens a new link", entity, reason
                )
            _close_quietly(lane.sender, entity)

    def _open_link(
        self,
        entity: str,
        lane: Lane[Any],
        timeout: float,
        messages: list[Message],
    ) -> float:
        """Open the lane's link within ``timeout``; return the time left for the transfer.

        The client bounds a send on an open link by its ``timeout``, but not every
        phase of opening one: its SASL negotiation blocks on the socket with no
        timeout, so a peer that accepts TCP and then stays silent would hang the
        call for ever. The link is therefore opened on a helper thread that the
        call stops waiting for at its timeout; the abandoned sender is dropped and
        its socket shut so that thread ends too. Nothing is sent while opening.
        """
        if isinstance(lane.sender, SharedLink):
            return self._open_shared(entity, lane.sender, timeout, messages)
        if lane.opened:
            return timeout
        if timeout <= shared.MIN_TRANSFER_TIME:
            raise shared.no_time_left("waiting for a free link", entity, timeout, messages)
        sender = lane.sender
        started = time.monotonic()
        done = threading.Event()
        abandoned = threading.Event()
        outcome: list[BaseException] = []

        def open_link() -> None:
            try:
                sender.create_message_batch()  # opens connection, SASL, CBS and the link
            except BaseException as exc:
                outcome.append(exc)
            finally:
                done.set()
                if abandoned.is_set():
                    _close_quietly(sender, entity)

        worker = threading.Thread(
            target=open_link, name=f"sendonce-servicebus-open-{entity}", daemon=True
        )
        worker.start()
        if not done.wait(timeout):
            abandoned.set()
            lane.abandoned = True
            if done.is_set():  # it finished just now: the worker may not have seen the flag
                _close_quietly(sender, entity)
            else:
                _shut_socket(sender)
            logger.warning(
                "opening a link to %s took longer than %gs; the sender is abandoned",
                entity,
                timeout,
            )
            raise shared.link_too_slow(entity, self._namespace, timeout, messages)
        if outcome:
            raise outcome[0]
        lane.opened = True
        left = timeout - (time.monotonic() - started)
        if left <= shared.MIN_TRANSFER_TIME:
            raise shared.no_time_left("opening a link", entity, timeout, messages)
        return left

    @staticmethod
    def _open_shared(
        entity: str, link: SharedLink, timeout: float, messages: list[Message]
    ) -> float:
        """Attach a shared-connection lane (bounded on the loop: no helper thread)."""
        if link.opened:
            return timeout
        if timeout <= shared.MIN_TRANSFER_TIME:
            raise shared.no_time_left("waiting for a free link", entity, timeout, messages)
        started = time.monotonic()
        link.open(timeout)
        left = timeout - (time.monotonic() - started)
        if left <= shared.MIN_TRANSFER_TIME:
            raise shared.no_time_left("opening a link", entity, timeout, messages)
        return left

    def _open_mapped(
        self,
        entity: str,
        lane: Lane[Any],
        timeout: float,
        messages: list[Message],
        *,
        operation: str,
    ) -> float:
        """:meth:`_open_link`, with its failures mapped: nothing is sent while opening."""
        try:
            return self._open_link(entity, lane, timeout, messages)
        except (ValidationError, TransientSendError):
            raise
        except Exception as exc:
            if not is_sdk_error(exc):
                raise
            raise self._fail(
                exc, operation=operation, entity=entity, messages=messages, reached=False
            ) from None

    def _retire_lanes(self, entity: str, reason: str) -> None:
        """Stop using ``entity``'s lanes: idle ones close now, busy ones when given back."""
        for table in (self._lanes, self._own_lanes):
            lanes = table.pop(entity, None)
            if lanes is None:
                continue
            logger.info("closing the senders for %s (%s)", entity, reason)
            _close_together([(entity, lane.sender) for lane in lanes.close(0.0)], _CLOSE_BOUND)

    @staticmethod
    def _failure_reason(exc: BaseException) -> str:
        # After any failure the client may have shut the handler; reopening it inside
        # send_messages would not be bounded (see _open_link), so the lane's sender is
        # closed and the next transfer on it starts from a new one.
        return "connection-level error" if is_connection_level(exc) else "failed call"

    def _fail(
        self,
        exc: BaseException,
        *,
        operation: str,
        entity: str,
        messages: Sequence[Message],
        reached: bool = True,
    ) -> SendError:
        return map_error(
            exc,
            operation=operation,
            entity=entity,
            count=len(messages),
            reached=reached,
            **shared.ids(messages),
        )

    def _on_lane(
        self,
        operation: str,
        entity: str,
        messages: list[Message],
        timeout: float,
        transfer: Callable[[Any, float], Any],
        *,
        shared_ok: bool = True,
    ) -> Any:
        """Run ``transfer(sender, time_left)`` on a free lane, its link opened, under the
        error map; a failure closes the lane's sender, a refusal before sending keeps it."""
        lanes, lane, left = self._take_lane(entity, timeout, messages, self._sharing and shared_ok)
        failed: str | None = "interrupted"
        try:
            left = self._open_mapped(entity, lane, left, messages, operation=operation)
            result = transfer(lane.sender, left)
            failed = None
        except (ValidationError, TransientSendError) as exc:
            if isinstance(exc, ValidationError):
                failed = None  # refused before anything was sent: the link is fine
            raise
        except NotWritten as exc:  # the shared connection never wrote it: nothing stored
            failed = self._failure_reason(exc.error)
            raise self._fail(
                exc.error, operation=operation, entity=entity, messages=messages, reached=False
            ) from None
        except Exception as exc:
            if not is_sdk_error(exc):
                raise
            failed = self._failure_reason(exc)
            raise self._fail(exc, operation=operation, entity=entity, messages=messages) from None
        finally:
            self._give_back(entity, lanes, lane, failed)
        return result

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Send ``messages`` to a queue or topic as one transfer (one message batch).

        Raises ``MessageSizeError`` (nothing sent) if they do not fit in one
        batch on the link. Service Bus does not tell the sender about duplicates,
        so every ack is ``"accepted"``.
        """
        entity, timeout, messages = self._send_checks(entity, messages, timeout, atomic)
        if not messages:
            return []
        converted = [to_servicebus_message(m) for m in messages]

        def transfer(sender: Any, left: float) -> None:
            # One message goes as itself: wrapping it in a batch encodes it twice.
            payload: Any = (
                converted[0]
                if len(converted) == 1
                else self._batch(sender, entity, messages, converted)
            )
            sender.send_messages(payload, timeout=left)

        self._on_lane("send", entity, messages, timeout, transfer)
        logger.debug("sent %d message(s) to %s", len(messages), entity)
        return [Ack("accepted") for _ in messages]

    def _batch(
        self, sender: Any, entity: str, messages: list[Message], converted: list[Any]
    ) -> Any:
        batch = sender.create_message_batch(**self._batch_size())
        return shared.fill_batch(batch, entity, messages, converted)

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Schedule ``messages`` for ``at``; the acks carry the sequence numbers.

        A retried schedule can return the sequence number of a copy the service
        dropped as a duplicate (Azure/azure-service-bus #265, #266): such a number
        cannot be used to cancel the message that was kept.
        """
        entity, timeout, messages = self._schedule_checks(entity, messages, at, timeout)
        if not messages:
            return []
        converted = [to_servicebus_message(m) for m in messages]

        def transfer(sender: ServiceBusSender, left: float) -> Any:
            return sender.schedule_messages(converted, at, timeout=left)

        # The shared connection carries sends only: a schedule is a management request,
        # sent on a lane of its own connection (see docs/servicebus.md, Connections).
        numbers = self._on_lane("schedule", entity, messages, timeout, transfer, shared_ok=False)
        acks = shared.scheduled_acks(numbers, len(messages), entity)
        logger.debug("scheduled %d message(s) to %s for %s", len(messages), entity, at)
        return acks

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Close every sender, the client and the administration client. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            every = list(self._lanes.items()) + list(self._own_lanes.items())
            self._lanes.clear()
            self._own_lanes.clear()
            connection, self._connection = self._connection, None
        self._stop_submissions()
        # Transfers in flight end within their timeouts; wait for them (bounded), then close.
        deadline = time.monotonic() + self._link_timeout
        closing = [
            (entity, lane.sender)
            for entity, lanes in every
            for lane in lanes.close(max(deadline - time.monotonic(), 0.0))
        ]
        _close_together(closing, max(deadline - time.monotonic(), _CLOSE_BOUND))
        if connection is not None and release(connection):
            try:
                _loop.run(connection.shutdown(), _CLOSE_BOUND)
            except Exception as exc:
                logger.debug("closing the shared connection failed: %s", type(exc).__name__)
        with self._lock:
            for name, closable in (("client", self._client), ("admin client", self._admin)):
                if closable is None:
                    continue
                try:
                    closable.close()
                except Exception as exc:
                    logger.debug("closing the %s failed: %s", name, redact(repr(exc)))


def _close_quietly(sender: Any, entity: str) -> None:
    try:
        sender.close()
    except Exception as exc:  # a dead link may fail to close; it is dropped either way
        logger.debug("closing the sender for %s failed: %s", entity, redact(repr(exc)))


def _close_together(closing: list[tuple[str, Any]], bound: float) -> None:
    """Close senders side by side, waiting at most ``bound`` seconds.

    Each close waits for the peer's answer and the client's keep-alive thread (about
    half a second), so closing 16 lanes one after another took 8 s.
    """
    if len(closing) <= 1:
        for entity, sender in closing:
            _close_quietly(sender, entity)
        return
    threads = [
        threading.Thread(
            target=_close_quietly, args=(sender, entity), name="sendonce-close", daemon=True
        )
        for entity, sender in closing
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + bound
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))


def _shut_socket(sender: Any) -> None:
    """Unblock a thread stuck reading the sender's socket (best effort, private path)."""
    transport = getattr(
        getattr(getattr(sender, "_handler", None), "_connection", None), "_transport", None
    )
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _default_sync_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigurationError(
            "fully_qualified_namespace without a credential needs azure-identity: "
            "pip install 'sendonce[azure]', or pass credential=",
            field="credential",
        ) from None
    return DefaultAzureCredential()
