"""The producer's journal survives a SIGKILL in the middle of a write."""

from __future__ import annotations

from pathlib import Path

from .producer import Journal, read_journal


def test_a_torn_journal_line_is_skipped_and_later_lines_kept(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"ev":"start","incarnation":0,"t":0}\n{"ev":"atte', encoding="utf-8")
    journal = Journal(path)  # the next incarnation
    assert [e["incarnation"] for e in journal.events] == [0]
    journal.write({"ev": "start", "incarnation": 1, "t": 1})
    journal.close()
    assert [e["incarnation"] for e in read_journal(path)] == [0, 1]


def test_every_event_is_on_disk_when_write_returns(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.write({"ev": "attempt", "call": "0.0", "ids": [1, 2]})
    assert read_journal(path) == [{"ev": "attempt", "call": "0.0", "ids": [1, 2]}]
    journal.close()
