"""``sendonce.aio.AzureServiceBusBackend``: Service Bus through ``azure.servicebus.aio``.

The asyncio twin of :class:`sendonce.backends.AzureServiceBusBackend`, sharing
its error mapping (``_errors``), message conversion
(``_convert``) and profile reading. The client's own retries are off
(``retry_total=0``); every call is bounded: the client gets ``timeout=`` and the
whole call, link opening included, runs under ``asyncio.timeout``. (The sync
backend needs a helper thread to bound link opening; here cancelling the
awaiting coroutine is enough.)

The client's senders are not safe for concurrent use (one transfer per link at
a time), so the backend keeps up to ``max_in_flight`` of them per entity
(lanes, ``_lanes``) and lends each to one task at a time:
that many transfers can be outstanding at once. A call that fails, times out or
is cancelled discards its lane's sender; the other lanes carry on.

Cancellation stays cancellation: on Python 3.11 ``asyncio.wait_for`` inside the
client swallows a cancel that lands as its inner wait finishes (CPython
gh-86296) and the call returns its result. The backend notices that the task's
``cancelling()`` count grew during the call and raises ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.servicebus.aio import ServiceBusClient, ServiceBusSender
from azure.servicebus.exceptions import MessageSizeExceededError

from ... import _telemetry
from ..._entity import EntityKind, EntityProfile
from ..._message import Message
from ..._names import ByName, name_key
from ...aio._dispatch import dispatching
from ...errors import (
    ConfigurationError,
    KeyRuleError,
    MessageSizeError,
    NotSentError,
    TransientSendError,
    ValidationError,
    redact,
)
from .._base import Ack, AsyncBackend, Capabilities
from ._convert import to_servicebus_message
from ._errors import is_connection_level, is_sdk_error, map_error
from ._lanes import AsyncLanes, Lane
from ._settings import check_timeout as _check_timeout
from ._settings import server_endpoint, settle
from ._sync import (
    DEFAULT_ADMIN_TIMEOUT,
    DEFAULT_LINK_TIMEOUT,
    _check_entity,
    _ids,
    _profile_from_properties,
)

__all__ = ["AzureServiceBusBackend"]

logger = logging.getLogger("sendonce.servicebus")

_MIN_TRANSFER_TIME = 0.001
_CLOSE_TIMEOUT = 5.0


class AzureServiceBusBackend(AsyncBackend):
    """An async backend that sends to Azure Service Bus (or its emulator).

    Built like the sync one: :meth:`from_connection_string` (or
    ``connection_string=``), ``fully_qualified_namespace`` with an *async*
    credential (``azure.identity.aio``), or a ready ``azure.servicebus.aio``
    ``client`` built with ``retry_total=0``. ``profiles`` gives explicit entity
    profiles (needed for the emulator or a send-only key); otherwise ``describe``
    reads the administration API (``azure.servicebus.aio.management``, which
    needs ``aiohttp``).
    """

    reports_dispatch = True
    """A send cancelled while it waits for a free link sent nothing, and the sender knows
    it (``sendonce.aio._dispatch``)."""

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
            default_credential=_default_async_credential,
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
            max_in_flight=settings.max_in_flight, messaging_system="servicebus", native_submit=True
        )
        self._lanes: ByName[AsyncLanes[ServiceBusSender]] = ByName()  # any spelling
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    @classmethod
    def from_connection_string(cls, conn_str: str, **options: Any) -> AzureServiceBusBackend:
        """A backend for a connection string (``UseDevelopmentEmulator=true`` for the emulator)."""
        return cls(connection_string=conn_str, **options)

    def __repr__(self) -> str:
        extra = ", emulator=True" if self._emulator else ""
        return f"aio.AzureServiceBusBackend(namespace={self._namespace!r}{extra})"

    @property
    def namespace(self) -> str:
        """The fully qualified namespace (never a credential)."""
        return self._namespace

    supports_atomic = False

    # -- entities ---------------------------------------------------------------------

    async def describe(self, entity: str) -> EntityProfile:
        """The profile of ``entity``: an explicit profile, else the administration API."""
        entity = _check_entity(entity)
        known = self._profiles.get(entity)
        if known is not None:
            return known
        admin = self._admin_client(entity)
        profile = await self._read_profile(admin, entity)
        self._profiles[entity] = profile
        self._kinds[entity] = profile.kind
        return profile

    def declare(self, profile: EntityProfile) -> None:
        """Record an explicit profile (the sender calls this): it says queue or topic."""
        if not isinstance(profile, EntityProfile):
            raise ConfigurationError("declare() takes an EntityProfile", field="profile")
        self._profiles[profile.name] = profile
        lanes = self._lanes.get(profile.name)
        if lanes is not None and self._kinds.get(profile.name) != profile.kind:
            del self._lanes[profile.name]  # busy lanes are closed when given back
            self._closing_task(lanes.close(0.0), profile.name)
        self._kinds[profile.name] = profile.kind

    def _admin_client(self, entity: str) -> Any:
        if self._admin is not None:
            return self._admin
        if self._emulator:
            raise _needs_profile(entity, "the development emulator has no administration API")
        if importlib.util.find_spec("aiohttp") is None:  # azure-core's async transport
            raise _needs_profile(
                entity, "the async administration API needs aiohttp (pip install aiohttp)"
            )
        from azure.servicebus.aio.management import ServiceBusAdministrationClient

        try:
            if self._connection_string is not None:
                self._admin = ServiceBusAdministrationClient.from_connection_string(
                    self._connection_string
                )
            elif callable(getattr(self._credential, "get_token", None)):
                self._admin = ServiceBusAdministrationClient(self._namespace, self._credential)
            else:
                raise _needs_profile(entity, "no token credential for the administration API")
        except (ValueError, TypeError) as exc:
            raise _needs_profile(entity, redact(str(exc))) from None
        return self._admin

    async def _read_profile(self, admin: Any, entity: str) -> EntityProfile:
        first: EntityKind = self._kinds.get(entity, "queue")
        order: tuple[EntityKind, EntityKind] = (
            (first, "topic") if first == "queue" else (first, "queue")
        )
        bounds = {
            "timeout": self._admin_timeout,
            "connection_timeout": self._admin_timeout,
            "read_timeout": self._admin_timeout,
        }
        not_found = 0
        for kind in order:
            getter = admin.get_queue if kind == "queue" else admin.get_topic
            try:
                props = await asyncio.wait_for(getter(entity, **bounds), self._admin_timeout)
            except ResourceNotFoundError:
                not_found += 1
                continue
            except AttributeError:
                continue  # a queue read as a topic (or back) fails to parse in the client
            except TimeoutError:
                raise TransientSendError(
                    f"reading the properties of entity {entity!r} took longer than "
                    f"{self._admin_timeout:g} s"
                ) from None
            except HttpResponseError as exc:
                status = getattr(exc, "status_code", None)
                if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
                    raise _needs_profile(
                        entity, f"the credential may not read entity properties (HTTP {status})"
                    ) from None
                if status == 404:
                    raise _needs_profile(entity, "the administration API is not there") from None
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
        raise _needs_profile(entity, "the administration API returned no description")

    # -- sending ----------------------------------------------------------------------

    def _entity_lanes(self, entity: str) -> AsyncLanes[ServiceBusSender]:
        if self._closed:
            raise ConfigurationError("the backend is closed", field="backend")
        lanes = self._lanes.get(entity)
        if lanes is None:
            if self._entity_path is not None and name_key(entity) != name_key(self._entity_path):
                raise ConfigurationError(
                    f"the connection string is scoped to entity {self._entity_path!r}, "
                    f"not {entity!r}",
                    field="entity",
                )
            lanes = self._lanes[entity] = AsyncLanes(self.capabilities.max_in_flight)
        return lanes

    def _new_sender(self, entity: str) -> ServiceBusSender:
        if self._kinds.get(entity) == "topic":
            return self._client.get_topic_sender(topic_name=entity)
        return self._client.get_queue_sender(queue_name=entity)

    async def _open_link(
        self, entity: str, lane: Lane[ServiceBusSender], timeout: float, messages: list[Message]
    ) -> None:
        """Open the lane's link within ``timeout`` (nothing is sent while opening)."""
        if lane.opened:
            return
        try:
            async with asyncio.timeout(timeout):
                await lane.sender.create_message_batch()
        except TimeoutError:
            raise NotSentError(
                f"opening a link to {entity!r} on {self._namespace!r} took longer than the "
                f"{timeout:g} s timeout; nothing was sent",
                **_ids(messages),
            ) from None
        lane.opened = True

    def _give_back(
        self,
        entity: str,
        lanes: AsyncLanes[ServiceBusSender],
        lane: Lane[ServiceBusSender],
        reason: str | None,
    ) -> None:
        """Return ``lane``; ``reason`` (a failure) closes its sender in the background (a
        dead link may hang): the next call opens a new link, the other lanes carry on."""
        if lanes.give_back(lane, keep=reason is None):
            if reason is not None:
                logger.info(
                    "closing a sender for %s (%s); the next call opens a new link", entity, reason
                )
            self._closing_task(_close_lanes([lane], entity), entity)

    def _closing_task(self, closing: Any, entity: str) -> None:
        """Close in the background (a dead link may hang); the client's ``close`` closes
        whatever is left when no loop runs (``declare`` called outside one)."""

        async def run() -> None:
            lanes = await closing
            if isinstance(lanes, list):
                await _close_lanes(lanes, entity)

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            closing.close()
            return
        task = loop.create_task(run())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _guarded(
        self,
        operation: str,
        entity: str,
        messages: list[Message],
        timeout: float,
        transfer: Any,
        prepare: Any = None,
    ) -> Any:
        """Run ``transfer(sender, time_left)`` on a free lane, under the timeout and the
        error map; a cancel the client swallowed is raised again.

        ``prepare()``, if given, runs once a lane is had and before its link is opened, and
        its result is passed to ``transfer`` as a third argument: the client's messages are
        built there, so that a caller waiting for a lane holds none of them (hundreds of
        waiters would keep the garbage collector busy) and a message the client refuses is
        refused before any I/O.
        """
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        started = time.monotonic()
        lanes = self._entity_lanes(entity)
        taken, got = lanes.take_now()
        if not got:  # every link busy: wait for one
            taken, got = await lanes.take(timeout)
            _telemetry.lane_wait("link", entity, time.monotonic() - started)
        if not got:
            raise NotSentError(
                f"all {lanes.size} links to {entity!r} stayed busy for the {timeout:g} s "
                "timeout (max_in_flight); nothing was sent",
                **_ids(messages),
            )
        if taken is None:
            try:
                taken = Lane(self._new_sender(entity))
            except BaseException:
                lanes.cancel()  # the permit goes back: no lane was made
                raise
        lane = taken
        failed: str | None = f"{operation} was interrupted"
        opened = lane.opened
        try:
            left = timeout - (time.monotonic() - started)
            if left <= _MIN_TRANSFER_TIME:
                raise NotSentError(
                    f"waiting for a free link to {entity!r} used up the {timeout:g} s timeout; "
                    "nothing was sent",
                    **_ids(messages),
                )
            prepared = prepare() if prepare is not None else None
            if not opened:
                await self._open_link(entity, lane, left, messages)
                opened = True
                left = timeout - (time.monotonic() - started)
                if left <= _MIN_TRANSFER_TIME:
                    raise NotSentError(
                        f"opening a link to {entity!r} used up the {timeout:g} s timeout; "
                        "nothing was sent",
                        **_ids(messages),
                    )
            if not dispatching():  # given up by the sender before it could go (see _dispatch)
                failed = None
                raise NotSentError(f"{operation} was given up; nothing was sent", **_ids(messages))
            async with asyncio.timeout(left):
                if prepare is None:
                    result = await transfer(lane.sender, left)
                else:
                    result = await transfer(lane.sender, left, prepared)
            failed = None
        except ValidationError:
            failed = None  # refused before anything was sent: the link is fine
            raise
        except TransientSendError:
            raise
        except TimeoutError:
            failed = f"{operation} timed out"
            raise TransientSendError(
                f"{operation} of {len(messages)} message(s) to {entity!r} got no answer "
                f"within {timeout:g} s: the outcome is in doubt: it may have been stored",
                condition="com.microsoft:timeout",
                **_ids(messages),
            ) from None
        except asyncio.CancelledError:
            failed = f"{operation} was cancelled"
            raise
        except Exception as exc:
            if not is_sdk_error(exc):
                raise
            failed = "connection-level error" if is_connection_level(exc) else "failed call"
            raise map_error(
                exc,
                operation=operation,
                entity=entity,
                count=len(messages),
                reached=opened,
                **_ids(messages),
            ) from None
        finally:
            self._give_back(entity, lanes, lane, failed)
        if task is not None and task.cancelling() > cancels:
            # The client's wait_for absorbed a cancel (gh-86296, Python 3.11): the transfer
            # ended, but the caller asked to stop, and CancelledError is what it must see.
            raise asyncio.CancelledError()
        return result

    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Send ``messages`` as one transfer (one message batch); every ack is ``accepted``."""
        entity = _check_entity(entity)
        timeout = _check_timeout(timeout)
        if atomic:
            raise ConfigurationError(
                "Service Bus has no transactions in the Python client: an all-or-nothing group "
                "cannot be sent (use the local broker for transactional groups)",
                field="atomic",
            )
        batch = list(messages)
        if not batch:
            return []
        self._check_transfer(entity, batch)

        def convert() -> list[Any]:
            return [to_servicebus_message(m) for m in batch]

        async def transfer(sender: ServiceBusSender, left: float, converted: list[Any]) -> None:
            # One message goes as itself: wrapping it in a batch encodes it twice.
            payload = (
                converted[0]
                if len(converted) == 1
                else await self._batch(sender, entity, batch, converted)
            )
            await sender.send_messages(payload, timeout=left)

        await self._guarded("send", entity, batch, timeout, transfer, convert)
        return [Ack("accepted") for _ in batch]

    def _check_transfer(self, entity: str, messages: list[Message]) -> None:
        """Refuse a transfer the service would reject (the sender never builds one)."""
        profile = self._profiles.get(entity)
        if profile is None or len(messages) < 2:
            return
        keys = {(m.partition_key, m.session_id) for m in messages}
        if profile.partitioned and profile.duplicate_detection:
            why = "the entity is partitioned with duplicate detection: one message per transfer"
        elif (profile.partitioned or profile.sessions) and len(keys) > 1:
            why = f"the transfer mixes {len(keys)} partition keys or session ids"
        else:
            return
        raise KeyRuleError(
            f"the service rejects this batch of {len(messages)} messages to {entity!r}: {why} "
            "(azure-sdk-for-python #21955, #36333). Nothing was sent.",
            field="messages",
        )

    async def _batch(
        self, sender: ServiceBusSender, entity: str, messages: list[Message], converted: list[Any]
    ) -> Any:
        if self._max_batch_size is None:
            batch = await sender.create_message_batch()
        else:
            batch = await sender.create_message_batch(max_size_in_bytes=self._max_batch_size)
        for index, (message, sb_message) in enumerate(zip(messages, converted, strict=True)):
            try:
                batch.add_message(sb_message)
            except MessageSizeExceededError:
                if len(messages) == 1:
                    return sb_message  # alone, the link's message size limit applies
                raise MessageSizeError(
                    f"message {message.message_id!r} (index {index}) does not fit in one "
                    f"transfer of {len(messages)} messages to {entity!r}: the batch limit is "
                    f"{batch.max_size_in_bytes} bytes; nothing was sent",
                    field="messages",
                ) from None
        return batch

    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Schedule ``messages`` for ``at``; the acks carry the sequence numbers.

        As with the sync backend, a retried schedule can return the sequence
        number of a copy the service dropped as a duplicate (Azure/azure-service-bus #265).
        """
        entity = _check_entity(entity)
        timeout = _check_timeout(timeout)
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValidationError("at must be a timezone-aware datetime", field="at")
        batch = list(messages)
        if not batch:
            return []
        converted = [to_servicebus_message(m) for m in batch]

        async def transfer(sender: ServiceBusSender, left: float) -> list[int]:
            return list(await sender.schedule_messages(converted, at, timeout=left))

        numbers: list[int] = await self._guarded("schedule", entity, batch, timeout, transfer)
        if len(numbers) != len(batch):
            raise TransientSendError(
                f"schedule of {len(batch)} messages to {entity!r} returned {len(numbers)} "
                "sequence numbers: the outcome is in doubt"
            )
        return [Ack("accepted", int(n) if int(n) >= 0 else None) for n in numbers]

    # -- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        """Close every sender (after the transfers in flight, bounded), the client and the
        administration client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        every, self._lanes = self._lanes, ByName()
        deadline = time.monotonic() + self._link_timeout
        closing = []
        for entity, lanes in every.items():
            idle = await lanes.close(max(deadline - time.monotonic(), 0.0))
            closing.append(_close_lanes(idle, entity))
        await asyncio.gather(*closing)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for name, closable in (("client", self._client), ("admin client", self._admin)):
            if closable is None:
                continue
            try:
                await asyncio.wait_for(closable.close(), _CLOSE_TIMEOUT)
            except Exception as exc:
                logger.debug("closing the %s failed: %s", name, redact(repr(exc)))

    def __getstate__(self) -> Any:
        raise TypeError(
            "AzureServiceBusBackend holds live connections and cannot be pickled: ship the "
            "connection string and call sendonce.aio.connect(url) where it is needed"
        )


def _needs_profile(entity: str, why: str) -> ConfigurationError:
    return ConfigurationError(
        f"cannot read the properties of entity {entity!r} ({why}); pass an explicit profile: "
        f"AzureServiceBusBackend(..., profiles={{{entity!r}: EntityProfile({entity!r}, ...)}}) "
        "or IdempotentSender(backend, EntityProfile(...)), with the values the entity was "
        "created with",
        field="entity",
    )


async def _close_lanes(lanes: list[Lane[ServiceBusSender]], entity: str) -> None:
    """Close side by side: each close waits for the peer's answer."""
    await asyncio.gather(*(_close_quietly(lane.sender, entity) for lane in lanes))


async def _close_quietly(sender: ServiceBusSender, entity: str) -> None:
    try:
        await asyncio.wait_for(sender.close(), _CLOSE_TIMEOUT)
    except Exception as exc:  # a dead link may fail to close; it is dropped either way
        logger.debug("closing the sender for %s failed: %s", entity, redact(repr(exc)))


def _default_async_credential() -> Any:
    try:
        from azure.identity.aio import DefaultAzureCredential
    except ImportError:
        raise ConfigurationError(
            "fully_qualified_namespace without a credential needs azure-identity (and aiohttp): "
            "pip install 'sendonce[azure]' aiohttp, or pass credential=",
            field="credential",
        ) from None
    return DefaultAzureCredential()
