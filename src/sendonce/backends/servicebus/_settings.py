"""Options of a Service Bus backend, checked once for the sync and the ``aio`` backends.

Both backends take the same keyword options; only the client class (sync or
async) and the default credential differ, so they are parameters here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from azure.servicebus import parse_connection_string

from ..._entity import EntityKind, EntityProfile
from ..._names import ByName
from ...errors import ConfigurationError, redact
from ._lanes import DEFAULT_MAX_IN_FLIGHT, check_max_in_flight

__all__ = [
    "CLIENT_OPTIONS",
    "ServiceBusSettings",
    "MAX_IN_FLIGHT_KEY",
    "canonical_connection_string",
    "check_timeout",
    "is_emulator",
    "server_endpoint",
    "settle",
    "split_max_in_flight",
]

# The keyword options ServiceBusClient documents; anything else would be ignored silently.
CLIENT_OPTIONS = frozenset(
    {
        "connection_verify",
        "custom_endpoint_address",
        "http_proxy",
        "logging_enable",
        "retry_backoff_factor",
        "retry_backoff_max",
        "retry_mode",
        "retry_total",
        "socket_timeout",
        "ssl_context",
        "transport_type",
        "try_timeout",
        "uamqp_transport",
        "user_agent",
    }
)

# Connection-string keys, matched case-insensitively as the client does.
_KEYS = {
    k.lower(): k
    for k in (
        "Endpoint",
        "HostName",
        "SharedAccessKeyName",
        "SharedAccessKey",
        "SharedAccessSignature",
        "EntityPath",
        "UseDevelopmentEmulator",
    )
}
MAX_IN_FLIGHT_KEY = "MaxInFlight"
"""A sendonce part of a connection string (``...;MaxInFlight=32``), removed before the client
reads it: a Spark executor receives only the connection string, so the option travels in it."""

_SHAPE = (
    "expected Endpoint=sb://<namespace>/;SharedAccessKeyName=<name>;SharedAccessKey=<key> "
    "(or SharedAccessSignature=...; add UseDevelopmentEmulator=true for the emulator)"
)


def canonical_connection_string(conn_str: str) -> str:
    """``conn_str`` with its keys spelled canonically, or a ``ConfigurationError`` naming
    the missing or unknown key (never showing a secret)."""
    parts: dict[str, str] = {}
    for raw in conn_str.strip().strip(";").split(";"):
        if not raw.strip():
            continue
        key, sep, value = raw.partition("=")
        name = _KEYS.get(key.strip().lower())
        if not sep or name is None:
            shown = key.strip()[:40] if sep else "a part without '='"
            raise ConfigurationError(
                f"connection_string has an unknown part {shown!r}; known keys are "
                f"{', '.join(_KEYS.values())} (any case)",
                field="connection_string",
            )
        if name in parts:
            raise ConfigurationError(
                f"connection_string names {name} twice", field="connection_string"
            )
        parts[name] = value.strip()
    if not parts.get("Endpoint") and not parts.get("HostName"):
        raise ConfigurationError(
            f"connection_string has no Endpoint part: {_SHAPE}",
            field="connection_string",
        )
    if "SharedAccessSignature" not in parts:
        for needed in ("SharedAccessKeyName", "SharedAccessKey"):
            if not parts.get(needed):
                raise ConfigurationError(
                    f"connection_string has no {needed} part: {_SHAPE}", field="connection_string"
                )
    return ";".join(f"{k}={v}" for k, v in parts.items())


def split_max_in_flight(conn_str: str) -> tuple[str, int | None]:
    """``conn_str`` without its ``MaxInFlight=N`` part (any case), and that N if present."""
    kept: list[str] = []
    found: int | None = None
    for raw in conn_str.strip().strip(";").split(";"):
        key, sep, value = raw.partition("=")
        if sep and key.strip().lower() == MAX_IN_FLIGHT_KEY.lower():
            if found is not None:
                raise ConfigurationError(
                    f"connection_string names {MAX_IN_FLIGHT_KEY} twice", field="max_in_flight"
                )
            found = check_max_in_flight(value)
        else:
            kept.append(raw)
    return ";".join(kept), found


def check_timeout(timeout: object) -> float:
    """A positive finite number of seconds: a call without a bound can hang."""
    if (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or not timeout > 0
        or timeout != timeout
        or timeout == float("inf")
    ):
        raise ConfigurationError(
            f"timeout must be a positive finite number of seconds, got {timeout!r}: a call "
            "without a bound can hang when no disposition arrives",
            field="timeout",
        )
    return float(timeout)


def is_emulator(conn_str: str) -> bool:
    """The same test the client applies (UseDevelopmentEmulator=true, key case-insensitive)."""
    for part in conn_str.strip().rstrip(";").split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "usedevelopmentemulator":
            return value.strip() == "true"
    return False


@dataclass
class ServiceBusSettings:
    """Everything a backend needs from its constructor's options."""

    client: Any
    namespace: str
    credential: Any
    link_timeout: float
    admin_timeout: float
    max_batch_size: int | None
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    profiles: ByName[EntityProfile] = field(default_factory=ByName)
    kinds: ByName[EntityKind] = field(default_factory=ByName)
    connection_string: str | None = None
    emulator: bool = False
    entity_path: str | None = None


def server_endpoint(namespace: str, client: Any) -> tuple[str, int | None]:
    """(host, port) the client connects to: OpenTelemetry's ``server.address`` and
    ``server.port`` on the sender's spans and metrics. The port is the namespace's own
    (the emulator's ``host:port``), else the client's transport's: 443 over websockets or a
    custom endpoint, 5672 without TLS (the emulator), 5671 (AMQPS) otherwise."""
    parts = urlsplit(f"sb://{namespace}")
    try:
        host, port = parts.hostname or namespace, parts.port
    except ValueError:  # not a port: keep the text as the namespace gave it
        return namespace, None
    config = getattr(client, "_config", None)
    custom = getattr(config, "custom_endpoint_hostname", None)
    if isinstance(custom, str) and custom:
        configured = getattr(config, "connection_port", None)
        return custom, configured if isinstance(configured, int) else None
    if port is not None or config is None:
        return host, port
    transport = getattr(getattr(config, "transport_type", None), "name", "")
    if transport == "AmqpOverWebsocket":
        return host, 443
    return host, 5671 if getattr(config, "use_tls", True) else 5672


def settle(
    *,
    client_class: Any,
    default_credential: Callable[[], Any],
    client: Any,
    fully_qualified_namespace: str | None,
    credential: Any,
    connection_string: str | None,
    profiles: Mapping[str, EntityProfile] | None,
    kinds: Mapping[str, EntityKind] | None,
    transport_type: Any,
    link_timeout: float,
    admin_timeout: float,
    max_batch_size: int | None,
    client_kwargs: dict[str, Any],
    max_in_flight: int | None = None,
) -> ServiceBusSettings:
    """Check the options and build the client with its own retries off."""
    sources = sum(x is not None for x in (client, fully_qualified_namespace, connection_string))
    if sources != 1:
        raise ConfigurationError(
            "give exactly one of client=, connection_string= or fully_qualified_namespace=",
            field="connection_string",
        )
    link = check_timeout(link_timeout)
    admin = check_timeout(admin_timeout)
    if max_batch_size is not None and (
        not isinstance(max_batch_size, int)
        or isinstance(max_batch_size, bool)
        or max_batch_size < 1024
    ):
        raise ConfigurationError(
            "max_batch_size must be an int of at least 1024 bytes or None", field="max_batch_size"
        )
    unknown = sorted(set(client_kwargs) - CLIENT_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"unknown Service Bus backend option {unknown[0]!r}: the backend takes profiles, "
            "kinds, link_timeout, admin_timeout, max_batch_size, max_in_flight, transport_type "
            "and the "
            f"ServiceBusClient options {', '.join(sorted(CLIENT_OPTIONS))}",
            field=unknown[0],
        )
    retries = client_kwargs.pop("retry_total", 0)
    if retries != 0:
        raise ConfigurationError(
            f"retry_total={retries!r}: the client's own retries must stay off; sendonce's "
            "RetryPolicy is the only retry loop (it knows the duplicate-detection window)",
            field="retry_total",
        )
    lanes = None if max_in_flight is None else check_max_in_flight(max_in_flight)
    known_profiles, known_kinds = _entities(profiles, kinds)
    options: dict[str, Any] = dict(client_kwargs)
    options["retry_total"] = 0
    options.setdefault("try_timeout", link)
    if transport_type is not None:
        options["transport_type"] = transport_type

    settings = ServiceBusSettings(
        client=None,
        namespace="?",
        credential=credential,
        link_timeout=link,
        admin_timeout=admin,
        max_batch_size=max_batch_size,
        max_in_flight=lanes if lanes is not None else DEFAULT_MAX_IN_FLIGHT,
        profiles=known_profiles,
        kinds=known_kinds,
    )
    if client is not None:
        configured = getattr(getattr(client, "_config", None), "retry_total", 0)
        if configured != 0:
            raise ConfigurationError(
                f"the given ServiceBusClient retries by itself (retry_total={configured}); "
                "build it with retry_total=0 so sendonce owns the retry budget",
                field="client",
            )
        settings.client = client
        namespace = str(getattr(client, "fully_qualified_namespace", "?"))
    elif connection_string is not None:
        if not isinstance(connection_string, str):
            raise ConfigurationError("connection_string must be a str", field="connection_string")
        connection_string, in_string = split_max_in_flight(connection_string)
        if in_string is not None:
            if lanes is not None and lanes != in_string:
                raise ConfigurationError(
                    f"max_in_flight={lanes} disagrees with the connection string's "
                    f"{MAX_IN_FLIGHT_KEY}={in_string}",
                    field="max_in_flight",
                )
            settings.max_in_flight = in_string
        connection_string = canonical_connection_string(connection_string)
        try:
            props = parse_connection_string(connection_string)
        except (ValueError, TypeError, KeyError, AttributeError):
            raise ConfigurationError(
                "connection_string is malformed: expected "
                "Endpoint=sb://<namespace>/;SharedAccessKeyName=<name>;SharedAccessKey=<key> "
                "(or SharedAccessSignature=...; add UseDevelopmentEmulator=true for the "
                "emulator)",
                field="connection_string",
            ) from None
        settings.connection_string = connection_string
        settings.emulator = is_emulator(connection_string)
        settings.entity_path = props.entity_path or None
        namespace = props.fully_qualified_namespace
        try:
            settings.client = client_class.from_connection_string(connection_string, **options)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"cannot build a Service Bus client: {redact(str(exc))}",
                field="connection_string",
            ) from None
    else:
        if not isinstance(fully_qualified_namespace, str) or not fully_qualified_namespace:
            raise ConfigurationError(
                "fully_qualified_namespace must be a non-empty str",
                field="fully_qualified_namespace",
            )
        if credential is None:
            settings.credential = default_credential()
        namespace = fully_qualified_namespace
        settings.client = client_class(fully_qualified_namespace, settings.credential, **options)
    # parse_connection_string keeps any user:password@ of the endpoint: never keep it.
    settings.namespace = namespace.rpartition("@")[2]
    return settings


def _entities(
    profiles: Mapping[str, EntityProfile] | None, kinds: Mapping[str, EntityKind] | None
) -> tuple[ByName[EntityProfile], ByName[EntityKind]]:
    """The explicit profiles and kinds by entity name, which ignores case as on Service Bus."""
    known_profiles: ByName[EntityProfile] = ByName()
    known_kinds: ByName[EntityKind] = ByName()
    for name, profile in (profiles or {}).items():
        if not isinstance(profile, EntityProfile):
            raise ConfigurationError(
                f"profiles[{name!r}] must be an EntityProfile", field="profiles"
            )
        if profile.name != name:
            raise ConfigurationError(
                f"profiles[{name!r}] describes entity {profile.name!r}", field="profiles"
            )
        _one_spelling(known_profiles, name, "profiles")
        known_profiles[name] = profile
        known_kinds[name] = profile.kind
    for name, kind in (kinds or {}).items():
        if kind not in ("queue", "topic"):
            raise ConfigurationError(
                f"kinds[{name!r}] must be 'queue' or 'topic', got {kind!r}", field="kinds"
            )
        known_kinds[name] = kind
    return known_profiles, known_kinds


def _one_spelling(known: ByName[EntityProfile], name: str, option: str) -> None:
    """Two keys for one entity (``Orders`` and ``orders``) would leave which one wins to
    the dict's order: refused, naming both."""
    if name in known:
        first = known[name].name
        raise ConfigurationError(
            f"{option} names entity {first!r} twice, as {first!r} and {name!r}: entity names "
            "ignore case on Service Bus, so both are one entity; give one",
            field=option,
        )
