"""``sendonce.aio``: the asyncio mirror of the sync API, for async producers.

Web services publishing from an event loop (FastAPI, aiohttp) use the same
rules as the sync sender; only the transport is awaited::

    from sendonce.aio import IdempotentSender, connect

    async with IdempotentSender(connect(url), "orders") as sender:
        result = await sender.send(message)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import AsyncBackend
from ._connect import connect
from ._sender import IdempotentSender, Transaction
from ._threaded import ThreadedBackend

if TYPE_CHECKING:
    from ..backends.servicebus._aio import AzureServiceBusBackend

__all__ = [
    "AsyncBackend",
    "AzureServiceBusBackend",
    "IdempotentSender",
    "ThreadedBackend",
    "Transaction",
    "connect",
]


def __getattr__(name: str) -> Any:
    # The Service Bus backend imports azure-servicebus, an optional extra: load on use.
    if name == "AzureServiceBusBackend":
        from .._extras import requires_extra

        with requires_extra("sendonce.aio.AzureServiceBusBackend", "aio"):
            from ..backends.servicebus._aio import AzureServiceBusBackend

        return AzureServiceBusBackend
    raise AttributeError(f"module 'sendonce.aio' has no attribute {name!r}")
