"""Where the sender core finds the ledger's protocol: it lives in ``sendonce.ledger._run``.

The run object (what a call asks the ledger to record, confirm and release, and when) is
the ledger's own; this module only names it for the core, so the engine and the ledger can
change on either side of that line. No behaviour here.
"""

from __future__ import annotations

from .ledger._run import LEDGER_FAILURES, LedgerLayer, LedgerRun, WriteAhead

__all__ = ["LEDGER_FAILURES", "LedgerLayer", "LedgerRun", "WriteAhead"]
