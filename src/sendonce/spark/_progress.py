"""Counts confirmed by each task attempt, streamed to the driver as they happen.

A job that fails returns no result rows, and an aborted job's accumulators
are lost (and absent under Spark Connect). So every task attempt reports its
running counts, after each batch the broker confirmed, over a small TCP
connection to a listener on the driver -- the one peer every executor of a
classic session can already reach (they talk to the driver anyway). If the
publish then fails, the driver still knows how far each partition got.

Best effort by design: an executor that cannot reach the listener keeps
publishing and reports nothing; the counts are then "at least".
"""

from __future__ import annotations

import json
import secrets
import select
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from typing import Any

from ._task import PartitionResult

__all__ = ["ProgressBoard", "ProgressLine", "ProgressReporter", "merge_attempts"]

_CONNECT_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class ProgressLine:
    """Where tasks report to: shipped to the executors in the task closure. Picklable."""

    host: str
    port: int
    token: str

    def reporter(self, partition: int, attempt: int) -> ProgressReporter:
        return ProgressReporter(self, partition, attempt)


class ProgressReporter:
    """One task attempt's connection to the board; silent and disabled after any error."""

    def __init__(self, line: ProgressLine, partition: int, attempt: int) -> None:
        self._line = line
        self._head = [line.token, partition, attempt]
        self._sock: socket.socket | None = None
        self._broken = False

    def report(self, rows: int, sent: int, duplicates: int, failed: int) -> None:
        if self._broken:
            return
        data = (json.dumps([*self._head, rows, sent, duplicates, failed]) + "\n").encode()
        try:
            if self._sock is None:
                address = (self._line.host, self._line.port)
                self._sock = socket.create_connection(address, timeout=_CONNECT_TIMEOUT)
            self._sock.sendall(data)
        except OSError:
            self._broken = True
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        board = self.server.board
        try:
            for raw in self.rfile:
                try:
                    token, partition, attempt, *counts = json.loads(raw)
                    if token != board.token or len(counts) != 4:
                        return
                    board.record(int(partition), int(attempt), tuple(int(c) for c in counts))
                except (ValueError, TypeError):
                    return
        finally:
            board.opened(-1)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    board: ProgressBoard

    def get_request(self) -> Any:
        # Accepted and counted under the board's lock: ``settle`` never sees a
        # connection that has left the listen queue but is not counted yet.
        with self.board._lock:
            request = super().get_request()
            self.board._open += 1
        return request


class ProgressBoard:
    """The driver side: a listener thread keeping the latest counts of every task attempt."""

    def __init__(self, host: str) -> None:
        self.token = secrets.token_hex(16)
        self._counts: dict[tuple[int, int], tuple[int, ...]] = {}
        self._lock = threading.Lock()
        self._open = 0
        self._server = _Server((host, 0), _Handler)
        self._server.board = self
        self.line = ProgressLine(host, self._server.server_address[1], self.token)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name="sendonce-progress", daemon=True
        )
        self._thread.start()

    def record(self, partition: int, attempt: int, counts: tuple[int, ...]) -> None:
        with self._lock:
            self._counts[(partition, attempt)] = counts

    def opened(self, change: int) -> None:
        with self._lock:
            self._open += change

    def settle(self, timeout: float = 3.0) -> None:
        """Wait a little for reports still on their way (a cancelled task may still report)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:  # atomic with the accept-and-count of ``get_request``
                idle = self._open == 0
                pending, _, _ = select.select([self._server.socket], [], [], 0)
            if idle and not pending:
                return
            time.sleep(0.02)

    def results(self) -> tuple[PartitionResult, ...]:
        with self._lock:
            counts = dict(self._counts)
        return merge_attempts(counts)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ProgressBoard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def merge_attempts(counts: dict[tuple[int, int], tuple[int, ...]]) -> tuple[PartitionResult, ...]:
    """One result per partition from the counts of all its attempts.

    A later attempt sees what earlier ones sent as duplicates, so the rows on
    the broker are the most any attempt confirmed, and those this call put
    there are the sum of every attempt's ``sent``.
    """
    by_partition: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for (partition, attempt), c in counts.items():
        by_partition.setdefault(partition, []).append((attempt, c))
    merged = []
    for partition, attempts in sorted(by_partition.items()):
        rows = max(c[0] for _, c in attempts)
        sent = sum(c[1] for _, c in attempts)
        delivered = max(max(c[1] + c[2] for _, c in attempts), sent)
        failed = max(c[3] for _, c in attempts)
        last = max(a for a, _ in attempts)
        merged.append(
            PartitionResult(partition, last, rows, sent, delivered - sent, failed, 0.0, ())
        )
    return tuple(merged)


def driver_host(session: Any) -> str | None:
    """The address executors use to reach the driver, or None when unknown."""
    try:
        host = session.conf.get("spark.driver.host", None)
    except Exception:
        return None
    return str(host) if host else None
