"""How caller threads hand work to the Artemis event loop (``artemis._doorbell``): many
commands, one wake-up; nothing after the last call. The loop itself runs against the real
broker in tests/integration/artemis; here its side is played by hand (a real pipe)."""

from __future__ import annotations

import os
import select
import threading
from types import SimpleNamespace

from sendonce.backends.artemis._doorbell import Doorbell


class _Selectable:
    terminated = False
    updates = 0

    def terminate(self) -> None:
        self.terminated = True

    def update(self) -> None:
        self.updates += 1


def _pending_bytes(bell: Doorbell) -> bytes:
    if not select.select([bell.fileno()], [], [], 0)[0]:
        return b""
    return os.read(bell.fileno(), 512)


def test_commands_rung_before_the_loop_reads_wake_it_once_and_run_in_order() -> None:
    ran: list[int] = []
    flushed: list[int] = []
    bell = Doorbell(after=lambda: flushed.append(len(ran)))
    threads = [
        threading.Thread(target=lambda i=i: bell.ring(lambda: ran.append(i))) for i in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ran == []  # nothing runs in the callers' threads
    assert _pending_bytes(bell) == b"!"  # sixteen rings, one wake-up
    selectable = _Selectable()
    bell.on_selectable_readable(SimpleNamespace(context=selectable))
    assert sorted(ran) == list(range(16))
    assert flushed == [16]  # the hook runs once, after the whole batch
    assert bell.ring(lambda: ran.append(99))
    assert _pending_bytes(bell) == b"!"  # a ring after the loop's pass wakes it again
    bell.on_selectable_readable(SimpleNamespace(context=selectable))
    assert ran[-1] == 99 and not selectable.terminated
    bell.close()


def test_after_the_last_call_nothing_is_queued_and_the_loop_stops_watching() -> None:
    ran: list[str] = []
    bell = Doorbell()
    assert bell.ring(lambda: ran.append("shut"))
    bell.last_call()
    assert not bell.ring(lambda: ran.append("late"))
    selectable = _Selectable()
    bell.on_selectable_readable(SimpleNamespace(context=selectable))
    assert ran == ["shut"]
    assert selectable.terminated and selectable.updates == 1
    bell.close()
    bell.close()  # idempotent
    assert not bell.ring(lambda: ran.append("closed"))
