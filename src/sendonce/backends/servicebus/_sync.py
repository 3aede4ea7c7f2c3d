"""``AzureServiceBusBackend``: queues and topics through the real azure-servicebus client.

The client is configured so that sendonce owns the retry budget: its own retries
are off (``retry_total=0``) and every send and schedule passes a timeout. Each
``send`` is exactly one transfer (one ``ServiceBusMessageBatch``), because the
sender decides the transfer boundaries by the partition-key and size rules.

Concurrency: a ``ServiceBusSender`` carries one transfer at a time and is not
thread-safe, so the backend keeps up to ``max_in_flight`` senders per entity
(lanes, see ``_lanes``) and lends each to one thread at a time. Up to
``max_in_flight`` threads may call ``send`` / ``schedule`` at once; each lane is
its own AMQP connection (the client shares none between senders).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.servicebus import ServiceBusClient, ServiceBusSender
from azure.servicebus.exceptions import MessageSizeExceededError

from ... import _telemetry
from ..._entity import DEFAULT_WINDOW, EntityKind, EntityProfile
from ..._message import Message
from ..._names import ByName, name_key
from ...errors import (
    ConfigurationError,
    KeyRuleError,
    MessageSizeError,
    NotSentError,
    SendError,
    TransientSendError,
    ValidationError,
    redact,
)
from .._base import Ack, Backend, Capabilities
from ._convert import to_servicebus_message
from ._errors import is_connection_level, is_sdk_error, map_error
from ._lanes import Lane, Lanes
from ._settings import check_timeout as _check_timeout
from ._settings import server_endpoint, settle

__all__ = ["AzureServiceBusBackend"]

logger = logging.getLogger("sendonce.servicebus")

DEFAULT_LINK_TIMEOUT = 60.0
DEFAULT_ADMIN_TIMEOUT = 30.0
_STANDARD_MAX_MESSAGE_KB = 256
_MIN_TRANSFER_TIME = 0.001
_CLOSE_BOUND = 10.0


def _check_entity(entity: object) -> str:
    if not isinstance(entity, str) or not entity.strip():
        raise ConfigurationError("entity must be a non-empty queue or topic name", field="entity")
    return entity


class AzureServiceBusBackend(Backend):
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

    def __init__(
        self,
        *,
        client: ServiceBusClient | None = None,
        fully_qualified_namespace: str | None = None,
        credential: Any = None,
        connection_string: str | None = None,
        admin_client: Any = None,
        profiles: Mapping[str, EntityProfile] | None = None,
        kinds: Mapping[str, EntityKind] | None = None,
        transport_type: Any = None,
        link_timeout: float = DEFAULT_LINK_TIMEOUT,
        admin_timeout: float = DEFAULT_ADMIN_TIMEOUT,
        max_batch_size: int | None = None,
        max_in_flight: int | None = None,
        **client_kwargs: Any,
    ) -> None:
        settings = settle(
            client_class=ServiceBusClient,
            default_credential=_default_credential,
            client=client,
            fully_qualified_namespace=fully_qualified_namespace,
            credential=credential,
            connection_string=connection_string,
            profiles=profiles,
            kinds=kinds,
            transport_type=transport_type,
            link_timeout=link_timeout,
            admin_timeout=admin_timeout,
            max_batch_size=max_batch_size,
            max_in_flight=max_in_flight,
            client_kwargs=client_kwargs,
        )
        self._client: ServiceBusClient = settings.client
        self._namespace = settings.namespace
        # OpenTelemetry's server.address / server.port (sendonce._telemetry reads them).
        self.server_address, self.server_port = server_endpoint(settings.namespace, self._client)
        self._credential: Any = settings.credential
        self._link_timeout = settings.link_timeout
        self._admin_timeout = settings.admin_timeout
        self._max_batch_size = settings.max_batch_size
        self._profiles = settings.profiles
        self._kinds = settings.kinds
        self._connection_string = settings.connection_string
        self._emulator = settings.emulator
        self._entity_path = settings.entity_path
        self._admin: Any = admin_client
        self.capabilities = Capabilities(
            max_in_flight=settings.max_in_flight, messaging_system="servicebus"
        )
        self._lanes: ByName[Lanes[ServiceBusSender]] = ByName()  # any spelling
        self._lock = threading.RLock()
        self._closed = False
        logger.debug("created %r", self)

    # -- construction -----------------------------------------------------------------

    @classmethod
    def from_connection_string(cls, conn_str: str, **options: Any) -> AzureServiceBusBackend:
        """A backend for a connection string (``UseDevelopmentEmulator=true`` for the emulator)."""
        return cls(connection_string=conn_str, **options)

    def __repr__(self) -> str:
        extra = ", emulator=True" if self._emulator else ""
        return f"AzureServiceBusBackend(namespace={self._namespace!r}{extra})"

    @property
    def namespace(self) -> str:
        """The fully qualified namespace (host, and port for the emulator)."""
        return self._namespace

    # -- entities ---------------------------------------------------------------------

    def describe(self, entity: str) -> EntityProfile:
        """The profile of ``entity``: an explicit profile, else the administration API.

        Raises ``ConfigurationError`` when the properties cannot be read (the
        emulator, or a credential without Manage rights): pass ``profiles=``.
        """
        entity = _check_entity(entity)
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
            if profile.name in self._lanes and opened_as != profile.kind:
                self._retire_lanes(profile.name, "the entity kind changed")
            self._kinds[profile.name] = profile.kind

    def _needs_profile(self, entity: str, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"cannot read the properties of entity {entity!r} ({why}); pass an explicit profile, "
            f"e.g. AzureServiceBusBackend(..., profiles={{{entity!r}: EntityProfile({entity!r}, "
            "duplicate_detection=True, duplicate_detection_window=timedelta(minutes=10), "
            "partitioned=False, sessions=False)}) or IdempotentSender(backend, "
            "EntityProfile(...)), with the values the entity was created with",
            field="entity",
        )

    def _admin_client(self, entity: str) -> Any:
        if self._admin is not None:
            return self._admin
        if self._emulator:
            raise self._needs_profile(entity, "the development emulator has no administration API")
        from azure.servicebus.management import ServiceBusAdministrationClient

        try:
            if self._connection_string is not None:
                self._admin = ServiceBusAdministrationClient.from_connection_string(
                    self._connection_string
                )
            elif self._credential is not None:
                if not callable(getattr(self._credential, "get_token", None)):
                    raise self._needs_profile(
                        entity,
                        "the administration API needs a token credential such as "
                        "DefaultAzureCredential, or a connection string",
                    )
                self._admin = ServiceBusAdministrationClient(self._namespace, self._credential)
            else:
                raise self._needs_profile(entity, "no credential for the administration API")
        except (ValueError, TypeError) as exc:
            raise self._needs_profile(entity, redact(str(exc))) from None
        return self._admin

    def _read_profile(self, admin: Any, entity: str) -> EntityProfile:
        first: EntityKind = self._kinds.get(entity, "queue")
        order: tuple[EntityKind, EntityKind] = (
            (first, "topic") if first == "queue" else (first, "queue")
        )
        # Per call: an overall bound (azure-core's retry policy) and socket bounds.
        bounds = {
            "timeout": self._admin_timeout,
            "connection_timeout": self._admin_timeout,
            "read_timeout": self._admin_timeout,
        }
        not_found = 0
        for kind in order:
            getter = admin.get_queue if kind == "queue" else admin.get_topic
            try:
                props = getter(entity, **bounds)
            except ResourceNotFoundError:
                not_found += 1
                continue
            except AttributeError:
                # get_queue on a topic name (and get_topic on a queue name) finds the other
                # kind of description and fails to read it (azure-servicebus 7.x).
                continue
            except HttpResponseError as exc:
                status = getattr(exc, "status_code", None)
                if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
                    raise self._needs_profile(
                        entity, f"the credential may not read entity properties (HTTP {status})"
                    ) from None
                if status == 404:
                    raise self._needs_profile(
                        entity, "the administration API is not there"
                    ) from None
                raise TransientSendError(
                    f"reading the properties of entity {entity!r} failed: "
                    f"{type(exc).__name__} (HTTP {status})"
                ) from None
            except AzureError as exc:
                raise TransientSendError(
                    f"reading the properties of entity {entity!r} failed: {type(exc).__name__}: "
                    f"{redact(str(exc))}"
                ) from None
            return _profile_from_properties(entity, kind, props)
        if not_found == len(order):
            raise ConfigurationError(
                f"entity {entity!r} does not exist in namespace {self._namespace!r} "
                "(neither a queue nor a topic)",
                field="entity",
            )
        raise self._needs_profile(entity, "the administration API returned no description")

    # -- sending ----------------------------------------------------------------------

    def _entity_lanes(self, entity: str) -> Lanes[ServiceBusSender]:
        with self._lock:
            if self._closed:
                raise ConfigurationError("the backend is closed", field="backend")
            lanes = self._lanes.get(entity)
            if lanes is None:
                if self._entity_path is not None and name_key(entity) != name_key(
                    self._entity_path
                ):
                    raise ConfigurationError(
                        f"the connection string is scoped to entity {self._entity_path!r}, "
                        f"not {entity!r}",
                        field="entity",
                    )
                lanes = self._lanes[entity] = Lanes(self.capabilities.max_in_flight)
            return lanes

    def _take_lane(
        self, entity: str, timeout: float, messages: list[Message]
    ) -> tuple[Lanes[ServiceBusSender], Lane[ServiceBusSender], float]:
        """A lane for one transfer and the time left of ``timeout`` once it is free."""
        started = time.monotonic()
        lanes = self._entity_lanes(entity)
        lane, got = lanes.take_now()
        if not got:  # every link busy: wait for one
            lane, got = lanes.take(timeout)
            _telemetry.lane_wait("link", entity, time.monotonic() - started)
        if not got:
            raise NotSentError(
                f"all {lanes.size} links to {entity!r} stayed busy for the {timeout:g} s timeout "
                "(max_in_flight); nothing was sent",
                **_ids(messages),
            )
        if lane is None:
            try:
                with self._lock:  # the client keeps a set of its handlers
                    if self._kinds.get(entity) == "topic":
                        sender = self._client.get_topic_sender(topic_name=entity)
                    else:
                        sender = self._client.get_queue_sender(queue_name=entity)
            except BaseException:
                lanes.cancel()
                raise
            logger.debug("opened a sender for %s (%d lanes at most)", entity, lanes.size)
            lane = Lane(sender)
        return lanes, lane, timeout - (time.monotonic() - started)

    def _give_back(
        self,
        entity: str,
        lanes: Lanes[ServiceBusSender],
        lane: Lane[ServiceBusSender],
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
        lane: Lane[ServiceBusSender],
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
        if lane.opened:
            return timeout
        if timeout <= _MIN_TRANSFER_TIME:
            raise NotSentError(
                f"waiting for a free link to {entity!r} used up the timeout; nothing was sent",
                **_ids(messages),
            )
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
            raise NotSentError(
                f"opening a link to {entity!r} on {self._namespace!r} took longer than the "
                f"{timeout:g} s timeout; nothing was sent",
                **_ids(messages),
            )
        if outcome:
            raise outcome[0]
        lane.opened = True
        left = timeout - (time.monotonic() - started)
        if left <= _MIN_TRANSFER_TIME:
            raise NotSentError(
                f"opening a link to {entity!r} used up the {timeout:g} s timeout; nothing was sent",
                **_ids(messages),
            )
        return left

    def _open_mapped(
        self,
        entity: str,
        lane: Lane[ServiceBusSender],
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
        lanes = self._lanes.pop(entity, None)
        if lanes is None:
            return
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
            **_ids(messages),
        )

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Send ``messages`` to a queue or topic as one transfer (one message batch).

        Raises ``MessageSizeError`` (nothing sent) if they do not fit in one
        batch on the link. Service Bus does not tell the sender about duplicates,
        so every ack is ``"accepted"``.
        """
        entity = _check_entity(entity)
        timeout = _check_timeout(timeout)
        if atomic:
            raise ConfigurationError(
                "Service Bus has no transactions in the Python client: an all-or-nothing group "
                "cannot be sent (use the local broker for transactional groups)",
                field="atomic",
            )
        messages = list(messages)
        if not messages:
            return []
        self._check_transfer(entity, messages)
        converted = [to_servicebus_message(m) for m in messages]
        lanes, lane, left = self._take_lane(entity, timeout, messages)
        failed: str | None = "interrupted"
        try:
            left = self._open_mapped(entity, lane, left, messages, operation="send")
            sender = lane.sender
            # One message goes as itself: wrapping it in a batch encodes it twice.
            payload: Any = (
                converted[0]
                if len(converted) == 1
                else self._batch(sender, entity, messages, converted)
            )
            sender.send_messages(payload, timeout=left)
            failed = None
        except (ValidationError, TransientSendError) as exc:
            if isinstance(exc, ValidationError):
                failed = None  # refused before anything was sent: the link is fine
            raise
        except Exception as exc:
            if not is_sdk_error(exc):
                raise
            failed = self._failure_reason(exc)
            raise self._fail(exc, operation="send", entity=entity, messages=messages) from None
        finally:
            self._give_back(entity, lanes, lane, failed)
        logger.debug("sent %d message(s) to %s", len(messages), entity)
        return [Ack("accepted") for _ in messages]

    def _check_transfer(self, entity: str, messages: list[Message]) -> None:
        """Refuse a transfer the service would reject, when the entity's profile is known.

        The sender never builds one; this guards direct callers of ``send``.
        """
        profile = self._profiles.get(entity)
        if profile is None or len(messages) < 2:
            return
        if profile.partitioned and profile.duplicate_detection:
            raise KeyRuleError(
                f"entity {entity!r} is partitioned with duplicate detection: the service rejects "
                f"a batch of {len(messages)} messages there (azure-sdk-for-python #21955, "
                "#36333); send one message per transfer. Nothing was sent.",
                field="messages",
            )
        if profile.partitioned or profile.sessions:
            keys = {(m.partition_key, m.session_id) for m in messages}
            if len(keys) > 1:
                raise KeyRuleError(
                    f"one transfer to {entity!r} mixes partition keys or session ids "
                    f"({len(keys)} distinct); the service rejects such a batch. Nothing was sent.",
                    field="messages",
                )

    def _batch(
        self, sender: ServiceBusSender, entity: str, messages: list[Message], converted: list[Any]
    ) -> Any:
        if self._max_batch_size is None:
            batch = sender.create_message_batch()
        else:
            batch = sender.create_message_batch(max_size_in_bytes=self._max_batch_size)
        for index, (message, sb_message) in enumerate(zip(messages, converted, strict=True)):
            try:
                batch.add_message(sb_message)
            except MessageSizeExceededError:
                if len(messages) == 1:
                    # A single large message (Premium allows up to 100 MB) goes on its own,
                    # where the link's message size limit, not the batch limit, applies.
                    return sb_message
                raise MessageSizeError(
                    f"message {message.message_id!r} (index {index}) does not fit in one "
                    f"transfer of {len(messages)} messages to {entity!r}: the batch limit is "
                    f"{batch.max_size_in_bytes} bytes; nothing was sent",
                    field="messages",
                ) from None
        return batch

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Schedule ``messages`` for ``at``; the acks carry the sequence numbers.

        A retried schedule can return the sequence number of a copy the service
        dropped as a duplicate (Azure/azure-service-bus #265, #266): such a number
        cannot be used to cancel the message that was kept.
        """
        entity = _check_entity(entity)
        timeout = _check_timeout(timeout)
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValidationError("at must be a timezone-aware datetime", field="at")
        messages = list(messages)
        if not messages:
            return []
        converted = [to_servicebus_message(m) for m in messages]
        lanes, lane, left = self._take_lane(entity, timeout, messages)
        failed: str | None = "interrupted"
        try:
            left = self._open_mapped(entity, lane, left, messages, operation="schedule")
            numbers = lane.sender.schedule_messages(converted, at, timeout=left)
            failed = None
        except (ValidationError, TransientSendError) as exc:
            if isinstance(exc, ValidationError):
                failed = None
            raise
        except Exception as exc:
            if not is_sdk_error(exc):
                raise
            failed = self._failure_reason(exc)
            raise self._fail(exc, operation="schedule", entity=entity, messages=messages) from None
        finally:
            self._give_back(entity, lanes, lane, failed)
        numbers = list(numbers)
        if len(numbers) != len(messages):
            raise TransientSendError(
                f"schedule of {len(messages)} messages to {entity!r} returned {len(numbers)} "
                "sequence numbers: the outcome is in doubt"
            )
        logger.debug("scheduled %d message(s) to %s for %s", len(messages), entity, at)
        return [Ack("accepted", int(n) if int(n) >= 0 else None) for n in numbers]

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Close every sender, the client and the administration client. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            every = list(self._lanes.items())
            self._lanes.clear()
        self._stop_submissions()
        # Transfers in flight end within their timeouts; wait for them (bounded), then close.
        deadline = time.monotonic() + self._link_timeout
        closing = [
            (entity, lane.sender)
            for entity, lanes in every
            for lane in lanes.close(max(deadline - time.monotonic(), 0.0))
        ]
        _close_together(closing, max(deadline - time.monotonic(), _CLOSE_BOUND))
        with self._lock:
            for name, closable in (("client", self._client), ("admin client", self._admin)):
                if closable is None:
                    continue
                try:
                    closable.close()
                except Exception as exc:
                    logger.debug("closing the %s failed: %s", name, redact(repr(exc)))

    def __getstate__(self) -> Any:
        raise TypeError(
            "AzureServiceBusBackend holds live connections and cannot be pickled: ship the "
            "connection string and call sendonce.backends.connect(url) on the executor"
        )


def _ids(messages: Sequence[Message]) -> dict[str, str | None]:
    """The message id and partition key an error names: only for a one-message transfer."""
    if len(messages) != 1:
        return {"message_id": None, "partition_key": None}
    one = messages[0]
    return {"message_id": one.message_id, "partition_key": one.partition_key or one.session_id}


def _close_quietly(sender: ServiceBusSender, entity: str) -> None:
    try:
        sender.close()
    except Exception as exc:  # a dead link may fail to close; it is dropped either way
        logger.debug("closing the sender for %s failed: %s", entity, redact(repr(exc)))


def _close_together(closing: list[tuple[str, ServiceBusSender]], bound: float) -> None:
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


def _default_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigurationError(
            "fully_qualified_namespace without a credential needs azure-identity: "
            "pip install 'sendonce[azure]', or pass credential=",
            field="credential",
        ) from None
    return DefaultAzureCredential()


def _profile_from_properties(entity: str, kind: EntityKind, props: Any) -> EntityProfile:
    window = getattr(props, "duplicate_detection_history_time_window", None)
    if not isinstance(window, timedelta):
        window = DEFAULT_WINDOW
    size_kb = getattr(props, "max_message_size_in_kilobytes", None)
    if not isinstance(size_kb, int) or size_kb <= 0:
        size_kb = _STANDARD_MAX_MESSAGE_KB
    return EntityProfile(
        entity,
        kind=kind,
        duplicate_detection=bool(getattr(props, "requires_duplicate_detection", False)),
        duplicate_detection_window=window,
        partitioned=bool(getattr(props, "enable_partitioning", False)),
        sessions=bool(getattr(props, "requires_session", False)) if kind == "queue" else False,
        max_message_size=size_kb * 1024,
    )
