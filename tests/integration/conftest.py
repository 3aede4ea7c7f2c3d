"""Fixtures shared by the emulator suites (sync and aio): a fresh broker file and emulator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend

ENTITIES = (
    EntityProfile("orders"),
    EntityProfile("events", kind="topic"),
    EntityProfile("short", duplicate_detection_window=timedelta(seconds=20)),
)


@pytest.fixture
def broker_path(tmp_path: Path) -> Path:
    """A broker file with a queue ``orders``, a topic ``events`` (subscriptions a, b) and a
    queue ``short`` with the minimum 20 s window."""
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        for profile in ENTITIES:
            store.create_entity(profile)
        store.create_subscription("events", "a")
        store.create_subscription("events", "b")
    return path


@pytest.fixture
def store(broker_path: Path) -> Iterator[LocalBackend]:
    """The same broker file opened directly, as a ``local://`` producer would."""
    with LocalBackend(broker_path) as backend:
        yield backend


@pytest.fixture
def emulator(broker_path: Path) -> Iterator[object]:
    from sendonce.emulator import Emulator

    with Emulator(broker_path, poll_interval=0.02) as emu:
        yield emu
