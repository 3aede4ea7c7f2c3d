"""Starting and stopping the emulator, its configuration checks, and the CLI command."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, parse_connection_string

from _interrupts import sigint_default
from sendonce import ConfigurationError
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def test_connection_string_is_the_emulator_form(emulator: Emulator) -> None:
    props = parse_connection_string(emulator.connection_string)
    assert props.fully_qualified_namespace == f"127.0.0.1:{emulator.port}"
    assert "UseDevelopmentEmulator=true" in emulator.connection_string
    assert f"127.0.0.1:{emulator.port}" in emulator.connection_string
    assert emulator.port > 0


def test_stops_with_the_context_and_frees_the_port(broker_path: Path) -> None:
    with Emulator(broker_path) as emu:
        port = emu.port
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        assert emu.running
    assert not emu.running
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    emu.stop()  # idempotent


def _settled(read: object, want: int, timeout: float = 10.0) -> int:
    """Poll a counter until it reaches ``want`` (closing is asynchronous)."""
    import time

    deadline = time.monotonic() + timeout
    value = read()  # type: ignore[operator]
    while value != want and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()  # type: ignore[operator]
    return int(value)


def test_open_connections_count_clients_until_they_close(emulator: Emulator) -> None:
    assert (emulator.open_connections, emulator.connections_accepted) == (0, 0)
    first = ServiceBusClient.from_connection_string(emulator.connection_string)
    second = ServiceBusClient.from_connection_string(emulator.connection_string)
    with first, second:
        a = first.get_queue_sender("orders")
        a.send_messages(ServiceBusMessage("x", message_id="one"))
        with second.get_queue_sender("orders") as b:
            b.send_messages(ServiceBusMessage("y", message_id="two"))
            assert emulator.open_connections == 2
        # the client's sender owns its connection: closing it closes the connection
        assert _settled(lambda: emulator.open_connections, 1) == 1
        a.close()
        assert _settled(lambda: emulator.open_connections, 0) == 0
    assert emulator.connections_accepted == 2


def test_a_dropped_connection_is_no_longer_counted(emulator: Emulator) -> None:
    from sendonce.emulator import Fault, FaultAction

    emulator.faults.add(Fault(FaultAction.DROP_AFTER_COMMIT))
    client = ServiceBusClient.from_connection_string(emulator.connection_string, retry_total=0)
    with client, client.get_queue_sender("orders") as sender:
        with pytest.raises(Exception):  # noqa: B017 - the client's own error for a drop
            sender.send_messages(ServiceBusMessage("x", message_id="one"))
        assert _settled(lambda: emulator.open_connections, 0) == 0
    assert emulator.connections_accepted == 1


def test_binds_loopback_only(broker_path: Path) -> None:
    for host in ("0.0.0.0", "192.168.1.10", "example.com", "::1"):
        with pytest.raises(ConfigurationError, match="loopback"):
            Emulator(broker_path, host=host)
    with pytest.raises(ConfigurationError, match="port"):
        Emulator(broker_path, port=70000)


def test_port_and_connection_string_need_a_started_emulator(broker_path: Path) -> None:
    emu = Emulator(broker_path)
    with pytest.raises(RuntimeError, match="not started"):
        _ = emu.connection_string


def test_a_busy_port_is_reported_by_start(broker_path: Path) -> None:
    with Emulator(broker_path) as first:
        second = Emulator(broker_path, port=first.port)
        with pytest.raises(OSError):
            second.start()


def test_cli_serves_until_interrupted(broker_path: Path) -> None:
    code = "from sendonce.cli import main; main()"
    with sigint_default():  # the child stops on SIGINT even if this process ignores it
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "emulator", "--db", str(broker_path), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("serving ")
        conn_str = proc.stdout.readline().strip()
        assert conn_str.startswith("Endpoint=sb://127.0.0.1:")
        sb = ServiceBusClient.from_connection_string(conn_str, retry_total=0)
        with sb, sb.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage(b"cli", message_id="cli-1"), timeout=10)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopped" in out
    with LocalBackend(broker_path) as store:
        assert store.message_ids("orders") == ["cli-1"]


def test_cli_refuses_a_public_host(broker_path: Path) -> None:
    code = "from sendonce.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "emulator", "--db", str(broker_path), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "loopback" in proc.stderr
