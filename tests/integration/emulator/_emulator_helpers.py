"""Shared constants and a fake clock for the emulator suite (a unique module name on purpose)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from sendonce import EntityProfile
from sendonce.backends import LocalBackend
from sendonce.emulator import Emulator


class FakeTime:
    """A clock and a sleep for RetryPolicy: sleeping advances the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


ORDERS = EntityProfile("orders")
EVENTS = EntityProfile("events", kind="topic")
SHORT_WINDOW = EntityProfile("short", duplicate_detection_window=timedelta(seconds=20))


@contextlib.contextmanager
def emulated(tmp_path: Path, *profiles: EntityProfile) -> Iterator[tuple[Emulator, LocalBackend]]:
    """An emulator over a fresh broker file holding ``profiles``, and that file's store."""
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        for profile in profiles:
            store.create_entity(profile)
        with Emulator(path, poll_interval=0.02) as emulator:
            yield emulator, store
