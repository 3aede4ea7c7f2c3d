"""Benchmark: the send engine's own cost per transfer in flight, over brokers that cost nothing.

``send_many`` of N one-message transfers over 16 partition keys (16 in flight), to:

- ``native``: a backend whose ``submit`` hands each transfer to one I/O thread that acks it at
  once (the shape of Artemis' event loop): the engine drives flights, no thread per transfer;
- ``threads``: a backend without a native ``submit`` whose ``send`` acks at once: a thread per
  transfer in flight (the adapter).

Prints transfers per second (best of ``--repeats``) and the process's CPU per transfer, and
with ``--profile native|threads`` the profile of a call made off the main thread (the thread
that drives it). What is measured is the engine
alone (planning, flights, the key gate, accounting); a real broker adds its own cost.

    python bench/bench_engine.py [--transfers 4000] [--repeats 3] [--profile native] [--smoke]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends import Ack, Backend, Capabilities

PROFILE = EntityProfile("orders", partitioned=True)


class Null(Backend):
    """Acks every transfer at once in the caller's thread."""

    capabilities = Capabilities(max_in_flight=16)

    def describe(self, entity: str) -> EntityProfile:
        return PROFILE

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        return [Ack("accepted")] * len(messages)

    def schedule(self, *args: Any, **kwargs: Any) -> list[Ack]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class NullLoop(Null):
    """Acks every transfer on one I/O thread: a native ``submit``."""

    capabilities = Capabilities(max_in_flight=16, native_submit=True)

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[list[Ack]], int] | None] = queue.SimpleQueue()
        self._io = threading.Thread(target=self._loop, name="null-io", daemon=True)
        self._io.start()

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            future, count = item
            if future.set_running_or_notify_cancel():
                future.set_result([Ack("accepted")] * count)

    def submit(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> Future[list[Ack]]:
        future: Future[list[Ack]] = Future()
        self._queue.put((future, len(messages)))
        return future

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        return self.submit(entity, messages, timeout=timeout).result()

    def close(self) -> None:
        self._queue.put(None)
        self._io.join()


def messages(count: int, run: int) -> list[Message]:
    keys = [f"k{i % 16}" for i in range(count)]
    return [Message("x", message_id=f"m{run}-{i}", partition_key=keys[i]) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", choices=["native", "threads"])
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), transfers=50, repeats=1)
    print(f"load: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, make in (("native", NullLoop), ("threads", Null)):
        backend = make()
        with IdempotentSender(backend, PROFILE, max_batch_messages=1, max_in_flight=16) as sender:
            sender.send_many(messages(200, 0))  # warm
            runs = []
            for run in range(1, args.repeats + 1):
                batch = messages(args.transfers, run)
                wall, cpu = time.perf_counter(), time.process_time()
                report = sender.send_many(batch)
                runs.append((time.perf_counter() - wall, time.process_time() - cpu))
                assert report.failed == 0
            best_wall = min(w for w, _ in runs)
            best_cpu = min(c for _, c in runs)
            print(
                f"  {name:8s} {args.transfers / best_wall:9,.0f} transfers/s, "
                f"CPU {1e6 * best_cpu / args.transfers:5.0f} us per transfer"
            )
            if args.profile == name:
                # Off the main thread: the call is driven from the thread that makes it
                # (on the main thread it would be driven from a thread of its own), so the
                # profile is the driver's.
                profile = cProfile.Profile()
                batch = messages(args.transfers, 99)
                caller = threading.Thread(target=profile.runcall, args=(sender.send_many, batch))
                caller.start()
                caller.join()
                pstats.Stats(profile).sort_stats("tottime").print_stats(15)
        backend.close()


if __name__ == "__main__":
    main()
