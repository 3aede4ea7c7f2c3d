"""What still imports the old path: the names the backends and the outbox use
(``lane_wait``, the propagation property names), re-exported from the sender's edge
(``sendonce._sender_telemetry``, ``sendonce._propagation``), and the core's switch
(``use``, ``reset``).

Each feature declares its own instruments at its own edge on the featureless core
(``sendonce.telemetry._core``): the sender beside its core, the ledger in
``sendonce.ledger._telemetry``, Spark in ``sendonce.spark._telemetry``, the outbox in
``sendonce.outbox._telemetry``, the command line in ``sendonce.cli._otel``. Nothing new
belongs here.
"""

from __future__ import annotations

from ._propagation import PROPAGATION_PROPERTIES, TRACEPARENT
from ._sender_telemetry import lane_wait
from .telemetry._core import reset, use

__all__ = ["PROPAGATION_PROPERTIES", "TRACEPARENT", "lane_wait", "reset", "use"]
