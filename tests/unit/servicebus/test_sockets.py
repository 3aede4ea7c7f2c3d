"""The real client over real sockets: every call ends within its timeout, nothing hangs.

These peers are deliberately broken (refusing, silent, hanging up); the working
AMQP peer is the emulator, exercised by the emulator tests.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.cli import main
from sendonce.errors import AttemptNotSentError, InDoubtError, NotStoredError, TransientSendError

pytestmark = pytest.mark.timeout(60)


def _conn_str(port: int) -> str:
    return (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=not-a-real-key;UseDevelopmentEmulator=true"
    )


class Peer:
    """A TCP listener that either stays silent or hangs up on every connection."""

    def __init__(self, *, hang_up: bool) -> None:
        self.hang_up = hang_up
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            if self.hang_up:
                conn.close()
            else:
                self.accepted.append(conn)

    def close(self) -> None:
        # close() alone does not wake the thread blocked in accept() (Linux): shutdown() does,
        # and the thread ends here rather than outliving the test in its worker.
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=30)
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[Peer]:
    peer = Peer(hang_up=False)
    yield peer
    peer.close()


@pytest.fixture
def hang_up() -> Iterator[Peer]:
    peer = Peer(hang_up=True)
    yield peer
    peer.close()


def _open_workers(before: set[threading.Thread]) -> list[threading.Thread]:
    """The link-opening threads started since ``before`` (not another test's)."""
    return [
        t
        for t in set(threading.enumerate()) - before
        if t.name.startswith("sendonce-servicebus-open")
    ]


def test_a_silent_peer_cannot_hang_send_or_schedule(silent: Peer) -> None:
    before = set(threading.enumerate())
    backend = AzureServiceBusBackend.from_connection_string(_conn_str(silent.port))
    try:
        with pytest.raises(TransientSendError, match="nothing was sent") as info:
            backend.send("orders", [Message("x", message_id="m-1")], timeout=1)
        assert info.value.message_id == "m-1"
        with pytest.raises(TransientSendError, match="nothing was sent"):
            backend.schedule(
                "orders",
                [Message("x", message_id="m-2")],
                datetime.now(UTC) + timedelta(minutes=5),
                timeout=1,
            )
        assert len(silent.accepted) == 2  # each attempt opened a new connection
    finally:
        backend.close()  # must not deadlock on the abandoned links
    for worker in _open_workers(before):
        worker.join(timeout=30)
        assert not worker.is_alive(), "the abandoned link-opening thread must end"


def test_a_peer_that_hangs_up_before_the_link_opens_is_not_sent(hang_up: Peer) -> None:
    with AzureServiceBusBackend.from_connection_string(_conn_str(hang_up.port)) as backend:
        with pytest.raises(AttemptNotSentError):
            backend.send("orders", [Message("x", message_id="m-1")], timeout=5)
        with pytest.raises(AttemptNotSentError):  # and again, on a fresh sender
            backend.send("orders", [Message("x", message_id="m-1")], timeout=5)


def test_a_refused_connection_carries_the_socket_error_condition() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with AzureServiceBusBackend.from_connection_string(_conn_str(port)) as backend:
        with pytest.raises(TransientSendError) as info:
            backend.send("orders", [Message("x", message_id="m-1")], timeout=5)
    assert info.value.condition == "amqp:socket-error"
    assert info.value.message_id == "m-1"


def _refused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# Issue 14 (3): a send that never reached the broker is "not stored", never "in doubt".

_QUICK = {"max_attempts": 3, "initial_backoff": 0.01, "max_backoff": 0.02, "attempt_timeout": 1}


@pytest.mark.parametrize("peer", ["refused", "silent", "hang_up"])
def test_a_broker_never_reached_is_not_stored_after_the_retries(peer: str) -> None:
    server = None if peer == "refused" else Peer(hang_up=peer == "hang_up")
    port = _refused_port() if server is None else server.port
    profile = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=1))
    backend = AzureServiceBusBackend.from_connection_string(
        _conn_str(port), profiles={"orders": profile}
    )
    try:
        with IdempotentSender(backend, "orders", retry=RetryPolicy(**_QUICK)) as sender:
            with pytest.raises(NotStoredError, match="was not stored") as info:
                sender.send(Message("x", message_id="m-1"))
            assert not isinstance(info.value, InDoubtError)
            assert info.value.attempts == 3 and "in doubt" not in str(info.value)
            report = sender.send_many([Message("y", message_id="m-2")])
            assert report.failed == 1 and report.in_doubt == []
            assert isinstance(report.failures[0].error, NotStoredError)
    finally:
        backend.close()
        if server is not None:
            server.close()


def test_publish_to_an_unreachable_broker_retries_visibly_then_says_not_stored(tmp_path) -> None:
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 1}\n')
    result = CliRunner().invoke(
        main,
        [
            "publish",
            str(source),
            "--to",
            _conn_str(_refused_port()),
            "--entity",
            "orders",
            "--id",
            "{order_id}",
            "--window",
            "1m",
            "--attempts",
            "2",
            "--timeout",
            "2s",
            "--no-progress",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "retrying 1: attempt 1 of 2 failed" in result.stderr
    assert "was not stored" in result.stderr and "in doubt" not in result.stderr
