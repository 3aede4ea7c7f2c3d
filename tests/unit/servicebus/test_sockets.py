"""The real client over real sockets: every call ends within its timeout, nothing hangs.

These peers are deliberately broken (refusing, silent, hanging up); the working
AMQP peer is the emulator, exercised by the emulator tests.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from sendonce import Message
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.errors import TransientSendError

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
        self.server.close()
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


def _open_workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sendonce-servicebus-open")]


def test_a_silent_peer_cannot_hang_send_or_schedule(silent: Peer) -> None:
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
    for worker in _open_workers():
        worker.join(timeout=30)
        assert not worker.is_alive(), "the abandoned link-opening thread must end"


def test_a_peer_that_hangs_up_is_in_doubt_and_retryable(hang_up: Peer) -> None:
    with AzureServiceBusBackend.from_connection_string(_conn_str(hang_up.port)) as backend:
        with pytest.raises(TransientSendError):
            backend.send("orders", [Message("x", message_id="m-1")], timeout=5)
        with pytest.raises(TransientSendError):  # and again, on a fresh sender
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
