"""Features used together as a user combines them, against real peers: the real Artemis
broker (``artemis_broker``), a throwaway PostgreSQL cluster (outbox and ledger), the
emulator with the real azure-servicebus client, and OpenTelemetry's in-memory readers.

The PostgreSQL cluster starts once per run, on first use; a module using it is marked
``postgres``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "functional" / "ledger"))
from combo_databases import fresh_database


@pytest.fixture
def outbox_url(postgres_server: str) -> str:
    """A fresh database for an outbox (a relay or ``install`` creates its tables)."""
    return fresh_database(postgres_server, "combo_outbox")
