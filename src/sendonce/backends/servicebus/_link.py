"""A lane on the shared connection: one sender link, used from the sync backend's threads.

It answers the calls the backend makes on a ``ServiceBusSender`` (``create_message_batch``,
``send_messages``, ``close``), so the backend's send path is the same for a lane of its own
connection and a lane on the shared one. The work runs on the connection loop (``_loop``);
every call is bounded by its timeout there, so opening needs no helper thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus._common.constants import (
    JWT_TOKEN_SCOPE,
    MAX_BATCH_SIZE_PREMIUM,
    MAX_BATCH_SIZE_STANDARD,
    MAX_MESSAGE_LENGTH_BYTES,
    TOKEN_TYPE_JWT,
    TOKEN_TYPE_SASTOKEN,
)
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._pyamqp.authentication import JWTTokenAuth
from azure.servicebus._pyamqp.error import AMQPException
from azure.servicebus._pyamqp.message import BatchMessage
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.exceptions import OperationTimeoutError

from . import _loop
from ._connection import SharedConnection

__all__ = ["AsyncSharedLink", "SharedLink"]

logger = logging.getLogger("sendonce.servicebus")

_GRACE = 2.0
"""The loop bounds each call itself; this backstop only guards against a stuck loop."""
_BATCH_SIZE_KEYS = (b"com.microsoft:max-message-batch-size", "com.microsoft:max-message-batch-size")


def _batch_limit(link: Any) -> int:
    """The batch size limit of an attached link: the vendor property, else the client's rule."""
    size = link.remote_max_message_size or MAX_MESSAGE_LENGTH_BYTES
    vendor = None
    for key in _BATCH_SIZE_KEYS:
        vendor = (link.remote_properties or {}).get(key) or vendor
    if vendor is not None:
        return int(vendor)
    return MAX_BATCH_SIZE_PREMIUM if size >= MAX_BATCH_SIZE_PREMIUM else MAX_BATCH_SIZE_STANDARD


def _empty_batch(limit: int, max_size_in_bytes: int | None) -> ServiceBusMessageBatch:
    if max_size_in_bytes and max_size_in_bytes > limit:
        raise ValueError(
            f"Max message size: {max_size_in_bytes} is too large, "
            f"acceptable max batch size is: {limit} bytes."
        )
    return ServiceBusMessageBatch(
        max_size_in_bytes=max_size_in_bytes or limit, amqp_transport=PyamqpTransport
    )


def _wire_message(payload: Any) -> Any:
    """The pyamqp message of one ``ServiceBusMessage`` or one batch (what the client sends)."""
    if isinstance(payload, ServiceBusMessageBatch):
        return BatchMessage(*payload._message)
    converted = transform_outbound_messages(
        payload, ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message
    )
    return converted._message  # type: ignore[union-attr]


def _token_auth(client_sender: Any) -> Any:
    """The token source of ``client_sender``'s entity, as the sync client builds it (the aio
    client's names a SAS token "jwt"); an async credential's ``get_token`` is awaited."""
    credential = client_sender._credential
    token_type = getattr(credential, "token_type", TOKEN_TYPE_JWT)
    scope = client_sender._auth_uri if token_type == TOKEN_TYPE_SASTOKEN else JWT_TOKEN_SCOPE
    return JWTTokenAuth(
        client_sender._auth_uri,
        client_sender._auth_uri,
        functools.partial(credential.get_token, scope),
        token_type=token_type,
    )


class _LinkState:
    """What a sync and an aio shared link both hold: the connection, the client's unopened
    sender (address, token audience, token source), and the attached link with the
    connection's generation it belongs to (a link of a lost connection is not opened)."""

    def __init__(self, shared: SharedConnection, client_sender: Any) -> None:
        self._shared = shared
        self._client_sender = client_sender
        self._auth: Any = None
        self._link: Any = None
        self._generation = -1
        self._max_batch = MAX_BATCH_SIZE_STANDARD

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._client_sender.entity_name!r}, opened={self.opened})"

    @property
    def opened(self) -> bool:
        """Whether the link is attached on the connection as it is now."""
        return self._link is not None and self._shared.link_alive(self._link, self._generation)


class SharedLink(_LinkState):
    """One sender link to one entity on a :class:`SharedConnection`, one transfer at a time.

    ``client_sender`` is the client's ``ServiceBusSender`` for the entity, never opened: it
    gives the link's address, the token audience and the client's token source.
    """

    def open(self, timeout: float) -> None:
        """Attach the link (connecting and authorising first if needed) within ``timeout``.

        Nothing is sent while a link opens: any failure here is ``NotWritten``'s kind.
        """
        if self.opened:
            return
        if self._auth is None:
            self._auth = _token_auth(self._client_sender)
        try:
            self._link, self._generation = _loop.run(
                self._shared.open_link(self._client_sender._entity_uri, self._auth, timeout),
                timeout + _GRACE,
            )
        except AMQPException as exc:  # pyamqp's own: the client's class for it, as it raises
            raise PyamqpTransport.create_servicebus_exception(logger, exc) from None
        self._max_batch = _batch_limit(self._link)

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        """An empty batch sized to the link's limit (the client's rule)."""
        return _empty_batch(self._max_batch, max_size_in_bytes)

    def send_messages(self, payload: Any, *, timeout: float) -> None:
        """Send one message or one batch as one transfer; raise the client's errors, or
        ``NotWritten`` when nothing can have left the process."""
        message = _wire_message(payload)
        try:
            _loop.run(
                self._shared.transfer(self._link, self._generation, message, timeout),
                timeout + _GRACE,
            )
        except TimeoutError:
            # The loop did not answer in time: whether it wrote the transfer is unknown.
            raise OperationTimeoutError(message="Send operation timed out") from None

    def close(self) -> None:
        """Detach the link and end its session; the connection stays for the other lanes."""
        link, self._link = self._link, None
        if link is not None:
            try:
                _loop.run(self._shared.close_link(link), 3.0 + _GRACE)
            except Exception as exc:  # a dead link is dropped either way
                logger.debug("closing a shared link failed: %s", type(exc).__name__)
        try:
            self._client_sender.close()
        except Exception as exc:
            logger.debug("closing the client's sender failed: %s", type(exc).__name__)


class AsyncSharedLink(_LinkState):
    """:class:`SharedLink` for the aio backend: the same link on the same connection, awaited
    from the caller's event loop (the work runs on the connection loop's thread)."""

    async def open(self, timeout: float) -> None:
        """Attach the link within ``timeout`` (the caller bounds it too)."""
        if self.opened:
            return
        if self._auth is None:
            self._auth = _token_auth(self._client_sender)
        target = self._client_sender._entity_uri
        try:
            self._link, self._generation = await _loop.awaited(
                self._shared.open_link(target, self._auth, timeout)
            )
        except AMQPException as exc:
            raise PyamqpTransport.create_servicebus_exception(logger, exc) from None
        self._max_batch = _batch_limit(self._link)

    async def create_message_batch(
        self, max_size_in_bytes: int | None = None
    ) -> ServiceBusMessageBatch:
        """An empty batch sized to the link's limit (the client's rule)."""
        return _empty_batch(self._max_batch, max_size_in_bytes)

    async def send_messages(self, payload: Any, *, timeout: float) -> None:
        """As :meth:`SharedLink.send_messages`, awaited."""
        message = _wire_message(payload)
        await _loop.awaited(self._shared.transfer(self._link, self._generation, message, timeout))

    async def close(self) -> None:
        """Detach the link and end its session; the connection stays for the other lanes."""
        link, self._link = self._link, None
        if link is not None:
            try:
                await asyncio.wait_for(_loop.awaited(self._shared.close_link(link)), 3.0 + _GRACE)
            except Exception as exc:  # a dead link is dropped either way
                logger.debug("closing a shared link failed: %s", type(exc).__name__)
        try:
            await self._client_sender.close()
        except Exception as exc:
            logger.debug("closing the client's sender failed: %s", type(exc).__name__)
