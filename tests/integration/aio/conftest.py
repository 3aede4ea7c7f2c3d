"""Fixtures for the async Service Bus suite: a fresh broker file and emulator per test."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from sendonce import EntityProfile, RetryPolicy
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

ORDERS = EntityProfile("orders")
EVENTS = EntityProfile("events", kind="topic")
SHORT = EntityProfile("short", duplicate_detection_window=timedelta(seconds=20))


class FakeTime:
    """A clock and an async sleep for RetryPolicy: sleeping advances the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def async_sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


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
