"""A client refused at the connection limit gets the reason even when its handshake starts
late: the refusal is sent once its open arrives, and only then is the socket closed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _raw_amqp import RawClient
from proton import Endpoint

from sendonce.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def test_a_refused_client_slow_to_start_its_handshake_still_hears_why(broker_path: Path) -> None:
    with Emulator(broker_path, max_connections=1, poll_interval=0.02) as emu:
        with RawClient(emu.port) as first, RawClient(emu.port) as late:
            first.open()
            time.sleep(0.3)  # connected, and silent for several of the server's polls
            late.connection.open()
            late.until(lambda: late.connection.state & Endpoint.REMOTE_CLOSED, timeout=10)
            refusal = late.connection.remote_condition
            assert refusal is not None and refusal.name == "amqp:resource-limit-exceeded"
            assert "at most 1 connections" in str(refusal.description)
