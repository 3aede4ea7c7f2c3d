"""A hand-driven AMQP client on a raw socket, for what no well-behaved client does.

Proton's engine (no reactor) writes the frames into memory; the test decides
what reaches the socket and when: stop after the protocol header, go silent
after the open, append malformed frames, or stream a huge transfer chunk by
chunk without holding it in memory.
"""

from __future__ import annotations

import socket
import struct
import time

from proton import Connection, Endpoint, Transport

__all__ = ["RawClient", "frame", "server_closed"]

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


def frame(body: bytes, *, channel: int = 0, kind: int = 0) -> bytes:
    """One AMQP frame: size, data offset 2, type (0 AMQP, 1 SASL), channel, body."""
    return struct.pack(">IBBH", 8 + len(body), 2, kind, channel) + body


def server_closed(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes the connection within ``timeout`` (reads and drops data)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


class RawClient:
    """An AMQP connection driven by hand: ``pump()`` moves bytes both ways once."""

    def __init__(self, port: int, *, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.transport = Transport()
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.connection = Connection()
        self.connection.container = "raw-test-client"
        self.transport.bind(self.connection)
        self.closed_by_server = False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self) -> None:
        """Write everything the engine has produced (within the client's timeout: ``pump``
        leaves the socket with its short read wait, too short for a busy server to drain
        a megabyte)."""
        self.sock.settimeout(self.timeout)
        while True:
            pending = self.transport.pending()
            if pending <= 0:
                return
            self.sock.sendall(self.transport.peek(pending))
            self.transport.pop(pending)

    def pump(self, wait: float = 0.05) -> None:
        """Write what is pending, then read what arrives within ``wait`` seconds."""
        self.flush()
        self.sock.settimeout(wait)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed_by_server = True
            self.transport.close_tail()
            return
        self.transport.push(data)
        self.flush()

    def until(self, done: object, timeout: float = 10.0) -> None:
        """Pump until ``done()`` is true (or fail after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not done():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not answer in time")
            if self.closed_by_server:
                raise ConnectionError("the server closed the connection")
            self.pump()

    def open(self) -> None:
        """SASL ANONYMOUS and the AMQP open, completed."""
        self.connection.open()
        self.until(lambda: self.connection.state & Endpoint.REMOTE_ACTIVE)

    def sender(self, address: str):  # type: ignore[no-untyped-def]
        """An attached sending link to ``address`` with credit from the server."""
        session = self.connection.session()
        session.open()
        link = session.sender("raw-sender")
        link.target.address = address
        link.open()
        self.until(lambda: link.state & Endpoint.REMOTE_ACTIVE and link.credit > 0)
        return link
