"""The local broker's clock in tests: moved by hand, never by the wall."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)
