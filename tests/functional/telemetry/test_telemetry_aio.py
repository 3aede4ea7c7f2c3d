"""The asyncio sender's traces and metrics over the real local broker (ThreadedBackend)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from sendonce import EntityProfile, InDoubtError, Message, RetryPolicy
from sendonce.aio import IdempotentSender, ThreadedBackend
from sendonce.backends import LocalBackend
from sendonce.testing import Fault, FaultyBackend

ORDERS = EntityProfile("orders")


def policy() -> RetryPolicy:
    async def no_sleep(seconds: float) -> None:
        pass

    return RetryPolicy(async_sleep=no_sleep, jitter=False, max_attempts=3)


def msg(i: int, **kw: Any) -> Message:
    return Message(f"body {i}", message_id=f"order-{i}", **kw)


def run(path: Path, faults: list[Fault], coroutine: Any) -> Any:
    async def main() -> Any:
        inner = FaultyBackend(LocalBackend(path), faults)
        backend = ThreadedBackend(inner)
        async with backend, IdempotentSender(backend, ORDERS, retry=policy(), max_in_flight=4) as s:
            return await coroutine(s)

    return asyncio.run(main())


def test_aio_calls_transfers_retries_and_in_doubt_are_traced(otel: Any, tmp_path: Path) -> None:
    path = tmp_path / "broker.db"

    async def calls(sender: IdempotentSender) -> Any:
        first = await sender.send(msg(0))  # one retry, then sent
        with pytest.raises(InDoubtError):
            await sender.send(msg(1))  # three attempts, all in doubt
        keyed = [msg(i, partition_key=f"pk-{i}") for i in range(2, 6)]
        report = await sender.send_many([*keyed, msg(0)])  # five transfers side by side
        return first, report

    faults = [Fault.AFTER_COMMIT, Fault.NONE] + [Fault.AFTER_COMMIT] * 3
    first, report = run(path, faults, calls)
    assert first.outcome == "sent" and first.attempts == 2
    assert (report.sent, report.duplicates, report.failed) == (4, 1, 0)

    calls_ = [s for s in otel.named("send orders") if s.parent is None]
    assert [c.attributes["sendonce.outcome"] for c in calls_] == ["sent", "in_doubt"]
    assert all(c.kind is SpanKind.PRODUCER for c in calls_)  # one span per single send
    assert all(otel.children(c) == [] for c in calls_)
    assert calls_[1].status.status_code is StatusCode.ERROR
    retries = otel.events("sendonce.retry")
    assert [e["sendonce.attempt"] for _, e in retries] == [1, 1, 2]
    assert {e["error.type"] for _, e in retries} == {"amqp:connection:forced"}
    [(span, doubt)] = otel.events("sendonce.in_doubt")
    assert span is calls_[1]
    assert doubt["messaging.message.id"] == "order-1" and doubt["sendonce.attempts"] == 3

    many = otel.one("send_many orders")
    transfers = otel.children(many)
    assert sorted(t.attributes["messaging.message.id"] for t in transfers) == [
        "order-0",
        *[f"order-{i}" for i in range(2, 6)],
    ]
    assert all(t.kind is SpanKind.PRODUCER for t in transfers)
    by_id = {t.attributes["messaging.message.id"]: t for t in transfers}
    assert by_id["order-0"].attributes["sendonce.duplicates"] == 1  # the broker had it
    assert otel.outcomes() == {"sent": 5, "in_doubt": 1, "duplicate": 1}

    with LocalBackend(path) as broker:
        stored = {m.message_id: m for m in broker.receive("orders", max_messages=10)}
    for i in range(2, 6):
        ctx = by_id[f"order-{i}"].context
        assert stored[f"order-{i}"].application_properties["traceparent"].split("-")[1:3] == [
            f"{ctx.trace_id:032x}",
            f"{ctx.span_id:016x}",
        ]
