"""What still imports the old path: the names the backends use (``lane_wait``, the
propagation property names), re-exported from the sender's edge
(``sendonce._sender_telemetry``, ``sendonce._propagation``), the core's switch (``use``,
``reset``), and the outbox relay's instruments (``active``, ``relay_batch``,
``relay_backlog``) until they move into the outbox package.

Each feature declares its own instruments at its own edge on the featureless core
(``sendonce.telemetry._core``): the sender beside its core, the ledger in
``sendonce.ledger._telemetry``, Spark in ``sendonce.spark._telemetry``, the command line in
``sendonce.cli._otel``. Nothing new belongs here.
"""

from __future__ import annotations

from typing import Any

from ._propagation import PROPAGATION_PROPERTIES, TRACEPARENT
from ._sender_telemetry import lane_wait
from .telemetry import _core
from .telemetry._core import (
    DESTINATION,
    OFF,
    OPERATION_NAME,
    OPERATION_TYPE,
    SYSTEM,
    Core,
    Scope,
    Timed,
    reset,
    use,
)

__all__ = [
    "OFF",
    "PROPAGATION_PROPERTIES",
    "TRACEPARENT",
    "active",
    "lane_wait",
    "relay_backlog",
    "relay_batch",
    "reset",
    "use",
]


# -- the outbox relay's instruments (moving into the outbox package) ------------------------


class RelayInstruments:
    """The outbox relay's gauges on a :class:`~sendonce.telemetry._core.Core`, built once per
    core."""

    def __init__(self, core: Core) -> None:
        self.core = core
        meter = core.meter
        self.relay_lag = meter.create_gauge(
            "sendonce.outbox.lag",
            unit="s",
            description="Age of the oldest outbox row not yet published",
        )
        self.relay_pending = meter.create_gauge(
            "sendonce.outbox.rows_pending",
            unit="{row}",
            description="Outbox rows not yet published",
        )


def active() -> RelayInstruments | None:
    """The relay's instruments, or None while OpenTelemetry is not in use."""
    core = _core.active()
    return None if core is None else core.extension(RelayInstruments, RelayInstruments)


def _Timed(  # the scope the relay's code below was written against
    telemetry: RelayInstruments, name: str, kind: str, attributes: dict[str, Any]
) -> Timed:
    return Timed(telemetry.core, name, kind, attributes)


def relay_batch(entity: str | None, rows: int, *, system: str | None = None) -> Scope:
    """One outbox relay batch of ``rows`` claimed rows (counts set at the end)."""
    telemetry = active()
    if telemetry is None:
        return OFF
    attributes: dict[str, Any] = {OPERATION_TYPE: "send", OPERATION_NAME: "relay"}
    if entity is not None:
        attributes[DESTINATION] = entity
    if system is not None:
        attributes[SYSTEM] = system
    scope = _Timed(telemetry, f"relay {entity or 'outbox'}", "INTERNAL", attributes)
    scope.set(rows=rows)
    return scope


def relay_backlog(lag_seconds: float, rows_pending: int, *, outbox: str | None = None) -> None:
    """The outbox's backlog: the oldest unpublished row's age and how many rows wait."""
    telemetry = active()
    if telemetry is None:
        return
    attributes = {} if outbox is None else {"sendonce.outbox.name": outbox}
    telemetry.relay_lag.set(lag_seconds, attributes)
    telemetry.relay_pending.set(rows_pending, attributes)
