from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from ledger_helpers import Clock

from sendonce import RetryPolicy
from sendonce.backends import LocalBackend


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def broker(tmp_path: Path, clock: Clock) -> Iterator[LocalBackend]:
    """A broker file on the test's clock."""
    with LocalBackend(tmp_path / "broker.db", clock=clock) as backend:
        yield backend


@pytest.fixture
def retry() -> RetryPolicy:
    """Retries without waiting."""
    return RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)


_counter = [0]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger url on each store (a new database per test on the shared server)."""
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path / 'ledger.db'}"
        return
    import psycopg

    server: str = request.getfixturevalue("postgres_server")
    _counter[0] += 1
    name = f"ledger_{_counter[0]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield server.rsplit("/", 1)[0] + f"/{name}"
