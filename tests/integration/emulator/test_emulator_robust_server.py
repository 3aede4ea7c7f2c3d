"""The emulator as a server: never frozen by a locked broker file, never killed by clients.

Each test reproduces a failure of an earlier emulator with real sockets on
loopback, a real second process holding the broker file's write lock, and
descriptor limits set with RLIMIT_NOFILE in a subprocess.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _raw_amqp import SASL_HEADER, RawClient, frame, server_closed
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from proton import Delivery, Endpoint

from sendonce import Message
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

_HOLD_LOCK = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "c.execute('BEGIN IMMEDIATE')\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
    "c.execute('ROLLBACK')\n"
)


def _settled(read: object, want: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    value = read()  # type: ignore[operator]
    while value != want and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()  # type: ignore[operator]
    return int(value)


def _answers_header(port: int, timeout: float) -> bool:
    """Whether a new connection gets the server's protocol header back within ``timeout``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(SASL_HEADER)
        try:
            return sock.recv(8) == SASL_HEADER
        except TimeoutError:
            return False


def _hold_lock(broker_path: Path) -> subprocess.Popen[str]:
    """Another process holding the broker file's write lock until :func:`_release`."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(broker_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(10)


def test_a_write_lock_held_by_another_process_delays_only_writes(
    emulator: Emulator, broker_path: Path
) -> None:
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client, client.get_queue_sender("orders") as sender:
        sender.send_messages(ServiceBusMessage("before", message_id="before"), timeout=30)
        holder = _hold_lock(broker_path)
        try:
            sent: list[BaseException | None] = []

            def send_during() -> None:
                try:
                    sender.send_messages(
                        ServiceBusMessage("during", message_id="during"), timeout=60
                    )
                    sent.append(None)
                except BaseException as exc:  # reported below
                    sent.append(exc)

            blocked = threading.Thread(target=send_during)
            blocked.start()
            time.sleep(0.5)  # the send now waits for the lock
            assert not sent
            # New connections are answered, and reads (a new client's peek) are served.
            # (Bounds for a busy machine: the lock is held until the end, so a server that
            # waited for it would never answer; no duration is asserted.)
            assert _answers_header(emulator.port, timeout=15)
            other = ServiceBusClient.from_connection_string(
                emulator.connection_string, retry_total=0
            )
            with other, other.get_queue_receiver("orders") as peeker:
                peeked = peeker.peek_messages(max_message_count=10, timeout=30)
            assert [str(m) for m in peeked] == ["before"]
            assert not sent and blocked.is_alive()
        finally:
            _release(holder)
        blocked.join(30)
        assert sent == [None]  # the delayed send went through once the lock was free
        with client.get_queue_receiver("orders", max_wait_time=2) as receiver:
            got = []
            for _ in range(5):
                batch = receiver.receive_messages(max_message_count=10, max_wait_time=1)
                for m in batch:
                    receiver.complete_message(m)
                got += [str(m) for m in batch]
                if len(got) >= 2:
                    break
    assert sorted(got) == ["before", "during"]


def test_a_consumer_waiting_on_a_locked_file_does_not_freeze_the_server(
    emulator: Emulator, store: LocalBackend, broker_path: Path
) -> None:
    # A message is available; handing it out needs the write lock another process holds.
    store.send("orders", [Message("waiting", message_id="waiting")], timeout=10)
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client, client.get_queue_receiver("orders") as receiver:
        holder = _hold_lock(broker_path)
        try:
            box: list[list[str]] = []
            waiting = threading.Thread(
                target=lambda: box.append(
                    [
                        str(m)
                        for m in receiver.receive_messages(max_message_count=1, max_wait_time=4)
                    ]
                )
            )
            waiting.start()
            for _ in range(3):
                time.sleep(0.5)
                assert _answers_header(emulator.port, timeout=15)  # served under the lock
            waiting.join(30)
            assert box == [[]]  # nothing could be handed out under the lock
        finally:
            _release(holder)
        got = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert [str(m) for m in got] == ["waiting"]  # and nothing was lost
        receiver.complete_message(got[0])


def test_a_connection_that_never_opens_is_closed(broker_path: Path) -> None:
    with Emulator(broker_path, handshake_timeout=0.5) as emu:
        idle = socket.create_connection(("127.0.0.1", emu.port), timeout=5)
        opened = RawClient(emu.port)
        with idle, opened:
            idle.sendall(SASL_HEADER)  # the header, and then nothing
            opened.open()
            assert server_closed(idle, timeout=5)
            for _ in range(20):  # an opened connection is kept past the handshake timeout
                opened.pump(0.05)
            assert not opened.closed_by_server
        assert _settled(lambda: emu.open_connections, 0) == 0


def test_an_idle_connection_is_closed_after_the_advertised_idle_timeout(
    broker_path: Path,
) -> None:
    with Emulator(broker_path, idle_timeout=1.0) as emu, RawClient(emu.port) as raw:
        raw.open()
        advertised = raw.transport.remote_idle_timeout
        assert 0 < advertised <= 1.0
        # Silent from now on: no frames, no heartbeats.
        assert server_closed(raw.sock, timeout=6)
        assert _settled(lambda: emu.open_connections, 0) == 0


def test_connections_beyond_the_limit_are_refused_with_a_reason(broker_path: Path) -> None:
    with Emulator(broker_path, max_connections=2) as emu:
        first, second, third = (RawClient(emu.port) for _ in range(3))
        with first, second, third:
            first.open()
            second.open()
            third.connection.open()
            third.until(lambda: third.connection.state & Endpoint.REMOTE_CLOSED)
            refusal = third.connection.remote_condition
            assert refusal is not None and refusal.name == "amqp:resource-limit-exceeded"
            assert "at most 2 connections" in str(refusal.description)
            assert server_closed(third.sock, timeout=5)
        assert _settled(lambda: emu.open_connections, 0) == 0
        with RawClient(emu.port) as again:
            again.open()  # room again once the others are gone


_BAD_CLIENTS = {
    "garbage SASL frame": lambda port: _raw(port, SASL_HEADER + frame(b"\xde\xad" * 8, kind=1)),
    "unknown performative": lambda port: _opened_then(port, frame(b"\x00\x53\xff\x45")),
    # a begin whose field list claims 16 bytes and holds one
    "broken begin": lambda port: _opened_then(port, frame(b"\x00\x53\x11\xc0\x10\x05\x40")),
}


def _raw(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(data)
    return sock


def _opened_then(port: int, data: bytes) -> socket.socket:
    raw = RawClient(port)
    raw.open()
    raw.sock.sendall(data)
    return raw.sock


def _close_wait(port: int) -> int:
    """Server-side sockets of ``port`` in CLOSE-WAIT (the peer closed, the server did not)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "08":
                count += 1
    return count


def _socket_inodes(port: int) -> set[str]:
    """The inodes of the TCP sockets with ``port`` at either end (this process's or not)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            ends = (fields[1], fields[2])
            if any(int(end.rsplit(":", 1)[1], 16) == port for end in ends):
                inodes.add(fields[9])
    return inodes


def _emulator_fds(port: int, folder: Path) -> set[tuple[str, str]]:
    """This process's descriptors that belong to the emulator on ``port`` (its sockets) or to
    its broker file in ``folder``: only what this test made, not what another test of the
    worker left open or closes meanwhile."""
    inodes = _socket_inodes(port)
    fds: set[tuple[str, str]] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(str(folder)) or (
            target.startswith("socket:[") and target[8:-1] in inodes
        ):
            fds.add((fd, target))
    return fds


@pytest.mark.parametrize("kind", sorted(_BAD_CLIENTS))
def test_a_malformed_client_gets_its_socket_closed(
    emulator: Emulator, broker_path: Path, kind: str
) -> None:
    def opened() -> int:
        return len(_emulator_fds(emulator.port, broker_path.parent) - before)

    before = _emulator_fds(emulator.port, broker_path.parent)
    for _ in range(4):  # a socket or connection kept per bad client would show below
        sock = _BAD_CLIENTS[kind](emulator.port)
        with sock:
            assert server_closed(sock, timeout=5)
    assert _settled(lambda: emulator.open_connections, 0) == 0
    assert _settled(opened, 0) == 0
    assert _close_wait(emulator.port) == 0
    # and the server still serves
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client, client.get_queue_sender("orders") as sender:
        sender.send_messages(ServiceBusMessage("after", message_id="after"), timeout=30)


def _serve_in_subprocess(
    broker_path: Path, files: int, *extra: str
) -> tuple[subprocess.Popen[str], int]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    code = "from sendonce.cli import main; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "emulator", "--db", str(broker_path), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving"), line
    port = int(line.rsplit(":", 1)[1])
    proc.stdout.readline()  # the connection string
    return proc, port


def test_running_out_of_file_descriptors_does_not_kill_the_server(broker_path: Path) -> None:
    proc, port = _serve_in_subprocess(broker_path, 64, "--max-connections", "1000")
    socks: list[socket.socket] = []
    try:
        for _ in range(90):  # more than the process has descriptors for
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(SASL_HEADER)
            socks.append(sock)
        time.sleep(1.0)
        assert proc.poll() is None, "the emulator died"
        for sock in socks:
            sock.close()
        socks.clear()
        conn_str = (
            f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey=v;"
            "UseDevelopmentEmulator=true;"
        )
        client = ServiceBusClient.from_connection_string(conn_str, retry_total=3)
        with client, client.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("served", message_id="served"), timeout=30)
        assert proc.poll() is None
    finally:
        for sock in socks:
            sock.close()
        proc.terminate()
        proc.wait(20)
    with LocalBackend(broker_path) as store:
        assert store.message_ids("orders") == ["served"]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_oversized_transfers_are_refused_while_they_arrive(broker_path: Path) -> None:
    proc, port = _serve_in_subprocess(broker_path, 1024)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_kib(proc.pid))
            time.sleep(0.05)

    outcomes: list[object] = []

    def send_100_mb() -> None:
        with RawClient(port, timeout=60) as raw:
            raw.open()
            link = raw.sender("orders")
            dlv = link.delivery(b"huge")
            chunk = b"\0" * (1 << 20)
            for _ in range(100):
                link.stream(chunk)
                raw.flush()
            link.advance()
            raw.until(lambda: dlv.remote_state != 0, timeout=60)
            outcomes.append((dlv.remote_state, link.remote_condition or dlv.remote.condition))

    try:
        baseline = _rss_kib(proc.pid)
        watcher = threading.Thread(target=watch)
        watcher.start()
        senders = [threading.Thread(target=send_100_mb) for _ in range(4)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(120)
        stop.set()
        watcher.join()
        assert len(outcomes) == 4
        for state, cond in outcomes:
            assert state == Delivery.REJECTED
            assert cond is not None and cond.name == "amqp:link:message-size-exceeded"
        assert peak[0] - baseline < 64 * 1024, f"RSS grew {baseline} -> {peak[0]} KiB"
        assert proc.poll() is None
    finally:
        stop.set()
        proc.terminate()
        proc.wait(20)
    with LocalBackend(broker_path) as store:
        assert store.message_ids("orders") == []
