"""A Service Bus-compatible AMQP endpoint over the local broker file.

Point an unmodified ``azure-servicebus`` application at a local broker file
with one connection string (``Emulator(path).connection_string``), and script
faults (``emulator.faults.add(Fault(FaultAction.DROP_AFTER_COMMIT))``) to test
in-doubt sends end to end. Needs the ``emulator`` extra (python-qpid-proton).
"""

from __future__ import annotations

from .._extras import requires_extra

with requires_extra("sendonce.emulator", "emulator"):
    from ._faults import Fault, FaultAction, FaultScript
    from ._server import Emulator

__all__ = ["Emulator", "Fault", "FaultAction", "FaultScript"]
