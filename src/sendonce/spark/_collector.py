"""Holding off Python's cyclic garbage collector while a task has a chunk of rows in hand.

A task pulls 10,000 ``Row`` objects, builds their columns and messages, sends them
and gets an ack per message back: tens of thousands of container objects that live
until the chunk is done. Allocating them triggers collection after collection; each
walks the survivors and promotes them, so full collections keep re-walking the whole
heap. None of these objects forms a reference cycle: reference counting frees them
all when the chunk is dropped. So the collector is paused for the chunk and resumes
right after (measured: a third of a ``partition_publisher`` task's collector time,
see docs/benchmarks.md). Cyclic garbage made meanwhile by other code is collected
then, a chunk later than otherwise.
"""

from __future__ import annotations

import gc
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar, cast

T = TypeVar("T")

__all__ = ["collector_paused", "paused_per_item"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause automatic cyclic collection for the block (left alone if already off)."""
    if not gc.isenabled():  # the application turned it off, or another thread holds it off
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def paused_per_item(items: Iterable[T]) -> Generator[T, None, None]:
    """Each item, the collector paused from fetching it until the next one is asked for.

    Close the generator (``contextlib.closing``) so that a loop left early resumes
    the collector at once; an error while fetching resumes it too.
    """
    source, end = iter(items), object()
    while True:
        with collector_paused():
            item = next(source, end)
            if item is end:
                return
            yield cast(T, item)
