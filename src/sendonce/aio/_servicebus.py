"""``sendonce.aio.AzureServiceBusBackend``: Service Bus through ``azure.servicebus.aio``.

The asyncio twin of :class:`sendonce.backends.AzureServiceBusBackend`, sharing
its error mapping (``_servicebus_errors``), message conversion
(``_servicebus_convert``) and profile reading. The client's own retries are off
(``retry_total=0``); every call is bounded: the client gets ``timeout=`` and the
whole call, link opening included, runs under ``asyncio.timeout``. (The sync
backend needs a helper thread to bound link opening; here cancelling the
awaiting coroutine is enough.)

Calls on one backend are serialised by an ``asyncio.Lock`` (the client's
senders are not safe for concurrent use). A call that fails, times out or is
cancelled discards its sender: the next call opens a fresh link.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.servicebus.aio import ServiceBusClient, ServiceBusSender
from azure.servicebus.exceptions import MessageSizeExceededError

from .._entity import EntityKind, EntityProfile
from .._message import Message
from ..backends._base import Ack
from ..backends._servicebus_convert import to_servicebus_message
from ..backends._servicebus_errors import is_connection_level, is_sdk_error, map_error
from ..backends._servicebus_settings import check_timeout as _check_timeout
from ..backends._servicebus_settings import settle
from ..backends.servicebus import (
    DEFAULT_ADMIN_TIMEOUT,
    DEFAULT_LINK_TIMEOUT,
    _check_entity,
    _ids,
    _profile_from_properties,
)
from ..errors import (
    ConfigurationError,
    KeyRuleError,
    MessageSizeError,
    NotSentError,
    TransientSendError,
    ValidationError,
    redact,
)

__all__ = ["AzureServiceBusBackend"]

logger = logging.getLogger("sendonce.servicebus")

_MIN_TRANSFER_TIME = 0.001
_CLOSE_TIMEOUT = 5.0


class AzureServiceBusBackend:
    """An async backend that sends to Azure Service Bus (or its emulator).

    Built like the sync one: :meth:`from_connection_string` (or
    ``connection_string=``), ``fully_qualified_namespace`` with an *async*
    credential (``azure.identity.aio``), or a ready ``azure.servicebus.aio``
    ``client`` built with ``retry_total=0``. ``profiles`` gives explicit entity
    profiles (needed for the emulator or a send-only key); otherwise ``describe``
    reads the administration API (``azure.servicebus.aio.management``, which
    needs ``aiohttp``).
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
            client_kwargs=client_kwargs,
        )
        self._client: ServiceBusClient = settings.client
        self._namespace = settings.namespace
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
        self._senders: dict[str, ServiceBusSender] = {}
        self._open: set[str] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
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
        if profile.name in self._senders and self._kinds.get(profile.name) != profile.kind:
            self._discard_sender(profile.name, "the entity kind changed")
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

    def _sender(self, entity: str) -> ServiceBusSender:
        if self._closed:
            raise ConfigurationError("the backend is closed", field="backend")
        sender = self._senders.get(entity)
        if sender is not None:
            return sender
        if self._entity_path is not None and entity != self._entity_path:
            raise ConfigurationError(
                f"the connection string is scoped to entity {self._entity_path!r}, not {entity!r}",
                field="entity",
            )
        if self._kinds.get(entity) == "topic":
            sender = self._client.get_topic_sender(topic_name=entity)
        else:
            sender = self._client.get_queue_sender(queue_name=entity)
        self._senders[entity] = sender
        return sender

    async def _open_link(
        self, entity: str, sender: ServiceBusSender, timeout: float, messages: list[Message]
    ) -> float:
        """Open ``sender``'s link within ``timeout``; return the time left for the transfer."""
        if entity in self._open:
            return timeout
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                await sender.create_message_batch()
        except TimeoutError:
            self._discard_sender(entity, "opening the link timed out")
            raise NotSentError(
                f"opening a link to {entity!r} on {self._namespace!r} took longer than the "
                f"{timeout:g} s timeout; nothing was sent",
                **_ids(messages),
            ) from None
        self._open.add(entity)
        left = timeout - (time.monotonic() - started)
        if left <= _MIN_TRANSFER_TIME:
            raise NotSentError(
                f"opening a link to {entity!r} used up the {timeout:g} s timeout; nothing was sent",
                **_ids(messages),
            )
        return left

    def _discard_sender(self, entity: str, reason: str) -> None:
        """Forget ``entity``'s sender and close it in the background (a dead link may hang)."""
        self._open.discard(entity)
        sender = self._senders.pop(entity, None)
        if sender is None:
            return
        logger.info(
            "closing the sender for %s (%s); the next call opens a new link", entity, reason
        )
        task = asyncio.get_running_loop().create_task(_close_quietly(sender, entity))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _guarded(
        self,
        operation: str,
        entity: str,
        messages: list[Message],
        timeout: float,
        transfer: Any,
    ) -> Any:
        """Run ``transfer(sender, time_left)`` under the lock, the timeout and the error map."""
        async with self._lock:
            sender = self._sender(entity)
            opened = False
            try:
                started = time.monotonic()
                left = await self._open_link(entity, sender, timeout, messages)
                opened = True
                remaining = max(timeout - (time.monotonic() - started), _MIN_TRANSFER_TIME)
                async with asyncio.timeout(remaining):
                    return await transfer(sender, left)
            except (ValidationError, TransientSendError):
                raise
            except TimeoutError:
                self._discard_sender(entity, f"{operation} timed out")
                raise TransientSendError(
                    f"{operation} of {len(messages)} message(s) to {entity!r} got no answer "
                    f"within {timeout:g} s: the outcome is in doubt; resending the same id "
                    "inside the window is safe",
                    condition="com.microsoft:timeout",
                    **_ids(messages),
                ) from None
            except asyncio.CancelledError:
                self._discard_sender(entity, f"{operation} was cancelled")
                raise
            except Exception as exc:
                if not is_sdk_error(exc):
                    raise
                error = map_error(
                    exc,
                    operation=operation,
                    entity=entity,
                    count=len(messages),
                    reached=opened,
                    **_ids(messages),
                )
                reason = "connection-level error" if is_connection_level(exc) else "failed call"
                self._discard_sender(entity, reason)
                raise error from None

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
        converted = [to_servicebus_message(m) for m in batch]

        async def transfer(sender: ServiceBusSender, left: float) -> None:
            payload = await self._batch(sender, entity, batch, converted)
            await sender.send_messages(payload, timeout=left)

        await self._guarded("send", entity, batch, timeout, transfer)
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
        """Close every sender, the client and the administration client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            self._open.clear()
            senders, self._senders = self._senders, {}
            for entity, sender in senders.items():
                await _close_quietly(sender, entity)
            if self._closing:
                await asyncio.gather(*self._closing, return_exceptions=True)
            for name, closable in (("client", self._client), ("admin client", self._admin)):
                if closable is None:
                    continue
                try:
                    await asyncio.wait_for(closable.close(), _CLOSE_TIMEOUT)
                except Exception as exc:
                    logger.debug("closing the %s failed: %s", name, redact(repr(exc)))

    async def __aenter__(self) -> AzureServiceBusBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        await self.close()
        return False

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
