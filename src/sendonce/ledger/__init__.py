"""A durable send ledger: exactly once beyond the broker's duplicate-detection window.

``Ledger(store_or_url)`` with ``sqlite:///path/ledger.db`` (one file, many
processes) or ``postgresql://...`` (shared by hosts and Spark executors; needs
``pip install 'sendonce[postgres]'``). Pass it (or its url) to
``IdempotentSender(..., ledger=...)``. See docs/ledger.md.
"""

from __future__ import annotations

from ._ledger import (
    DEFAULT_RETENTION,
    InDoubtPolicy,
    Ledger,
    LedgerOptions,
    Prepared,
    body_digest,
    open_store,
)
from ._store import Confirmation, Entry, Key, LedgerStore

__all__ = [
    "DEFAULT_RETENTION",
    "Confirmation",
    "Entry",
    "InDoubtPolicy",
    "Key",
    "Ledger",
    "LedgerOptions",
    "LedgerStore",
    "Prepared",
    "body_digest",
    "open_store",
]
