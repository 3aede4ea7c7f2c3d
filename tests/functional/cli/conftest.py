"""The CLI runs in this process (click's CliRunner): undo what ``sendonce`` does to logging."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def restore_sendonce_logging() -> Iterator[None]:
    """``sendonce --log-level`` sets the ``sendonce`` logger's level and adds a stderr handler:
    right for a process, but it would hide DEBUG records from later tests' ``caplog``."""
    logger = logging.getLogger("sendonce")
    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers
    logger.propagate = propagate
