"""Fixtures for the async Service Bus suite; the broker and emulator are shared ones."""

from __future__ import annotations

import pytest
from _aio_sb_helpers import FakeTime

from sendonce import RetryPolicy


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
