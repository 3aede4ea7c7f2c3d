"""``amqp://user:password@host:port`` / ``amqps://...``: the url of an Artemis broker.

Parsed with ``urllib.parse``; what it does not understand is refused, not guessed at. The
user name and password may be percent-encoded (``%40`` for ``@``). Query options are the
backend's keyword options that a plain string can carry: ``max_in_flight``,
``resend_reach``, ``connect_timeout``, ``management_timeout``, ``heartbeat``, and
``ca_file`` (a PEM file of CAs to trust for ``amqps``: ``?ca_file=/etc/broker-ca.pem``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import ConfigurationError, redact

__all__ = ["AMQP_SCHEMES", "is_amqp_url", "parse_amqp_url"]

AMQP_SCHEMES = ("amqp", "amqps")
_TEXTS = {"ca_file": str}
_NUMBERS = {
    "max_in_flight": int,
    "resend_reach": float,
    "connect_timeout": float,
    "management_timeout": float,
    "heartbeat": float,
}


def is_amqp_url(url: str) -> bool:
    return url.split(":", 1)[0].lower() in AMQP_SCHEMES and "://" in url


def parse_amqp_url(url: str) -> dict[str, Any]:
    """The ``ArtemisBackend`` keyword arguments an ``amqp(s)://`` url names."""
    shown = redact(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(
            f"Artemis url {shown!r}: {redact(str(exc))}", field="url"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in AMQP_SCHEMES:
        raise ConfigurationError(
            f"Artemis url {shown!r} must start with amqp:// or amqps://", field="url"
        )
    if not parts.hostname:
        raise ConfigurationError(f"Artemis url {shown!r} names no host", field="url")
    if parts.path not in ("", "/"):
        raise ConfigurationError(
            f"Artemis url {shown!r} has a path {parts.path!r}: the address is the entity "
            "given to the sender, not part of the url",
            field="url",
        )
    if parts.fragment:
        raise ConfigurationError(f"Artemis url {shown!r} has a '#' fragment", field="url")
    options: dict[str, Any] = {"host": parts.hostname, "tls": scheme == "amqps"}
    if port is not None:
        options["port"] = port
    if parts.username:
        options["user"] = unquote(parts.username)
        options["password"] = unquote(parts.password) if parts.password is not None else None
    elif parts.password is not None:
        raise ConfigurationError(f"Artemis url {shown!r} has a password but no user", field="url")
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        convert = _NUMBERS.get(name) or _TEXTS.get(name)
        if convert is None:
            raise ConfigurationError(
                f"Artemis url {shown!r}: unknown option {name!r} (the options are "
                f"{', '.join([*_NUMBERS, *_TEXTS])})",
                field="url",
            )
        if name in options:
            raise ConfigurationError(
                f"Artemis url {shown!r}: option {name!r} is given twice", field="url"
            )
        try:
            options[name] = convert(value)
        except ValueError:
            raise ConfigurationError(
                f"Artemis url {shown!r}: option {name!r} must be a number, got {value!r}",
                field="url",
            ) from None
    return options
