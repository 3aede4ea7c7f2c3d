"""IdempotentSender.send_many over LocalBackend vs a hand-written loop of LocalBackend.send.

Both send the same prepared messages in the same batches to a fresh broker file; the
ratio (sender time / loop time) is the cost of validation, batching, payload-conflict
memory and retry bookkeeping. Runs alternate and the median of each is reported.

    python bench/bench_sender.py [--messages 100000] [--repeats 5] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends import LocalBackend

PROFILE = EntityProfile("orders")


def prepare(n: int) -> list[Message]:
    return [
        Message(f'{{"order_id": {i}, "amount": "{i % 997}.00"}}', message_id=f"{i}.2017/payment")
        for i in range(n)
    ]


def batches_of(messages: list[Message]) -> list[list[Message]]:
    """The batches the sender would form (computed once, outside the timing)."""
    with tempfile.TemporaryDirectory() as tmp, LocalBackend(Path(tmp) / "plan.db") as backend:
        sender = IdempotentSender(backend, PROFILE)
        return sender.plan_batches(messages)


def run_sender(path: Path, messages: list[Message]) -> float:
    with LocalBackend(path) as backend:
        backend.create_entity(PROFILE, exist_ok=True)
        sender = IdempotentSender(backend, PROFILE)
        start = time.perf_counter()
        report = sender.send_many(messages)
        elapsed = time.perf_counter() - start
        assert report.sent == len(messages), report
    return elapsed


def run_loop(path: Path, batches: list[list[Message]]) -> float:
    with LocalBackend(path) as backend:
        backend.create_entity(PROFILE, exist_ok=True)
        start = time.perf_counter()
        for batch in batches:
            backend.send(PROFILE.name, batch, timeout=30.0)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), messages=500, repeats=1)
    messages = prepare(args.messages)
    batches = batches_of(messages)
    sender_times, loop_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = [("loop", run_loop), ("sender", run_sender)]
            if r % 2:
                order.reverse()
            for name, fn in order:
                path = Path(tmp) / f"{name}-{r}.db"
                arg = batches if name == "loop" else messages
                (loop_times if name == "loop" else sender_times).append(fn(path, arg))  # type: ignore[operator]
    s, loop = statistics.median(sender_times), statistics.median(loop_times)
    n = args.messages
    print(f"messages: {n} in {len(batches)} batches, {args.repeats} runs each (median; best)")
    print(
        f"best runs: loop {min(loop_times):.3f} s, sender {min(sender_times):.3f} s, "
        f"ratio {min(sender_times) / min(loop_times):.3f}"
    )
    print(f"hand-written loop of LocalBackend.send : {loop:.3f} s  {n / loop:,.0f} msg/s")
    print(f"IdempotentSender.send_many             : {s:.3f} s  {n / s:,.0f} msg/s")
    print(f"ratio sender / loop                    : {s / loop:.3f}  (target <= 1.10)")


if __name__ == "__main__":
    main()
