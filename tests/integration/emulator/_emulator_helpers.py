"""Shared constants and a fake clock for the emulator suite (a unique module name on purpose)."""

from __future__ import annotations

from datetime import timedelta

from sendonce import EntityProfile


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
