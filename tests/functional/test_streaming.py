"""``send_many`` over a generator: read a chunk at a time into a bounded buffer.

The input waits while the buffer is full (backpressure: the generator is never read more
than one chunk ahead of what has been handled), the first transfer leaves before the input
is read (whatever its length), a repeat across chunks is stored once, a generator that
raises midway leaves what was sent before it reported on the error, and a 10M-message
generator runs in bounded memory (measured from /proc, in a child process with a memory
cap, so a regression fails instead of eating the machine).

Real peers: the local broker (a SQLite file); the 10M run uses a backend that acknowledges
without storing, since 10M stored messages would measure the broker, not the sender.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import sendonce._buffer
from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends import LocalBackend
from sendonce.errors import ConfigurationError

PROFILE = EntityProfile("orders")


class Rows:
    """A generator of ``count`` messages counting how many it yielded; raises ``fail``
    when asked for message ``fail_at``."""

    def __init__(self, count: int, fail_at: int | None = None, body: str = "x" * 40) -> None:
        self.count, self.fail_at, self.body = count, fail_at, body
        self.yielded = 0

    def __iter__(self) -> Iterator[Message]:
        for i in range(self.count):
            if i == self.fail_at:
                raise OSError(f"the input file broke at row {i}")
            self.yielded += 1
            yield Message(self.body, message_id=f"row-{i}")


class Watched(LocalBackend):
    """The local broker, noting at each transfer how far the input had been read."""

    def __init__(self, path: Path, rows: Rows) -> None:
        super().__init__(path)
        self.rows = rows
        self.sent = 0
        self.ahead: list[int] = []  # rows read but not yet handed to a transfer, each time

    def send(self, entity: str, messages: Sequence[Message], **kwargs: Any) -> Any:
        self.ahead.append(self.rows.yielded - self.sent)
        self.sent += len(messages)
        return super().send(entity, messages, **kwargs)


def test_the_input_waits_while_the_buffer_is_full(tmp_path: Path) -> None:
    """A 64 KiB buffer holds ~60 of these messages: the generator is never more than one
    chunk ahead of the transfers, and every row lands once, the report in input order."""
    rows = Rows(3000)
    budget = 64 * 1024
    per_chunk = budget // (Message("x" * 40, message_id="row-0000").size + 1024) + 2
    with (
        Watched(tmp_path / "broker.db", rows) as backend,
        IdempotentSender(backend, PROFILE, max_buffer_bytes=budget) as sender,
    ):
        report = sender.send_many(rows)
        stored = backend.message_ids(PROFILE.name)
    assert (report.sent, report.failed) == (3000, 0)
    assert [r.message_id for r in report.results] == [f"row-{i}" for i in range(3000)]
    assert sorted(stored) == sorted(f"row-{i}" for i in range(3000))
    assert max(backend.ahead) <= per_chunk  # before: 3000 (the whole input read first)
    assert backend.ahead[0] <= sendonce._buffer.FIRST_CHUNK  # the first transfer: early


def test_the_first_transfer_leaves_before_a_long_input_is_read(tmp_path: Path) -> None:
    rows = Rows(100_000)
    with (
        Watched(tmp_path / "broker.db", rows) as backend,
        IdempotentSender(backend, PROFILE) as sender,
    ):
        sender.send_many(rows)
    assert backend.ahead[0] == sendonce._buffer.FIRST_CHUNK  # of 100,000


def test_a_repeat_in_a_later_chunk_is_stored_once(tmp_path: Path) -> None:
    """row-3 again in the third chunk: sent again with its id, the broker drops the copy;
    one result per input, in input order."""

    def rows() -> Iterator[Message]:
        for i in range(2000):
            yield Message("x", message_id=f"row-{3 if i == 1500 else i}")

    with LocalBackend(tmp_path / "broker.db") as backend:
        with IdempotentSender(backend, PROFILE) as sender:
            report = sender.send_many(rows())
        stored = backend.message_ids(PROFILE.name)
    assert sorted(stored) == sorted({f"row-{i}" for i in range(2000) if i != 1500})
    assert [r.message_id for r in report.results][1500] == "row-3"
    assert report.results[1500].outcome == "duplicate" and report.total == 2000


def test_a_generator_that_raises_midway_leaves_the_chunks_before_sent_and_reported(
    tmp_path: Path,
) -> None:
    rows = Rows(5000, fail_at=4000)
    with LocalBackend(tmp_path / "broker.db") as backend:
        with IdempotentSender(backend, PROFILE) as sender, pytest.raises(OSError) as info:
            sender.send_many(rows)
        stored = backend.message_ids(PROFILE.name)
    before = info.value.sent_before  # type: ignore[attr-defined]
    assert before.total == len(stored) < 4000 and before.failed == 0
    assert [r.message_id for r in before.results] == [f"row-{i}" for i in range(len(stored))]
    assert sorted(stored) == sorted(f"row-{i}" for i in range(len(stored)))
    assert f"messages[0:{len(stored)}]" in "".join(info.value.__notes__)


@pytest.mark.parametrize("value", [0, 1024, "32MiB", True, None])
def test_a_bad_buffer_size_is_refused_naming_the_field(tmp_path: Path, value: object) -> None:
    with LocalBackend(tmp_path / "broker.db") as backend, pytest.raises(ConfigurationError) as info:
        IdempotentSender(backend, PROFILE, max_buffer_bytes=value)  # type: ignore[arg-type]
    assert info.value.field == "max_buffer_bytes"


TEN_MILLION = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from sendonce import EntityProfile, IdempotentSender, Message
    from sendonce.backends._base import Ack

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails here

    def rss():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    class Acking:  # acknowledges every message without storing it
        max_in_flight = 1
        def describe(self, entity): raise NotImplementedError
        def send(self, entity, messages, *, timeout, atomic=False):
            return [Ack("accepted")] * len(messages)
        def close(self): pass

    total, marks = int(sys.argv[1]), {}
    def rows():
        for i in range(total):
            if i in (total // 10, total - 1):
                marks[i] = rss()
            yield Message("x" * 40, message_id=str(i))

    sender = IdempotentSender(Acking(), EntityProfile("orders"), memory_size=100_000)
    report = sender.send_many(rows())
    ids = report._packed
    packed = sum(len(p.ids) + 1 for p in ids)
    print(json.dumps({"sent": report.sent, "marks": sorted(marks.items()), "packed": packed}))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_ten_million_message_generator_runs_in_bounded_memory() -> None:
    """RSS at the last message minus RSS at the 1,000,000th: the packed report's growth (the
    ids kept for the results) plus slack, not the ~540 bytes a message the call cost when
    it held its input (~4.9 GB here, over the child's 3 GiB cap)."""
    total = 10_000_000
    proc = subprocess.run(
        [sys.executable, "-c", TEN_MILLION, str(total)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["sent"] == total
    (_, early), (_, late) = result["marks"]
    report_growth = result["packed"] * 0.9  # the ids packed after the first mark
    assert late - early <= report_growth + 64 * 1024 * 1024, (early, late, result["packed"])
