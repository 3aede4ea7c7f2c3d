"""Transfers that reach the emulator together are stored in one commit (a group commit),
and each is still acknowledged only after the commit that holds it.

A raw AMQP client writes several transfers in one TCP write, so they reach the server
in one read and one turn of its reactor.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _raw_amqp import RawClient
from proton import Delivery
from proton import Message as AmqpMessage
from pytest_mock import MockerFixture

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator
from sendonce.emulator._worker import StorageWorker

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

_HOLD_LOCK = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "c.execute('BEGIN IMMEDIATE')\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
    "c.execute('ROLLBACK')\n"
)


def _stage(link: Any, message_id: str, **fields: Any) -> Any:
    """One transfer written into the client's engine (not yet onto the socket)."""
    dlv = link.delivery(message_id.encode())
    link.send(AmqpMessage(id=message_id, body=b"body of " + message_id.encode(), **fields).encode())
    link.advance()
    return dlv


def _answered(deliveries: list[Any]) -> bool:
    return all(d.remote_state in (Delivery.ACCEPTED, Delivery.REJECTED) for d in deliveries)


def _group_sizes(spy: Any) -> list[int]:
    return [len(call.args[1]) for call in spy.call_args_list]


def test_transfers_arriving_together_share_one_commit(
    emulator: Emulator, broker_path: Path, mocker: MockerFixture
) -> None:
    spy = mocker.spy(LocalBackend, "send_together")
    with RawClient(emulator.port) as raw:
        raw.open()
        links = [raw.sender("orders") for _ in range(3)]
        deliveries = [_stage(links[i % 3], f"g-{i}") for i in range(9)]
        raw.until(lambda: _answered(deliveries))
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * 9
    assert max(_group_sizes(spy)) > 1, _group_sizes(spy)
    with LocalBackend(broker_path) as store:
        assert sorted(store.message_ids("orders")) == sorted(f"g-{i}" for i in range(9))


def test_a_transfer_the_broker_refuses_fails_alone(
    emulator: Emulator, broker_path: Path, mocker: MockerFixture
) -> None:
    with LocalBackend(broker_path) as store:
        store.create_entity(EntityProfile("sessions-only", sessions=True))
    spy = mocker.spy(LocalBackend, "send_together")
    with RawClient(emulator.port) as raw:
        raw.open()
        orders, sessions = raw.sender("orders"), raw.sender("sessions-only")
        deliveries = [
            _stage(orders, "ok-1"),
            _stage(sessions, "no-session"),  # refused: the entity requires a session id
            _stage(orders, "ok-2"),
            _stage(sessions, "with-session", group_id="s1"),
        ]
        raw.until(lambda: _answered(deliveries))
    states = [d.remote_state for d in deliveries]
    assert states == [Delivery.ACCEPTED, Delivery.REJECTED, Delivery.ACCEPTED, Delivery.ACCEPTED]
    assert "session" in str(deliveries[1].remote.condition.description)
    assert max(_group_sizes(spy)) > 1, "the four arrived together"
    with LocalBackend(broker_path) as store:
        assert sorted(store.message_ids("orders")) == ["ok-1", "ok-2"]
        assert store.message_ids("sessions-only") == ["with-session"]


def test_no_transfer_of_a_group_is_acknowledged_before_its_commit(
    emulator: Emulator, broker_path: Path, mocker: MockerFixture
) -> None:
    handed_off = mocker.spy(StorageWorker, "submit")
    with RawClient(emulator.port) as raw:
        raw.open()
        links = [raw.sender("orders") for _ in range(2)]
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_LOCK, str(broker_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            deliveries = [_stage(links[i % 2], f"held-{i}") for i in range(4)]
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                raw.pump()
            # no outcome yet: nothing is committed while the lock is held
            assert [d.remote_state for d in deliveries] == [0] * 4
            assert handed_off.call_count == 1  # the file is locked: one hand-off for the group
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(10)
        raw.until(lambda: _answered(deliveries))
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * 4
    with LocalBackend(broker_path) as store:
        assert sorted(store.message_ids("orders")) == [f"held-{i}" for i in range(4)]


def test_a_failure_answering_one_transfer_leaves_the_group_answered(
    emulator: Emulator, broker_path: Path, mocker: MockerFixture
) -> None:
    # A bug while answering one client (no real peer causes it) must cost only that client.
    from sendonce.emulator._transfers import Transfers

    real = Transfers.after_commit

    def after_commit(self: Any, link: Any, dlv: Any, action: Any) -> None:
        if str(dlv.tag) == "answer-fails":  # proton hands the tag over as str
            raise RuntimeError("a bug while answering")
        real(self, link, dlv, action)

    mocker.patch.object(Transfers, "after_commit", after_commit)
    with RawClient(emulator.port) as unlucky, RawClient(emulator.port) as other:
        unlucky.open()
        other.open()
        bad, good = unlucky.sender("orders"), other.sender("orders")
        doomed = _stage(bad, "answer-fails")
        answered = [_stage(good, f"fine-{i}") for i in range(3)]
        unlucky.flush()
        other.until(lambda: _answered(answered))
        unlucky.until(lambda: unlucky.closed_by_server or doomed.remote_state != 0)
    assert [d.remote_state for d in answered] == [Delivery.ACCEPTED] * 3
    assert doomed.remote_state == 0  # its connection was dropped: in doubt for the client
    assert unlucky.closed_by_server
    with LocalBackend(broker_path) as store:
        ids = store.message_ids("orders")
    assert sorted(ids) == ["answer-fails", "fine-0", "fine-1", "fine-2"]  # each exactly once


def test_an_acknowledgement_is_written_in_the_turn_of_its_commit(
    emulator: Emulator, broker_path: Path, mocker: MockerFixture
) -> None:
    """The disposition goes onto the socket right after the commit, not on a later turn of
    the loop that waits for the socket to be writable (one select and one event fewer)."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    from sendonce.emulator._server import DirectIO

    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_sender("orders") as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"warm", message_id="warm"))  # attach first
        writable = mocker.spy(DirectIO, "on_selectable_writable")
        for i in range(10):
            sender.send_messages(ServiceBusMessage(b"body", message_id=f"t-{i}"))
        writes_on_later_turns = writable.call_count
    assert writes_on_later_turns < 10  # was one per transfer, at least
    with LocalBackend(broker_path) as store:
        assert sorted(store.message_ids("orders")) == sorted(
            ["warm", *(f"t-{i}" for i in range(10))]
        )
