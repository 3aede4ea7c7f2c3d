"""A durable send ledger: exactly once beyond the broker's duplicate-detection window.

``Ledger(store_or_url)`` with ``sqlite:///path/ledger.db`` (one file, many
processes) or ``postgresql://...`` (shared by hosts and Spark executors; needs
``pip install 'sendonce[postgres]'``). Pass it (or its url) to
``IdempotentSender(..., ledger=...)``. Keys it wrote and never saw confirmed are
settled with ``Ledger.keys_in_doubt(entity, rule)`` (which are in doubt under the entity's
:class:`InDoubtRule`) and ``Ledger.reconcile(backend, entity)`` (what the broker shows of
them). See docs/ledger.md.
"""

from __future__ import annotations

from ._doubt import IN_DOUBT_MARGIN, InDoubtRule
from ._inspect import Unconfirmed
from ._ledger import (
    DEFAULT_RETENTION,
    InDoubtPolicy,
    Ledger,
    LedgerOptions,
    Prepared,
    body_digest,
    open_store,
)
from ._reconcile import Finding, Reconciliation, Verdict
from ._store import Confirmation, Entry, Key, LedgerStore

__all__ = [
    "DEFAULT_RETENTION",
    "IN_DOUBT_MARGIN",
    "Confirmation",
    "Entry",
    "Finding",
    "InDoubtPolicy",
    "InDoubtRule",
    "Key",
    "Ledger",
    "LedgerOptions",
    "LedgerStore",
    "Prepared",
    "Reconciliation",
    "Unconfirmed",
    "Verdict",
    "body_digest",
    "open_store",
]
