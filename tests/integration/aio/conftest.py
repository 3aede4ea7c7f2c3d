"""Fixtures for the async Service Bus suite: a fresh broker file and emulator per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _aio_sb_helpers import EVENTS, ORDERS, SHORT, FakeTime

from sendonce import RetryPolicy
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def retry(fake_time: FakeTime) -> RetryPolicy:
    return RetryPolicy(
        async_sleep=fake_time.async_sleep,
        clock=fake_time.clock,
        jitter=False,
        attempt_timeout=5.0,
    )


@pytest.fixture
def broker_path(tmp_path: Path) -> Path:
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        for profile in (ORDERS, EVENTS, SHORT):
            store.create_entity(profile)
        store.create_subscription("events", "a")
        store.create_subscription("events", "b")
    return path


@pytest.fixture
def store(broker_path: Path) -> Iterator[LocalBackend]:
    with LocalBackend(broker_path) as backend:
        yield backend


@pytest.fixture
def emulator(broker_path: Path) -> Iterator[Emulator]:
    with Emulator(broker_path, poll_interval=0.02) as emu:
        yield emu
