"""Fixtures for the local broker: a real SQLite file per test and an injectable clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _clock import Clock

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "broker.db")


@pytest.fixture
def broker(db: str, clock: Clock) -> Iterator[LocalBackend]:
    with LocalBackend(db, clock=clock) as backend:
        yield backend


@pytest.fixture
def make_entity(broker: LocalBackend) -> Callable[..., EntityProfile]:
    def make(name: str = "orders", **options: object) -> EntityProfile:
        profile = EntityProfile(name, **options)  # type: ignore[arg-type]
        broker.create_entity(profile)
        return profile

    return make
