"""Fixtures for the emulator suite (broker file and emulator: tests/integration/conftest.py)."""

from __future__ import annotations

import pytest
from _emulator_helpers import FakeTime


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()
