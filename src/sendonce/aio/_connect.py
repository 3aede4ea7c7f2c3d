"""``connect(url)`` for event loops: the same urls as :func:`sendonce.backends.connect`."""

from __future__ import annotations

from typing import Any

from .._extras import requires_extra
from ..backends._artemis_url import is_amqp_url
from ..backends._url import LOCAL_SCHEME, is_connection_string, local_path
from ..errors import ConfigurationError, redact
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
      work and waits, so calls run side by side).
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("url must be a non-empty str", field="url")
    url = url.strip()
    if url.startswith(LOCAL_SCHEME):
        from ..backends.local import LocalBackend
        from ._threaded import ThreadedBackend

        path, query = local_path(url)
        return ThreadedBackend(LocalBackend(path, **{**query, **options}))
    if is_connection_string(url):
        with requires_extra("a Service Bus connection string in sendonce.aio", "aio"):
            from ._servicebus import AzureServiceBusBackend

        return AzureServiceBusBackend.from_connection_string(url, **options)
    if is_amqp_url(url):
        with requires_extra("an amqp:// url (AMQ Broker / Apache ActiveMQ Artemis)", "artemis"):
            from ..backends.artemis import ArtemisBackend
        from ._threaded import ThreadedBackend

        artemis = ArtemisBackend.from_url(url, **options)
        return ThreadedBackend(artemis, workers=artemis.max_in_flight)
    raise ConfigurationError(
        f"unrecognised backend url {redact(url)[:80]!r}: expected local:///path/broker.db, a "
        "Service Bus connection string (Endpoint=sb://...) or an Artemis url "
        "(amqp://user:password@host:5672)",
        field="url",
    )
