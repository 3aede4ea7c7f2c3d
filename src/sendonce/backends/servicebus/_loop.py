"""The one event-loop thread that drives every shared Service Bus connection of the process.

A pyamqp connection is not thread-safe (azure-sdk-for-python #36334): its session and link
state is updated by whichever caller reads a frame. So the shared connections live on one
asyncio loop, on one daemon thread, and the sync backend's threads hand their transfers to
it (``run``). The thread starts with the first shared connection and stays for the process
(an idle loop costs nothing but a blocked thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["awaited", "loop", "run"]

T = TypeVar("T")

_guard = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid = 0


def loop() -> asyncio.AbstractEventLoop:
    """The process's connection loop, started on first use (again in a forked child, which
    inherits the loop object but not its thread)."""
    global _loop, _pid
    with _guard:
        if _loop is None or _loop.is_closed() or _pid != os.getpid():
            _pid = os.getpid()
            started = asyncio.new_event_loop()
            thread = threading.Thread(
                target=started.run_forever, name="sendonce-servicebus-io", daemon=True
            )
            thread.start()
            _loop = started
        return _loop


def run(coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """Run ``coro`` on the connection loop and wait for it from this thread.

    ``coro`` bounds itself; ``timeout`` is the backstop past which it is cancelled (and the
    cancellation waited for briefly), so a caller never hangs on the loop.
    """
    future = asyncio.run_coroutine_threadsafe(coro, loop())
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"the connection loop did not answer within {timeout:g}s") from None
    except BaseException:
        if not future.done():
            future.cancel()  # Ctrl-C in the waiting thread: stop the work on the loop too
        raise


async def awaited(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the connection loop and await it from another event loop (the aio
    backend's). Cancelling the caller cancels it there too."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop()))
