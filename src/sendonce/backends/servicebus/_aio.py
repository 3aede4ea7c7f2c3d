"""``sendonce.aio.AzureServiceBusBackend``: Service Bus through ``azure.servicebus.aio``.

The asyncio twin of :class:`sendonce.backends.AzureServiceBusBackend`, sharing
its settings, checks, error mapping and profile reading (``_shared``, ``_settings``,
``_errors``) and message conversion (``_convert``). The client's own retries are off
(``retry_total=0``); every call is bounded: the client gets ``timeout=`` and the
whole call, link opening included, runs under ``asyncio.timeout``. (The sync
backend needs a helper thread to bound link opening; here cancelling the
awaiting coroutine is enough.)

The client's senders are not safe for concurrent use (one transfer per link at
a time), so the backend keeps up to ``max_in_flight`` of them per entity
(lanes, ``_lanes``) and lends each to one task at a time:
that many transfers can be outstanding at once. A call that fails, times out or
is cancelled discards its lane's sender; the other lanes carry on. Built from a connection
string, a send's lane is a link on the process's one connection to the namespace
(``_connection``, ``_link.AsyncSharedLink``), awaited across to the connection's loop.

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
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from azure.servicebus.aio import ServiceBusClient, ServiceBusSender

from ... import _telemetry
from ..._entity import EntityProfile
from ..._message import Message
from ..._names import ByName
from ...errors import (
    ConfigurationError,
    NotSentError,
    TransientSendError,
    ValidationError,
    redact,
)
from .._base import Ack, AsyncBackend
from .._dispatch import dispatching
from . import _loop
from . import _shared as shared
from ._connection import NotWritten, SharedConnection, acquire, release
from ._convert import to_servicebus_message
from ._errors import is_connection_level, is_sdk_error, map_error
from ._lanes import AsyncLanes, Lane
from ._link import AsyncSharedLink
from ._sharing import sharing_enabled

__all__ = ["AzureServiceBusBackend"]

logger = logging.getLogger("sendonce.servicebus")

_CLOSE_TIMEOUT = 5.0


class AzureServiceBusBackend(shared.ServiceBusShared, AsyncBackend):
    """An async backend that sends to Azure Service Bus (or its emulator).

    Built like the sync one: :meth:`from_connection_string` (or
    ``connection_string=``), ``fully_qualified_namespace`` with an *async*
    credential (``azure.identity.aio``), or a ready ``azure.servicebus.aio``
    ``client`` built with ``retry_total=0``. ``profiles`` gives explicit entity
    profiles (needed for the emulator or a send-only key); otherwise ``describe``
    reads the administration API (``azure.servicebus.aio.management``, which
    needs ``aiohttp``).
    """

    _repr_name = "aio.AzureServiceBusBackend"
    _connect_hint = "sendonce.aio.connect(url) where it is needed"

    reports_dispatch = True
    """A send cancelled while it waits for a free link sent nothing, and the sender knows
    it (``sendonce.backends._dispatch``)."""

    _client: ServiceBusClient
    _client_class = ServiceBusClient
    _native_submit = True

    @staticmethod
    def _default_credential() -> Any:
        return _default_async_credential()

    def _start(self) -> None:
        # Sends use the shared connection's links when sharing is on; schedules (and every
        # call when it is off) use lanes of their own connection each.
        self._lanes: ByName[AsyncLanes[Any]] = ByName()  # any spelling
        self._own_lanes: ByName[AsyncLanes[Any]] = ByName()
        self._closing: set[asyncio.Task[None]] = set()
        self._connection: SharedConnection | None = None

    def _sharing_wanted(self, option: bool | None) -> bool:
        # Only with a connection string's key: an async token credential (azure.identity.aio)
        # is bound to the loop it was first used on, and the connection has its own.
        return sharing_enabled(option, self._client) and self._connection_string is not None

    @property
    def connection_sharing(self) -> bool:
        """Whether sends go as links on the process's one connection to the namespace."""
        return self._sharing

    supports_atomic = False

    # -- entities ---------------------------------------------------------------------

    async def describe(self, entity: str) -> EntityProfile:
        """The profile of ``entity``: an explicit profile, else the administration API."""
        entity = shared.check_entity(entity)
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
        for table in (self._lanes, self._own_lanes):
            lanes = table.get(profile.name)
            if lanes is not None and self._kinds.get(profile.name) != profile.kind:
                del table[profile.name]  # busy lanes are closed when given back
                self._closing_task(lanes.close(0.0), profile.name)
        self._kinds[profile.name] = profile.kind

    def _admin_client(self, entity: str) -> Any:
        if self._admin is None:
            if self._emulator:
                raise shared.needs_profile(
                    entity, "the development emulator has no administration API"
                )
            if importlib.util.find_spec("aiohttp") is None:  # azure-core's async transport
                raise shared.needs_profile(
                    entity, "the async administration API needs aiohttp (pip install aiohttp)"
                )
        from azure.servicebus.aio.management import ServiceBusAdministrationClient

        return self._build_admin(ServiceBusAdministrationClient, entity)

    async def _read_profile(self, admin: Any, entity: str) -> EntityProfile:
        missing = 0
        for kind in shared.lookup_order(self._kinds, entity):
            getter = admin.get_queue if kind == "queue" else admin.get_topic
            try:
                bounds = shared.admin_bounds(self._admin_timeout)
                props = await asyncio.wait_for(getter(entity, **bounds), self._admin_timeout)
            except TimeoutError:
                raise TransientSendError(
                    f"reading the properties of entity {entity!r} took longer than "
                    f"{self._admin_timeout:g} s"
                ) from None
            except Exception as exc:
                missing += shared.skipped_kind(exc, entity)
                continue
            return shared.profile_from_properties(entity, kind, props)
        raise self._no_such_entity(entity, missing)

    # -- sending ----------------------------------------------------------------------

    def _entity_lanes(self, entity: str, on_shared: bool = False) -> AsyncLanes[Any]:
        self._check_open(entity)
        table = self._lanes if on_shared else self._own_lanes
        lanes = table.get(entity)
        if lanes is None:
            lanes = table[entity] = AsyncLanes(self.capabilities.max_in_flight)
        return lanes

    def _new_sender(self, entity: str, on_shared: bool = False) -> Any:
        if self._kinds.get(entity) == "topic":
            sender = self._client.get_topic_sender(topic_name=entity)
        else:
            sender = self._client.get_queue_sender(queue_name=entity)
        if not on_shared:
            return sender
        if self._connection is None:
            self._connection = acquire(self._client, self._link_timeout)
        return AsyncSharedLink(self._connection, sender)

    async def _open_link(
        self, entity: str, lane: Lane[Any], timeout: float, messages: list[Message]
    ) -> None:
        """Open the lane's link within ``timeout`` (nothing is sent while opening)."""
        if lane.opened and not isinstance(lane.sender, AsyncSharedLink):
            return
        try:
            async with asyncio.timeout(timeout):
                if isinstance(lane.sender, AsyncSharedLink):
                    await lane.sender.open(timeout)
                else:
                    await lane.sender.create_message_batch()
        except TimeoutError:
            raise shared.link_too_slow(entity, self._namespace, timeout, messages) from None
        lane.opened = True

    def _give_back(
        self,
        entity: str,
        lanes: AsyncLanes[Any],
        lane: Lane[Any],
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
        *,
        shared_ok: bool = True,
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
        on_shared = self._sharing and shared_ok
        lanes = self._entity_lanes(entity, on_shared)
        taken, got = lanes.take_now()
        if not got:  # every link busy: wait for one
            taken, got = await lanes.take(timeout)
            _telemetry.lane_wait("link", entity, time.monotonic() - started)
        if not got:
            raise shared.no_free_link(lanes.size, entity, timeout, messages)
        if taken is None:
            try:
                taken = Lane(self._new_sender(entity, on_shared))
            except BaseException:
                lanes.cancel()  # the permit goes back: no lane was made
                raise
        lane = taken
        failed: str | None = f"{operation} was interrupted"
        opened = lane.sender.opened if on_shared else lane.opened
        try:
            left = timeout - (time.monotonic() - started)
            if left <= shared.MIN_TRANSFER_TIME:
                raise shared.no_time_left("waiting for a free link", entity, timeout, messages)
            prepared = prepare() if prepare is not None else None
            if not opened:
                await self._open_link(entity, lane, left, messages)
                opened = True
                left = timeout - (time.monotonic() - started)
                if left <= shared.MIN_TRANSFER_TIME:
                    raise shared.no_time_left("opening a link", entity, timeout, messages)
            if not dispatching():  # given up by the sender before it could go (see _dispatch)
                failed = None
                raise NotSentError(
                    f"{operation} was given up; nothing was sent", **shared.ids(messages)
                )
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
                **shared.ids(messages),
            ) from None
        except asyncio.CancelledError:
            failed = f"{operation} was cancelled"
            raise
        except NotWritten as exc:  # the shared connection never wrote it: nothing stored
            failed = "connection-level error"
            raise map_error(
                exc.error,
                operation=operation,
                entity=entity,
                count=len(messages),
                reached=False,
                **shared.ids(messages),
            ) from None
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
                **shared.ids(messages),
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
        entity, timeout, batch = self._send_checks(entity, messages, timeout, atomic)
        if not batch:
            return []

        def convert() -> list[Any]:
            return [to_servicebus_message(m) for m in batch]

        async def transfer(sender: Any, left: float, converted: list[Any]) -> None:
            # One message goes as itself: wrapping it in a batch encodes it twice.
            payload = (
                converted[0]
                if len(converted) == 1
                else await self._batch(sender, entity, batch, converted)
            )
            await sender.send_messages(payload, timeout=left)

        await self._guarded("send", entity, batch, timeout, transfer, convert)
        return [Ack("accepted") for _ in batch]

    async def _batch(
        self, sender: Any, entity: str, messages: list[Message], converted: list[Any]
    ) -> Any:
        batch = await sender.create_message_batch(**self._batch_size())
        return shared.fill_batch(batch, entity, messages, converted)

    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Schedule ``messages`` for ``at``; the acks carry the sequence numbers.

        As with the sync backend, a retried schedule can return the sequence
        number of a copy the service dropped as a duplicate (Azure/azure-service-bus #265).
        """
        entity, timeout, batch = self._schedule_checks(entity, messages, at, timeout)
        if not batch:
            return []
        converted = [to_servicebus_message(m) for m in batch]

        async def transfer(sender: ServiceBusSender, left: float) -> list[int]:
            return list(await sender.schedule_messages(converted, at, timeout=left))

        # A schedule is a management request: on a lane of its own connection.
        numbers: list[int] = await self._guarded(
            "schedule", entity, batch, timeout, transfer, shared_ok=False
        )
        return shared.scheduled_acks(numbers, len(batch), entity)

    # -- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        """Close every sender (after the transfers in flight, bounded), the client and the
        administration client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        every = [*self._lanes.items(), *self._own_lanes.items()]
        self._lanes, self._own_lanes = ByName(), ByName()
        connection, self._connection = self._connection, None
        deadline = time.monotonic() + self._link_timeout
        closing = []
        for entity, lanes in every:
            idle = await lanes.close(max(deadline - time.monotonic(), 0.0))
            closing.append(_close_lanes(idle, entity))
        await asyncio.gather(*closing)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if connection is not None and release(connection):
            try:
                await asyncio.wait_for(_loop.awaited(connection.shutdown()), _CLOSE_TIMEOUT)
            except Exception as exc:
                logger.debug("closing the shared connection failed: %s", type(exc).__name__)
        for name, closable in (("client", self._client), ("admin client", self._admin)):
            if closable is None:
                continue
            try:
                await asyncio.wait_for(closable.close(), _CLOSE_TIMEOUT)
            except Exception as exc:
                logger.debug("closing the %s failed: %s", name, redact(repr(exc)))


async def _close_lanes(lanes: list[Lane[Any]], entity: str) -> None:
    """Close side by side: each close waits for the peer's answer."""
    await asyncio.gather(*(_close_quietly(lane.sender, entity) for lane in lanes))


async def _close_quietly(sender: Any, entity: str) -> None:
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
