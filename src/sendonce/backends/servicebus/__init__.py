"""Azure Service Bus: both halves of the backend in one room.

- ``_sync``: :class:`AzureServiceBusBackend` on ``azure.servicebus`` (this module's public name);
- ``_aio``: ``sendonce.aio.AzureServiceBusBackend`` on ``azure.servicebus.aio``;
- ``_lanes``: the pool of sender links per entity both halves lend from;
- ``_settings``: options, connection strings and the client they build;
- ``_convert``: ``Message`` to ``ServiceBusMessage`` and back;
- ``_errors``: every client exception mapped to a sendonce error.

The backend classes load on first use: ``azure-servicebus`` is an optional extra, and the
lane pool (no Azure import) is shared with the Artemis backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._sync import AzureServiceBusBackend

__all__ = ["AzureServiceBusBackend"]


def __getattr__(name: str) -> Any:
    if name == "AzureServiceBusBackend":
        from ..._extras import requires_extra

        with requires_extra("sendonce.backends.servicebus.AzureServiceBusBackend", "azure"):
            from ._sync import AzureServiceBusBackend

        return AzureServiceBusBackend
    raise AttributeError(f"module 'sendonce.backends.servicebus' has no attribute {name!r}")
