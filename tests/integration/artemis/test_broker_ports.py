"""The test broker's ports (tests/artemis/broker.py): a port chosen free can be taken by another
process before the JVM binds it (CI saw ``AMQ229230: Failed to bind acceptor tls``). The first
start then moves the broker to fresh ports; a restart keeps its ports (clients know them) and
says which one was taken. The taken port here is a real listening socket."""

from __future__ import annotations

import socket

import pytest

from artemis import broker as harness
from artemis.broker import ArtemisBroker, PortTakenError
from artemis.raw import ACCEPTED, drain, raw_send


def _squat(port: int = 0) -> socket.socket:
    """A socket listening on 127.0.0.1:port, as another process's server would."""
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT sockets
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    return squatter


def test_a_port_taken_before_the_broker_binds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    picked: list[list[int]] = []
    real = harness._free_ports

    with _squat() as squatter:
        taken = squatter.getsockname()[1]

        def first_pick_collides(count: int) -> list[int]:
            ports = real(count)
            if not picked:
                ports[3] = taken  # the tls acceptor's, as in CI
            picked.append(ports)
            return ports

        monkeypatch.setattr(harness, "_free_ports", first_pick_collides)
        with ArtemisBroker() as broker:
            # The first start met the taken port and stopped; the second, on fresh ports, is up.
            assert "AMQ229230: Failed to bind acceptor tls" in broker.log()
            assert len(picked) == 2
            assert broker.tls_port == picked[1][3] != taken
            assert [broker.port, broker.nodedup_port, broker.plain_port] == picked[1][:3]
            assert raw_send(broker.url(), "moved", [("a", "on fresh ports")]) == [ACCEPTED]
            assert [m.body for m in drain(broker.url(), "moved")] == ["on fresh ports"]

            # Once active, its ports are the clients': a restart keeps them, and a taken one
            # is named, not silently replaced.
            broker.stop()
            with _squat(broker.plain_port):
                with pytest.raises(PortTakenError, match=f"plain to 127.0.0.1:{broker.plain_port}"):
                    broker.start()
            assert len(picked) == 2  # no new ports were picked
