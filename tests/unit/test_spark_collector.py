"""A Spark task pauses Python's cyclic collector per chunk of rows, and always resumes it.

A chunk of 10,000 ``Row`` objects and their acks, alive until the chunk is sent, made
the collector walk and promote them again and again (a fifth of a task's CPU). The
pause must never outlive a chunk, leak past an error, or turn the collector back on
for an application that had turned it off. No Spark session: the task's function
runs in this process on real ``Row`` objects and a real broker file.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row

from sendonce import EntityProfile, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.spark import partition_publisher
from sendonce.spark._collector import collector_paused, paused_per_item

pytestmark = pytest.mark.filterwarnings("ignore:could not read spark.master:RuntimeWarning")

ORDER = Row("order_id", "customer")


def orders(count: int) -> list[Any]:
    return [ORDER(i, f"customer-{i % 7}") for i in range(count)]


@pytest.fixture
def collections() -> Iterator[list[int]]:
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    yield started
    gc.callbacks.remove(count)


def test_the_pause_ends_with_its_block_even_on_an_error() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_each_item_is_held_with_the_collector_paused() -> None:
    held = []
    with closing(paused_per_item(range(3))) as items:
        for item in items:
            held.append((item, gc.isenabled()))
            if item == 1:
                break  # a loop left early
    assert held == [(0, False), (1, False)]
    assert gc.isenabled()
    assert list(paused_per_item([])) == [] and gc.isenabled()


def test_a_collector_the_application_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_partition_is_published_with_the_collector_paused_per_chunk(
    tmp_path: Path, collections: list[int]
) -> None:
    publish = partition_publisher(
        f"local://{tmp_path / 'b.db'}", EntityProfile("orders"), MessageSpec("o-{order_id}")
    )
    rows = orders(25_000)
    collections.clear()
    publish(iter(rows))  # three chunks
    assert gc.isenabled()
    # Unpaused, 25,000 rows and their acks start a collection every 700 allocations
    # (over a hundred here); paused, at most one follows each chunk.
    assert len(collections) <= 3 + 1, collections
    with LocalBackend(tmp_path / "b.db") as broker:
        assert broker.stats("orders")["messages"] == 25_000


def test_an_error_from_the_rows_leaves_the_collector_on(tmp_path: Path) -> None:
    def failing() -> Iterator[Any]:
        yield from orders(12_000)
        raise ValueError("the upstream stage failed")

    publish = partition_publisher(
        f"local://{tmp_path / 'b.db'}", EntityProfile("orders"), MessageSpec("o-{order_id}")
    )
    with pytest.raises(ValueError, match="upstream"):
        publish(failing())
    assert gc.isenabled()
    with LocalBackend(tmp_path / "b.db") as broker:  # the first chunk was sent before
        assert broker.stats("orders")["messages"] == 10_000
