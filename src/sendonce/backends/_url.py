"""``connect(url)``: one plain string names a backend, so Spark executors can rebuild it."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from .._extras import requires_extra
from ..errors import ConfigurationError, redact
from ._base import Backend
from .artemis._url import is_amqp_url

if TYPE_CHECKING:
    from .local import LocalBackend

__all__ = [
    "SCHEMES",
    "Scheme",
    "connect",
    "connect_local",
    "describe_url",
    "local_path",
    "scheme_for",
]

LOCAL_SCHEME = "local:"


LOCAL_OPTIONS = ("busy_timeout", "create", "durability", "read_only")
"""The query options a ``local:`` url may carry; anything else is refused, not ignored."""
_MAX_BUSY_TIMEOUT = 2_147_483  # seconds: SQLite takes a 32-bit count of milliseconds


def _local_options(url: str, query: str) -> dict[str, str]:
    """``name=value`` pairs, each known, given once, with a value: nothing guessed at."""
    options: dict[str, str] = {}
    for part in query.split("&") if query else []:
        name, equals, value = part.partition("=")
        name, value = unquote(name), unquote(value)
        if name not in LOCAL_OPTIONS:
            hint = "; a '?' in a file name must be written %3F" if not equals else ""
            raise ConfigurationError(
                f"local url {redact(url)!r}: unknown option {name!r} (the options are "
                f"{', '.join(LOCAL_OPTIONS)}){hint}",
                field="url",
            )
        if name in options:
            raise ConfigurationError(
                f"local url {redact(url)!r}: option {name!r} is given twice", field="url"
            )
        if not value:
            raise ConfigurationError(
                f"local url {redact(url)!r}: option {name!r} has no value", field="url"
            )
        if "\0" in value:
            raise ConfigurationError(
                f"local url {redact(url)!r}: option {name!r} contains a NUL character",
                field="url",
            )
        options[name] = value
    timeout = options.get("busy_timeout")
    if timeout is not None:
        try:
            seconds = float(timeout)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or not 0 < seconds <= _MAX_BUSY_TIMEOUT:
            raise ConfigurationError(
                f"local url {redact(url)!r}: option 'busy_timeout' must be a number of seconds "
                f"above 0 and at most {_MAX_BUSY_TIMEOUT} (about 24 days), got {timeout!r}",
                field="url",
            )
    return options


def local_path(url: str) -> tuple[str, dict[str, str]]:
    """The file path and query options of a ``local:`` url.

    ``local:///abs/path.db`` is absolute; ``local:relative/path.db`` is relative
    to the working directory (resolved here, so executors agree on it). What the
    parser does not understand is refused rather than guessed at: a ``#`` (it would
    end the file name: write ``%23``), an unknown, repeated or empty option (a ``?``
    in a file name is written ``%3F``), a NUL character.
    """
    if "#" in url:
        raise ConfigurationError(
            f"local url {redact(url)!r} contains '#', which would end the file name there "
            "(the rest is a url fragment); write a '#' in a file name as %23",
            field="url",
        )
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
    if "\0" in path:
        raise ConfigurationError(
            f"local url {redact(url)!r}: the file name contains a NUL character", field="url"
        )
    return os.path.abspath(path), _local_options(url, parts.query)


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


@dataclass(frozen=True, slots=True)
class Scheme:
    """One kind of url ``connect`` understands. The sync world opens it with ``open``;
    ``sendonce.aio.connect`` reads the same registry and opens it with its own opener of
    the same ``name`` (aio sits above backends, so its openers live there)."""

    name: str
    example: str
    """How the refusal of an unknown url names it."""
    matches: Callable[[str], bool]
    open: Callable[[str, dict[str, Any]], Backend]


def _open_local(url: str, options: dict[str, Any]) -> Backend:
    from .local import LocalBackend

    path, query = local_path(url)
    merged: dict[str, Any] = {**query, **options}
    return LocalBackend(path, **merged)


def _open_servicebus(url: str, options: dict[str, Any]) -> Backend:
    with requires_extra("a Service Bus connection string", "azure"):
        from .servicebus import AzureServiceBusBackend

    return AzureServiceBusBackend.from_connection_string(url, **options)


def _open_artemis(url: str, options: dict[str, Any]) -> Backend:
    with requires_extra("an amqp:// url (AMQ Broker / Apache ActiveMQ Artemis)", "artemis"):
        from .artemis import ArtemisBackend

    return ArtemisBackend.from_url(url, **options)


SCHEMES: tuple[Scheme, ...] = (
    Scheme(
        "local", "local:///path/broker.db", lambda url: url.startswith(LOCAL_SCHEME), _open_local
    ),
    Scheme(
        "servicebus",
        "a Service Bus connection string (Endpoint=sb://...)",
        is_connection_string,
        _open_servicebus,
    ),
    Scheme(
        "artemis", "an Artemis url (amqp://user:password@host:5672)", is_amqp_url, _open_artemis
    ),
)
"""Every url ``connect`` (sync and aio) understands, in the order they are tried."""


def scheme_for(url: object) -> tuple[Scheme, str]:
    """The scheme of ``url`` and the url stripped; ``ConfigurationError`` for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("url must be a non-empty str", field="url")
    url = url.strip()
    for scheme in SCHEMES:
        if scheme.matches(url):
            return scheme, url
    examples = [scheme.example for scheme in SCHEMES]
    expected = ", ".join(examples[:-1]) + " or " + examples[-1]
    raise ConfigurationError(
        f"unrecognised backend url {redact(url)[:80]!r}: expected {expected}", field="url"
    )


def connect(url: str, **options: Any) -> Backend:
    """Open the backend a url names.

    - ``local:///abs/path/broker.db`` or ``local:relative.db``: the embedded broker
      (query options such as ``?durability=full`` are passed to ``LocalBackend``).
    - ``Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...``: Azure
      Service Bus (or its emulator with ``UseDevelopmentEmulator=true``).
    - ``amqp://user:password@host:5672`` or ``amqps://...``: Red Hat AMQ Broker / Apache
      ActiveMQ Artemis (``ArtemisBackend``; the ``artemis`` extra).
    """
    scheme, url = scheme_for(url)
    return scheme.open(url, options)


def connect_local(url: str | os.PathLike[str], **options: Any) -> LocalBackend:
    """Open the embedded broker, typed as :class:`LocalBackend`.

    ``connect`` returns the ``Backend`` base class, so the local broker's own methods
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
