"""The asyncio sender with a ledger: the same decisions as the sync sender."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sendonce import EntityProfile, InDoubtError, Ledger, Message, aio
from sendonce.backends import LocalBackend
from sendonce.ledger import Key, body_digest

WINDOW = timedelta(minutes=10)


def msg(i: int) -> Message:
    return Message(f"body {i}", message_id=f"order-{i}")


@pytest.fixture
def closing() -> Iterator[list[aio.ThreadedBackend]]:
    """Thread adapters closed after the test, whatever its outcome (the sender does not close
    the backend it is given): a worker thread left alive is a later test's in this worker."""
    made: list[aio.ThreadedBackend] = []
    yield made
    for backend in made:
        asyncio.run(backend.close())


def test_aio_sender_skips_confirmed_keys_and_reports_doubt_past_the_window(
    tmp_path: Path, ledger_url: str, closing: list[aio.ThreadedBackend]
) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    broker = LocalBackend(tmp_path / "b.db", clock=lambda: now[0])
    threaded = aio.ThreadedBackend(broker)
    closing.append(threaded)
    profile = EntityProfile("orders", duplicate_detection_window=WINDOW)

    async def main() -> tuple[int, list[str], list[str], int]:
        with Ledger(ledger_url, clock=lambda: now[0]) as ledger:
            async with aio.IdempotentSender(threaded, profile, ledger=ledger) as sender:
                first = await sender.send_many([msg(i) for i in range(4)])
                crashed = msg(9)
                ledger.store.record_intents(
                    "orders",
                    [Key("order-9", "")],
                    [body_digest(crashed)],
                    first_attempt=now[0],
                    owner="x",
                )
                now[0] += 2 * WINDOW
                again = await sender.send_many([msg(i) for i in range(6)] + [crashed])
                scheduled = await sender.schedule(msg(7), now[0] + WINDOW)
                assert scheduled.outcome == "scheduled"
                now[0] += 2 * WINDOW  # the broker forgot order-7; the ledger did not
                again_scheduled = await sender.schedule(msg(7), now[0] + WINDOW)
                assert again_scheduled.outcome == "duplicate"
                with pytest.raises(InDoubtError):
                    await sender.schedule(crashed, now[0] + WINDOW)
                with pytest.raises(InDoubtError):
                    await sender.send(crashed)
                return first.sent, again.from_ledger, again.in_doubt, again.sent

    sent, from_ledger, in_doubt, sent_again = asyncio.run(main())
    assert (sent, sent_again) == (4, 2)
    assert from_ledger == [f"order-{i}" for i in range(4)]
    assert in_doubt == ["order-9"]
    with broker:
        got = sorted(m.message_id for m in broker.receive("orders", max_messages=100))
    assert got == [f"order-{i}" for i in range(6)] + ["order-7"]  # order-7 scheduled once
