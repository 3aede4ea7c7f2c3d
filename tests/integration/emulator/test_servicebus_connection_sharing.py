"""The client's own connection-sharing path, as the installed azure-servicebus ships it.

docs/servicebus.md (Connections) explains why the backend holds one connection per lane:
``ServiceBusClient._connection_sharing`` (off, "pending fix") fails before a link opens, in
both halves. These tests pin that finding to the installed client: when an azure-servicebus
release repairs the path, they fail, and the section (and the backend) are to be revisited.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("proton")
pytest.importorskip("azure.servicebus")

from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def test_the_aio_clients_sharing_path_never_opens_its_connection(emulator: object) -> None:
    """``_create_connection`` does not await ``create_connection_async``: the senders get a
    coroutine where the connection should be, and nothing reaches the broker."""
    from azure.servicebus.aio import ServiceBusClient

    async def attempt() -> BaseException | None:
        client = ServiceBusClient.from_connection_string(
            emulator.connection_string,  # type: ignore[attr-defined]
            retry_total=0,
        )
        client._connection_sharing = True
        await client.__aenter__()
        sender = client.get_queue_sender("orders")
        try:
            await sender.send_messages(ServiceBusMessage("x", message_id="shared-1"), timeout=10)
        except ServiceBusError as exc:
            return exc
        finally:
            client._connection_sharing = False  # its close would await the coroutine's None
            if asyncio.iscoroutine(client._connection):
                client._connection.close()  # the coroutine the client never awaited
            await sender.close()
            await client.close()
        return None

    error = asyncio.run(attempt())
    assert isinstance(error, ServiceBusError)
    assert "'coroutine' object has no attribute 'create_session'" in str(error)
    assert emulator.transfers("orders") == 0  # type: ignore[attr-defined]


def test_the_sync_clients_sharing_path_fails_before_connecting(emulator: object) -> None:
    """The sync path reads ``.sasl`` from a credential object that has none."""
    from azure.servicebus import ServiceBusClient

    client = ServiceBusClient.from_connection_string(
        emulator.connection_string,  # type: ignore[attr-defined]
        retry_total=0,
    )
    client._connection_sharing = True
    with pytest.raises(AttributeError, match="sasl"):
        client.__enter__()
    client._connection_sharing = False
    client.close()
    assert emulator.connections_accepted == 0  # type: ignore[attr-defined]
