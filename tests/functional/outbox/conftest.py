"""The outbox's tests: the run's PostgreSQL cluster (``postgres_server``, tests/conftest.py),
a fresh database per test."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "ledger"))

from sendonce.backends import LocalBackend

_numbers = itertools.count(1)


@pytest.fixture
def outbox_url(postgres_server: str) -> str:
    """A fresh database (the outbox is created in it by install or the first relay)."""
    import psycopg

    name = f"outbox_{next(_numbers)}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_server.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBackend]:
    with LocalBackend(tmp_path / "broker.db") as backend:
        yield backend
