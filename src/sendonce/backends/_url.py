"""``connect(url)``: one plain string names a backend, so Spark executors can rebuild it."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .._extras import requires_extra
from ..errors import ConfigurationError, redact
from ._base import Backend

__all__ = ["connect", "describe_url", "local_path"]

LOCAL_SCHEME = "local:"


def local_path(url: str) -> tuple[str, dict[str, str]]:
    """The file path and query options of a ``local:`` url.

    ``local:///abs/path.db`` is absolute; ``local:relative/path.db`` is relative
    to the working directory (resolved here, so executors agree on it).
    """
    parts = urlsplit(url)
    if parts.scheme != "local":
        raise ConfigurationError(f"not a local: url: {redact(url)!r}", field="url")
    if parts.netloc not in ("", "localhost"):
        raise ConfigurationError(
            f"local url {redact(url)!r} names host {parts.hostname!r}; "
            "use local:///absolute/path.db",
            field="url",
        )
    path = unquote(parts.path)
    if not path or path.endswith("/"):
        raise ConfigurationError(f"local url {redact(url)!r} names no broker file", field="url")
    return os.path.abspath(path), dict(parse_qsl(parts.query))


def is_connection_string(url: str) -> bool:
    """Service Bus connection strings start with (or contain) ``Endpoint=sb://``."""
    return url.startswith("Endpoint=") or ";Endpoint=" in url


def connect(url: str, **options: Any) -> Backend:
    """Open the backend a url names.

    - ``local:///abs/path/broker.db`` or ``local:relative.db``: the embedded broker
      (query options such as ``?durability=full`` are passed to ``LocalBackend``).
    - ``Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...``: Azure
      Service Bus (or its emulator with ``UseDevelopmentEmulator=true``).
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("url must be a non-empty str", field="url")
    url = url.strip()
    if url.startswith(LOCAL_SCHEME):
        from .local import LocalBackend

        path, query = local_path(url)
        merged: dict[str, Any] = {**query, **options}
        return LocalBackend(path, **merged)
    if is_connection_string(url):
        with requires_extra("a Service Bus connection string", "azure"):
            from .servicebus import AzureServiceBusBackend

        return AzureServiceBusBackend.from_connection_string(url, **options)
    raise ConfigurationError(
        f"unrecognised backend url {redact(url)[:80]!r}: expected local:///path/broker.db or a "
        "Service Bus connection string (Endpoint=sb://...)",
        field="url",
    )


def describe_url(url: str) -> str:
    """A printable form of ``url`` with every secret masked."""
    return redact(url)
