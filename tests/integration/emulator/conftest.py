"""Fixtures for the emulator suite: a fresh broker file and emulator per test, on port 0."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _emulator_helpers import EVENTS, ORDERS, SHORT_WINDOW, FakeTime

from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator


@pytest.fixture
def broker_path(tmp_path: Path) -> Path:
    """A broker file with a queue ``orders`` and a topic ``events`` (subscriptions a, b)."""
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        store.create_entity(ORDERS)
        store.create_entity(EVENTS)
        store.create_entity(SHORT_WINDOW)
        store.create_subscription("events", "a")
        store.create_subscription("events", "b")
    return path


@pytest.fixture
def store(broker_path: Path) -> Iterator[LocalBackend]:
    """The same broker file opened directly, as a ``local://`` producer would."""
    with LocalBackend(broker_path) as backend:
        yield backend


@pytest.fixture
def emulator(broker_path: Path) -> Iterator[Emulator]:
    with Emulator(broker_path, poll_interval=0.02) as emu:
        yield emu


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()
