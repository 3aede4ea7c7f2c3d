"""``connect(url)`` for event loops: the same urls as :func:`sendonce.backends.connect`."""

from __future__ import annotations

from typing import Any

from .._extras import requires_extra
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
    raise ConfigurationError(
        f"unrecognised backend url {redact(url)[:80]!r}: expected local:///path/broker.db or a "
        "Service Bus connection string (Endpoint=sb://...)",
        field="url",
    )
