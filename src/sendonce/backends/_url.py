"""``connect(url)``: one plain string names a backend, so Spark executors can rebuild it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .._extras import requires_extra
from ..errors import ConfigurationError, redact
from ._base import Backend

if TYPE_CHECKING:
    from .local import LocalBackend

__all__ = ["connect", "connect_local", "describe_url", "local_path"]

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


_CONNECTION_KEYS = frozenset(
    {"endpoint", "sharedaccesskeyname", "sharedaccesskey", "sharedaccesssignature"}
)


def is_connection_string(url: str) -> bool:
    """A Service Bus connection string: ``Key=value`` parts such as ``Endpoint=sb://...``
    (keys in any case, as the client reads them)."""
    return any(
        "=" in part and part.partition("=")[0].strip().lower() in _CONNECTION_KEYS
        for part in url.split(";")
    )


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


def connect_local(url: str | os.PathLike[str], **options: Any) -> LocalBackend:
    """Open the embedded broker, typed as :class:`LocalBackend`.

    ``connect`` returns the ``Backend`` protocol, so the local broker's own methods
    (``receive``, ``peek``, ``message_ids``) do not type-check on its result; this
    takes a ``local:`` url or a plain path and returns the concrete type.
    """
    from .local import LocalBackend

    if isinstance(url, str) and url.strip().startswith(LOCAL_SCHEME):
        path, query = local_path(url.strip())
        return LocalBackend(path, **{**query, **options})
    if isinstance(url, str) and is_connection_string(url):
        raise ConfigurationError(
            "connect_local opens the local broker; use connect() for a Service Bus connection "
            "string",
            field="url",
        )
    return LocalBackend(url, **options)


def describe_url(url: str) -> str:
    """A printable form of ``url`` with every secret masked."""
    return redact(url)
