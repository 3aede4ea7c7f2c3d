"""Scripted faults as the raw azure-servicebus client sees them."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusServerBusyError,
)

from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator, Fault, FaultAction

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def send_one(emu: Emulator, message_id: str, *, timeout: float = 10) -> None:
    sb = ServiceBusClient.from_connection_string(emu.connection_string, retry_total=0)
    with sb, sb.get_queue_sender("orders", keep_alive=None) as sender:
        sender.send_messages(ServiceBusMessage(b"x", message_id=message_id), timeout=timeout)


@pytest.mark.parametrize(
    ("action", "error", "stored"),
    [
        (FaultAction.DROP_AFTER_COMMIT, ServiceBusConnectionError, True),
        (FaultAction.DETACH_AFTER_COMMIT, ServiceBusError, True),
        (FaultAction.DROP_BEFORE_COMMIT, ServiceBusConnectionError, False),
        (FaultAction.SERVER_BUSY, ServiceBusServerBusyError, False),
        (FaultAction.UNAUTHORIZED, ServiceBusAuthorizationError, False),
    ],
)
def test_fault_surfaces_as_the_client_error(
    emulator: Emulator,
    store: LocalBackend,
    action: FaultAction,
    error: type[Exception],
    stored: bool,
) -> None:
    emulator.faults.add(Fault(action, entity="orders"))
    with pytest.raises(error):
        send_one(emulator, "f-1")
    assert store.message_ids("orders") == (["f-1"] if stored else [])
    assert emulator.faults.pending == 0
    # the script is spent: the next transfer goes through, and a resend is deduplicated
    send_one(emulator, "f-1")
    assert store.message_ids("orders") == ["f-1"]
    assert emulator.transfers("orders") == 2


def test_withheld_disposition_times_out_after_commit(
    emulator: Emulator, store: LocalBackend
) -> None:
    emulator.faults.add(FaultAction.WITHHOLD)
    with pytest.raises(OperationTimeoutError):
        send_one(emulator, "w-1", timeout=1)
    assert store.message_ids("orders") == ["w-1"]


def test_faults_match_entity_and_operation(emulator: Emulator, store: LocalBackend) -> None:
    emulator.faults.add(Fault(FaultAction.SERVER_BUSY, entity="elsewhere"))
    emulator.faults.add(Fault(FaultAction.SERVER_BUSY, operation="schedule"))
    send_one(emulator, "m-1")
    assert emulator.faults.pending == 2
    assert emulator.faults.applied == []
    emulator.faults.clear()
    assert emulator.faults.pending == 0


def test_fault_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError):
        Fault("drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="operation"):
        Fault(FaultAction.WITHHOLD, operation="receive")
