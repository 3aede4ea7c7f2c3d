"""Backends: the transfer seam (``Backend``, ``AsyncBackend``, ``Capabilities``),
``connect(url)``, and the shipped backends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import Ack, AckOutcome, AsyncBackend, Backend, Capabilities, capabilities_of, submit_of
from ._url import connect, connect_local, describe_url

if TYPE_CHECKING:
    from .artemis import ArtemisBackend
    from .local import LocalBackend, LocalSession, ReceivedMessage
    from .servicebus import AzureServiceBusBackend

__all__ = [
    "Ack",
    "AckOutcome",
    "ArtemisBackend",
    "AsyncBackend",
    "AzureServiceBusBackend",
    "Backend",
    "Capabilities",
    "LocalBackend",
    "LocalSession",
    "ReceivedMessage",
    "capabilities_of",
    "connect",
    "connect_local",
    "describe_url",
    "submit_of",
]


def __getattr__(name: str) -> Any:
    # The Service Bus backend imports azure-servicebus, an optional extra: load on use.
    if name in ("LocalBackend", "LocalSession", "ReceivedMessage"):
        from . import local

        return getattr(local, name)
    if name == "AzureServiceBusBackend":
        from .._extras import requires_extra

        with requires_extra("sendonce.backends.AzureServiceBusBackend", "azure"):
            from .servicebus import AzureServiceBusBackend

        return AzureServiceBusBackend
    if name == "ArtemisBackend":
        from .._extras import requires_extra

        with requires_extra("sendonce.backends.ArtemisBackend", "artemis"):
            from .artemis import ArtemisBackend

        return ArtemisBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
