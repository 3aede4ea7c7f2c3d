"""``connect(url)`` for event loops: the same urls as :func:`sendonce.backends.connect`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._extras import requires_extra
from ..backends._url import SCHEMES, scheme_for
from ._base import AsyncBackend

__all__ = ["connect"]


def connect(url: str, **options: Any) -> AsyncBackend:
    """Open the async backend a url names.

    - ``local:///abs/path/broker.db``: the embedded broker, as a
      :class:`~sendonce.aio.ThreadedBackend` over ``LocalBackend`` (SQLite has no
      async driver; its calls run on one worker thread). Opening the file here
      is a short blocking call.
    - ``Endpoint=sb://...``: :class:`sendonce.aio.AzureServiceBusBackend` on
      ``azure.servicebus.aio`` (no I/O until the first call).
    - ``amqp://user:password@host:5672`` / ``amqps://``: AMQ Broker / Artemis, as a
      :class:`~sendonce.aio.ThreadedBackend` over ``ArtemisBackend`` with one worker per
      transfer in flight (the backend runs its own proton event loop; a call only hands it
      work and waits, so calls run side by side); its ``submit`` takes no worker at all (the
      loop's future, followed on this event loop).

    The schemes are :data:`sendonce.backends._url.SCHEMES`, the sync ``connect``'s; each has
    its opener here.
    """
    scheme, url = scheme_for(url)
    return OPENERS[scheme.name](url, options)


def _open_local(url: str, options: dict[str, Any]) -> AsyncBackend:
    from ._threaded import ThreadedBackend

    return ThreadedBackend(SCHEMES_BY_NAME["local"].open(url, options))


def _open_servicebus(url: str, options: dict[str, Any]) -> AsyncBackend:
    with requires_extra("a Service Bus connection string in sendonce.aio", "aio"):
        from ..backends.servicebus._aio import AzureServiceBusBackend

    return AzureServiceBusBackend.from_connection_string(url, **options)


def _open_artemis(url: str, options: dict[str, Any]) -> AsyncBackend:
    from ._threaded import ThreadedBackend

    artemis = SCHEMES_BY_NAME["artemis"].open(url, options)
    return ThreadedBackend(artemis, workers=artemis.capabilities.max_in_flight)


SCHEMES_BY_NAME = {scheme.name: scheme for scheme in SCHEMES}
OPENERS: dict[str, Callable[[str, dict[str, Any]], AsyncBackend]] = {
    "local": _open_local,
    "servicebus": _open_servicebus,
    "artemis": _open_artemis,
}
"""The aio opener of each scheme of :data:`sendonce.backends._url.SCHEMES` (one each)."""
