"""A cancel that the azure-servicebus aio client absorbs still reaches the caller.

On Python 3.11, ``asyncio.wait_for`` returns its inner result when the outer task is
cancelled just as the inner wait finishes (CPython gh-86296, fixed in 3.12); the
client awaits through ``wait_for``, so a cancelled send could return normally. The
race is made certain here with the event loop's task factory (a public asyncio
hook): the first task the send creates that finishes with a result cancels the
sending task from its done callback, which runs before ``wait_for`` wakes. The
client, the socket and the emulator are real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from _aio_sb_helpers import ORDERS

from sendonce import Message, RetryPolicy
from sendonce.aio import AzureServiceBusBackend, IdempotentSender
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def cancel_when_an_inner_task_finishes(
    loop: asyncio.AbstractEventLoop, sending: list[asyncio.Task[Any]], fired: list[str]
) -> None:
    """Cancel ``sending[0]`` as soon as a task it created finishes with a result."""

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        if sending and asyncio.current_task() is sending[0]:

            def cancel_the_sender(inner: asyncio.Task[Any]) -> None:
                if fired or inner.cancelled() or inner.exception() is not None:
                    return
                fired.append(inner.get_coro().__qualname__)  # type: ignore[union-attr]
                sending[0].cancel()

            task.add_done_callback(cancel_the_sender)  # before wait_for adds its own
        return task

    loop.set_task_factory(factory)  # type: ignore[arg-type]


@pytest.mark.skipif(
    not hasattr(asyncio.Task, "cancelling"), reason="Task.cancelling() is Python 3.11+"
)
def test_a_cancel_absorbed_by_the_client_raises_cancelled_error(
    emulator: Emulator, store: LocalBackend, retry: RetryPolicy
) -> None:
    async def main() -> tuple[bool, list[str]]:
        loop = asyncio.get_running_loop()
        async with (
            AzureServiceBusBackend.from_connection_string(
                # The client's own send path (its wait_for absorbs the cancel): a lane of
                # its own connection; the shared connection's links await no wait_for.
                emulator.connection_string,
                profiles={"orders": ORDERS},
                connection_sharing=False,
            ) as backend,
            IdempotentSender(backend, ORDERS, retry=retry) as sender,
        ):
            await sender.send(Message("warm", message_id="warm-1"))  # the link is open
            sending: list[asyncio.Task[Any]] = []
            fired: list[str] = []
            cancel_when_an_inner_task_finishes(loop, sending, fired)
            sending.append(asyncio.create_task(sender.send(Message("paid", message_id="x-1"))))
            try:
                await sending[0]
                raised = False
            except asyncio.CancelledError:
                raised = True
            loop.set_task_factory(None)
            # Whatever the cancel interrupted, the resend of the same id lands at most once.
            await sender.send(Message("paid", message_id="x-1"))
            return raised, fired

    raised, fired = asyncio.run(main())
    assert fired, "the send created no inner task: the race was not exercised"
    assert raised, f"the cancel landing as {fired[0]} finished was swallowed"
    assert store.message_ids("orders") == ["warm-1", "x-1"]
