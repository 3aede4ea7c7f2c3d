"""Whether a backend's lanes share one connection, and the way back to one per lane.

The shared connection is built on azure-servicebus's private pyamqp layer, so it is used
only with the releases it was tested with; any other release, the uamqp transport, AMQP
over websockets (its transport is not the one whose writes ``_connection`` separates), or
``connection_sharing=False`` / ``SENDONCE_SERVICEBUS_CONNECTION_SHARING=0`` keep today's
path: one connection per lane.
"""

from __future__ import annotations

import logging
import os
from importlib import metadata
from typing import Any

from ...errors import ConfigurationError

__all__ = ["ENV_VAR", "TESTED_RELEASES", "sharing_enabled"]

logger = logging.getLogger("sendonce.servicebus")

ENV_VAR = "SENDONCE_SERVICEBUS_CONNECTION_SHARING"
TESTED_RELEASES = ((7, 15),)
"""The azure-servicebus (major, minor) releases the shared connection was tested with."""

_OFF = {"0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on"}


def _release() -> tuple[int, int] | None:
    try:
        parts = metadata.version("azure-servicebus").split(".")
        return int(parts[0]), int(parts[1])
    except (metadata.PackageNotFoundError, ValueError, IndexError):
        return None


def sharing_enabled(option: object, client: Any) -> bool:
    """``option`` (``connection_sharing=``), else the environment, else on; then the checks
    that fall back to a connection per lane."""
    if option is not None and not isinstance(option, bool):
        raise ConfigurationError(
            f"connection_sharing must be True, False or None, got {option!r}",
            field="connection_sharing",
        )
    wanted = option
    if wanted is None:
        raw = os.environ.get(ENV_VAR, "").strip().lower()
        if raw and raw not in _OFF | _ON:
            raise ConfigurationError(
                f"{ENV_VAR} must be 0 or 1 (or true/false), got {raw!r}",
                field="connection_sharing",
            )
        wanted = raw not in _OFF
    if not wanted:
        return False
    release = _release()
    why = None
    if release not in TESTED_RELEASES:
        why = f"azure-servicebus {release} is not a release it was tested with"
    elif (
        getattr(client, "_amqp_transport", None) is None or client._amqp_transport.KIND != "pyamqp"
    ):
        why = "the client uses the uamqp transport"
    elif getattr(getattr(client, "_config", None), "transport_type", None) is not None and (
        client._config.transport_type.name != "Amqp"
    ):
        why = "AMQP over websockets"
    if why is not None:
        logger.info("one connection per lane: %s", why)
        return False
    return True
