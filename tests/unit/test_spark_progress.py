"""The progress board: task attempts' running counts over a real socket, merged per partition."""

from __future__ import annotations

import socket

from sendonce.spark._progress import ProgressBoard, ProgressLine, merge_attempts
from sendonce.spark._task import PartitionResult


def test_attempts_report_and_the_board_keeps_the_latest_counts() -> None:
    with ProgressBoard("127.0.0.1") as board:
        first = board.line.reporter(partition=0, attempt=0)
        first.report(50, 50, 0, 0)
        first.report(100, 100, 0, 0)
        first.close()
        retry = board.line.reporter(partition=0, attempt=1)
        retry.report(100, 0, 100, 0)
        retry.close()
        other = board.line.reporter(partition=2, attempt=0)
        other.report(40, 30, 10, 0)
        other.close()
        board.settle()
        results = board.results()
    assert results == (
        PartitionResult(0, 1, 100, 100, 0, 0, 0.0, ()),
        PartitionResult(2, 0, 40, 30, 10, 0, 0.0, ()),
    )


def test_lines_without_the_token_are_ignored() -> None:
    with ProgressBoard("127.0.0.1") as board:
        forged = ProgressLine(board.line.host, board.line.port, "not-the-token")
        reporter = forged.reporter(0, 0)
        reporter.report(10, 10, 0, 0)
        reporter.close()
        with socket.create_connection((board.line.host, board.line.port)) as raw:
            raw.sendall(b"not json\n")
        board.settle()
        assert board.results() == ()


def test_an_unreachable_board_never_fails_the_task() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reporter = ProgressLine("127.0.0.1", port, "t").reporter(0, 0)
    reporter.report(1, 1, 0, 0)
    reporter.report(2, 2, 0, 0)
    reporter.close()


def test_merging_attempts_sums_sent_and_takes_the_most_confirmed() -> None:
    # Attempt 0 sent 30 and died; attempt 1 found those 30 (and 20 older rows) and sent 50 more.
    merged = merge_attempts({(3, 0): (30, 30, 0, 0), (3, 1): (100, 50, 50, 0)})
    assert merged == (PartitionResult(3, 1, 100, 80, 20, 0, 0.0, ()),)
