"""SIGINT as at a terminal, for the tests that interrupt something with it.

A shell starts a background job (``pytest &``, ``nohup pytest``) with SIGINT ignored, and
so do some CI agents. Python then leaves it ignored instead of raising
``KeyboardInterrupt``, and every child inherits the ignored signal: a test that sends
SIGINT (to itself or to a child) would see nothing happen. Inside :func:`sigint_default`
SIGINT raises ``KeyboardInterrupt`` in this process, and a child started inside it begins
with SIGINT's default action (exec resets a handled signal to its default, where an
ignored one would stay ignored), so its Python raises ``KeyboardInterrupt`` too. No
``preexec_fn``: it is unsafe in a process with threads, as these tests' are.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["sigint_default"]


@contextmanager
def sigint_default() -> Iterator[None]:
    """While the block runs, SIGINT raises ``KeyboardInterrupt`` here and stops children
    started in it, whatever this process inherited; the previous handler comes back after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
