"""The ledger's spans and metrics, declared at the ledger's edge on the featureless
telemetry core (``sendonce.telemetry._core``): a span and a duration per ledger write, and
the ``sendonce.in_doubt`` event of an in-doubt decision the ledger makes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._sender_telemetry import in_doubt_attributes
from ..telemetry import _core
from ..telemetry._core import DESTINATION, DURATION_BUCKETS, OFF, Core, Scope, Timed

if TYPE_CHECKING:
    from ..errors import InDoubtError

__all__ = ["in_doubt", "ledger_write"]


class _Instruments:
    """The ledger's histogram on a core, built once per core."""

    def __init__(self, core: Core) -> None:
        self.duration = core.meter.create_histogram(
            "sendonce.ledger.operation.duration",
            unit="s",
            description="Duration of one ledger write (intent, confirm or release)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )


def ledger_write(operation: str, entity: str, store: object, **counts: int) -> Scope:
    """A ledger write (``intent``, ``confirm`` or ``release``); ``counts`` name what it
    writes (``keys=``, ``transfers=``)."""
    core = _core.active()
    if core is None:
        return OFF
    kind = type(store).__name__.removesuffix("Store").lower()
    attributes: dict[str, Any] = {
        DESTINATION: entity,
        "sendonce.ledger.operation": operation,
        "sendonce.ledger.store": kind or "unknown",
    }
    histogram = core.extension(_Instruments, _Instruments).duration
    scope = Timed(core, f"ledger {operation} {entity}", "INTERNAL", attributes, histogram)
    scope.set(**counts)
    return scope


def in_doubt(error: InDoubtError, reason: str) -> None:
    """An in-doubt decision made without a transfer: an event on the current (call) span."""
    core = _core.current()
    if core is None or core.tracer is None:
        return
    span = core.trace.get_current_span()
    if span.is_recording():
        span.add_event("sendonce.in_doubt", in_doubt_attributes(error, reason))
