"""Seams for the Service Bus backend tests.

What no local peer can give is faked here, and only that: the administration
REST API (a fake azure-core HTTP transport serving the ATOM documents the
service returns, parsed by the real SDK) and a sender link whose failures we
script (a spec'd ``ServiceBusSender`` that builds real ``ServiceBusMessageBatch``
objects). Clients, credentials, messages and batches are the real SDK classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from unittest.mock import MagicMock

import pytest
from azure.core.pipeline.transport import HttpResponse, HttpTransport
from azure.servicebus import ServiceBusClient, ServiceBusMessageBatch, ServiceBusSender
from azure.servicebus.management import ServiceBusAdministrationClient

from sendonce.backends.servicebus import AzureServiceBusBackend

SECRET = "Zk9vQmFyU2VjcmV0S2V5Rm9yVGVzdHM0MjQyNDI0Mg="
SAS_SIG = "c2lnbmF0dXJlU2VjcmV0MTIzNDU2Nzg5MA%3D"
CONN_STR = (
    "Endpoint=sb://contoso.servicebus.windows.net/;"
    f"SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={SECRET}"
)
EMULATOR_CONN_STR = (
    "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=RootManageSharedAccessKey;"
    f"SharedAccessKey={SECRET};UseDevelopmentEmulator=true;"
)
SAS_CONN_STR = (
    "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature "
    f"sr=contoso.servicebus.windows.net&sig={SAS_SIG}&se=4102444800&skn=send"
)

_NS = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"


def queue_xml(
    name: str,
    *,
    dedup: bool = True,
    window: str = "PT10M",
    partitioned: bool = False,
    session: bool = False,
    max_kb: int | None = 256,
) -> str:
    size = (
        "" if max_kb is None else f"<MaxMessageSizeInKilobytes>{max_kb}</MaxMessageSizeInKilobytes>"
    )
    return (
        f'<entry xmlns="http://www.w3.org/2005/Atom"><title type="text">{name}</title>'
        f'<content type="application/xml"><QueueDescription xmlns="{_NS}" '
        'xmlns:i="http://www.w3.org/2001/XMLSchema-instance"><LockDuration>PT1M</LockDuration>'
        "<MaxSizeInMegabytes>1024</MaxSizeInMegabytes>"
        f"<RequiresDuplicateDetection>{str(dedup).lower()}</RequiresDuplicateDetection>"
        f"<RequiresSession>{str(session).lower()}</RequiresSession>"
        f"<DuplicateDetectionHistoryTimeWindow>{window}</DuplicateDetectionHistoryTimeWindow>"
        "<MaxDeliveryCount>10</MaxDeliveryCount><Status>Active</Status>"
        f"<EnablePartitioning>{str(partitioned).lower()}</EnablePartitioning>"
        f"{size}</QueueDescription></content></entry>"
    )


def topic_xml(
    name: str, *, dedup: bool = True, window: str = "PT10M", partitioned: bool = False
) -> str:
    return (
        f'<entry xmlns="http://www.w3.org/2005/Atom"><title type="text">{name}</title>'
        f'<content type="application/xml"><TopicDescription xmlns="{_NS}" '
        'xmlns:i="http://www.w3.org/2001/XMLSchema-instance">'
        "<MaxSizeInMegabytes>1024</MaxSizeInMegabytes>"
        f"<RequiresDuplicateDetection>{str(dedup).lower()}</RequiresDuplicateDetection>"
        f"<DuplicateDetectionHistoryTimeWindow>{window}</DuplicateDetectionHistoryTimeWindow>"
        "<Status>Active</Status>"
        f"<EnablePartitioning>{str(partitioned).lower()}</EnablePartitioning>"
        "<MaxMessageSizeInKilobytes>256</MaxMessageSizeInKilobytes>"
        "</TopicDescription></content></entry>"
    )


EMPTY_FEED = (
    '<feed xmlns="http://www.w3.org/2005/Atom"><title type="text">Publicly Listed Services'
    "</title><id>uuid:0</id><updated>2026-01-01T00:00:00Z</updated></feed>"
)


class _Response(HttpResponse):  # type: ignore[misc]
    def __init__(self, request: Any, status: int, body: str) -> None:
        super().__init__(request, None)
        self.status_code = status
        self.reason = "OK" if status < 400 else "Error"
        self.headers = {"Content-Type": "application/atom+xml"}
        self.content_type = "application/atom+xml"
        self._body = body.encode("utf-8")

    def body(self) -> bytes:
        return self._body


class FakeAdminTransport(HttpTransport):  # type: ignore[misc]
    """Answers the administration API's entity GETs from a table: path -> (status, xml)."""

    def __init__(self, entities: dict[str, tuple[int, str]] | None = None) -> None:
        self.entities = dict(entities or {})
        self.requests: list[tuple[Any, dict[str, Any]]] = []

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.requests.append((request, kwargs))
        path = request.url.split("?", 1)[0].rsplit("/", 1)[-1]
        status, body = self.entities.get(path, (200, EMPTY_FEED))
        return _Response(request, status, body)

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __exit__(self, *args: Any) -> None:
        pass


def admin_for(entities: dict[str, tuple[int, str]]) -> tuple[Any, FakeAdminTransport]:
    transport = FakeAdminTransport(entities)
    admin = ServiceBusAdministrationClient.from_connection_string(
        CONN_STR, transport=transport, retry_total=0
    )
    return admin, transport


class FakeLink:
    """Stands in for the sender link: real batches, scripted failures, recorded calls."""

    def __init__(self) -> None:
        self.senders: list[MagicMock] = []
        self.failures: list[BaseException | None] = []
        self.open_failures: list[BaseException] = []
        self.opened = 0
        self.batch_limit = 256 * 1024
        self.sequence = 1000
        self.sent: list[Any] = []

    def new_sender(self, *args: Any, **kwargs: Any) -> MagicMock:
        sender = MagicMock(spec=ServiceBusSender)
        sender.kwargs = kwargs

        def create_message_batch(max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
            if not sender.create_message_batch.call_count - 1:  # the first call opens the link
                if self.open_failures:
                    raise self.open_failures.pop(0)
                self.opened += 1
            return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or self.batch_limit)

        def fail_or(value: Any) -> Any:
            failure = self.failures.pop(0) if self.failures else None
            if failure is not None:
                raise failure
            return value

        def send_messages(payload: Any, *, timeout: float | None = None) -> None:
            fail_or(None)
            self.sent.append(payload)

        def schedule_messages(messages: Any, at: Any, *, timeout: float | None = None) -> list[int]:
            fail_or(None)
            batch = messages if isinstance(messages, list) else [messages]
            numbers = list(range(self.sequence, self.sequence + len(batch)))
            self.sequence += len(batch)
            self.sent.append(batch)
            return numbers

        sender.create_message_batch.side_effect = create_message_batch
        sender.send_messages.side_effect = send_messages
        sender.schedule_messages.side_effect = schedule_messages
        self.senders.append(sender)
        return sender


@pytest.fixture(autouse=True)
def _lanes_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests script the client's sender (a fake link): one connection per lane. The
    shared connection's links are proven against the emulator
    (tests/integration/emulator/test_servicebus_connection_sharing.py)."""
    monkeypatch.setenv("SENDONCE_SERVICEBUS_CONNECTION_SHARING", "0")


@pytest.fixture
def link(mocker: Any) -> Iterator[FakeLink]:
    fake = FakeLink()
    mocker.patch.object(ServiceBusClient, "get_queue_sender", side_effect=fake.new_sender)
    mocker.patch.object(ServiceBusClient, "get_topic_sender", side_effect=fake.new_sender)
    yield fake


@pytest.fixture
def make_backend() -> Iterator[Callable[..., AzureServiceBusBackend]]:
    made: list[AzureServiceBusBackend] = []

    def make(conn_str: str = CONN_STR, **options: Any) -> AzureServiceBusBackend:
        backend = AzureServiceBusBackend.from_connection_string(conn_str, **options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()
