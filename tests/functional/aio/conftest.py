"""Fixtures for the asyncio sender suite: a real broker file, a clock with an async sleep."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _aio_helpers import FakeTime

from sendonce import RetryPolicy
from sendonce.backends.local import LocalBackend


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def retry(fake_time: FakeTime) -> RetryPolicy:
    return RetryPolicy(
        sleep=fake_time.sleep,
        async_sleep=fake_time.async_sleep,
        clock=fake_time.clock,
        jitter=False,
        attempt_timeout=5.0,
    )


@pytest.fixture
def broker_path(tmp_path: Path) -> Path:
    return tmp_path / "broker.db"


@pytest.fixture
def store(broker_path: Path) -> Iterator[LocalBackend]:
    """The broker file opened directly, to read what arrived (a second connection)."""
    with LocalBackend(broker_path) as backend:
        yield backend
