"""The fake clock of the asyncio sender suite (a unique module name on purpose)."""

from __future__ import annotations


class FakeTime:
    """A clock plus sync and async sleeps for RetryPolicy: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        raise AssertionError("the async sender must not call the blocking sleep")

    async def async_sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
