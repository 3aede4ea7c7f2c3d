"""Entities and the fake clock of the async Service Bus suite (a unique module name)."""

from __future__ import annotations

from datetime import timedelta

from sendonce import EntityProfile

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
