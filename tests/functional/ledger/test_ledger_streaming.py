"""A streamed ``send_many`` (a generator, read a chunk at a time into a bounded buffer) killed
with SIGKILL, or cancelled, at the buffer's worst moments; the re-run of the same input then
sends each message exactly once.

Moments: inside a transfer while the input waits on the full buffer (before and after the
broker stored it), at a chunk boundary (the chunks before sent and confirmed, the next not
read), and mid-chunk just after a ledger intent write is durable (intents written, their
transfers not started). The entity has no duplicate detection: only the ledger stands
between a re-run and a duplicate, and a key the broker may have stored without a
confirmation is reported in doubt, never resent.

Real peers: the local broker (a SQLite file) and the SQLite ledger, in a producer process
(``stream_producer.py``) that kills itself at the moment.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import sendonce._buffer
from sendonce import Ledger, Message, RetryPolicy, SendReport
from sendonce.aio import IdempotentSender as AsyncSender
from sendonce.aio import ThreadedBackend
from sendonce.backends import LocalBackend
from sendonce.ledger import Key

PRODUCER = Path(__file__).with_name("stream_producer.py")
COUNT = 400
sys.path.insert(0, str(PRODUCER.parent))
from stream_producer import PROFILE  # noqa: E402


def produce(db: Path, url: str, moment: str, n: int) -> dict[str, Any] | None:
    proc = subprocess.run(
        [sys.executable, str(PRODUCER), str(db), url, str(COUNT), moment, str(n)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if moment != "none":
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
        return None
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def stored(db: Path) -> Counter[str]:
    with LocalBackend(db) as broker:
        return Counter(broker.message_ids(PROFILE.name))


def unconfirmed(url: str) -> list[Key]:
    keys = [Key(f"{i}.2017/payment", "") for i in range(COUNT)]
    with Ledger(url) as ledger:
        rows = ledger.lookup(PROFILE.name, keys)
    return [k for k, row in rows.items() if row.confirmed_at is None]


def check_rerun(db: Path, url: str, doubt_at_most: int) -> None:
    """The re-run: every message stored once at most; each one not stored is reported
    (in doubt, or failed); keys left in doubt are at most the transfers the kill caught."""
    summary = produce(db, url, "none", 0)
    assert summary is not None
    copies = stored(db)
    assert max(copies.values()) == 1, "a message was stored twice"
    assert summary["total"] == COUNT and sorted(summary["ids"]) == sorted(
        f"{i}.2017/payment" for i in range(COUNT)
    )
    missing = {f"{i}.2017/payment" for i in range(COUNT)} - set(copies)
    assert missing <= set(summary["in_doubt"]), "a message neither stored nor reported"
    assert len(summary["in_doubt"]) <= doubt_at_most
    assert summary["failed"] == len(summary["in_doubt"])  # nothing else failed


@pytest.mark.parametrize(
    ("moment", "n", "doubt"),
    [
        ("buffer-full", 9, 5),  # a stored transfer of the 3rd chunk, unconfirmed: in doubt
        ("before-store", 9, 5),  # nothing stored: those 5 are in doubt (may have been)
        ("chunk-boundary", 3, 0),  # chunks 0-2 confirmed; nothing of chunk 3 exists
        ("ledger-stage", 4, 5),  # intents durable mid-chunk, never sent: at most one window
    ],
)
def test_a_kill_at_the_buffers_worst_moments_leaves_each_message_once(
    tmp_path: Path, moment: str, n: int, doubt: int
) -> None:
    db, url = tmp_path / "broker.db", f"sqlite://{tmp_path / 'ledger.db'}"
    produce(db, url, moment, n)
    before = stored(db)
    assert max(before.values(), default=1) == 1
    if moment == "chunk-boundary":
        assert unconfirmed(url) == []  # every chunk before the boundary is confirmed
        assert sum(before.values()) > 0
    check_rerun(db, url, doubt)
    assert unconfirmed(url) == [] or len(unconfirmed(url)) <= doubt


# -- cancellation (aio) at the same moments ---------------------------------------------


class Rows:
    def __init__(self, count: int) -> None:
        self.count, self.yielded = count, 0

    def __iter__(self) -> Iterator[Message]:
        for i in range(self.count):
            self.yielded += 1
            yield Message(f"order {i} paid", message_id=f"{i}.2017/payment")


class Paused(LocalBackend):
    """The local broker, holding its ``n``-th transfer until the test says go."""

    def __init__(self, path: Path, n: int) -> None:
        super().__init__(path)
        self.n, self.transfers = n, 0
        self.reached = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    def send(self, entity: str, messages: Sequence[Message], **kwargs: Any) -> Any:
        self.transfers += 1
        acks = super().send(entity, messages, **kwargs)
        if self.transfers == self.n and self.loop is not None:
            self.loop.call_soon_threadsafe(self.reached.set)
        return acks


@pytest.mark.parametrize("moment", ["buffer full", "chunk boundary", "ledger write"])
def test_a_cancelled_streamed_call_leaves_each_message_once_after_a_rerun(
    tmp_path: Path, moment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call is cancelled while the input waits on a full buffer (a transfer of its
    third chunk acknowledged), between two chunks (the second one reported, the third not
    read), or while the third chunk's first intents are written; a re-run sends the rest,
    each message once, none in doubt beyond the transfer in flight."""
    monkeypatch.setattr(sendonce._buffer, "FIRST_CHUNK", 8)
    absorbed = [0]
    absorb = SendReport._absorb

    def counted(self: SendReport, part: SendReport, base: int) -> None:
        absorb(self, part, base)
        absorbed[0] += 1

    monkeypatch.setattr(SendReport, "_absorb", counted)
    db, url = tmp_path / "broker.db", f"sqlite://{tmp_path / 'ledger.db'}"
    rows = Rows(COUNT)

    async def cancelled() -> None:
        backend = Paused(db, 9)
        async with AsyncSender(
            ThreadedBackend(backend),
            PROFILE,
            ledger=url,
            max_batch_messages=5,
            max_buffer_bytes=64 * 1024,
            retry=RetryPolicy(max_attempts=1),
        ) as sender:
            backend.loop = asyncio.get_running_loop()
            task = asyncio.ensure_future(sender.send_many(rows))
            if moment == "buffer full":
                await backend.reached.wait()
            elif moment == "chunk boundary":
                while absorbed[0] < 2:  # chunks of 8 and 16 reported, the third not read
                    await asyncio.sleep(0)
                assert rows.yielded == 24
            else:
                while rows.yielded <= 24:  # the third chunk is read: its intents are written
                    await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError) as info:
                await task
            assert info.value.sent_before.total >= 8  # type: ignore[attr-defined]

    asyncio.run(cancelled())
    assert max(stored(db).values()) == 1
    assert len(unconfirmed(url)) <= 5  # at most the one transfer in flight
    check_rerun(db, url, 5)
