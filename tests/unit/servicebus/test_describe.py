"""describe(): explicit profiles, else the administration API (real SDK, fake HTTP)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.errors import ConfigurationError, TransientSendError

from .conftest import EMULATOR_CONN_STR, FakeLink, admin_for, queue_xml, topic_xml

Make = Callable[..., AzureServiceBusBackend]


def backend_with(make_backend: Make, entities: dict[str, tuple[int, str]], **kw: Any) -> Any:
    admin, transport = admin_for(entities)
    return make_backend(admin_client=admin, **kw), transport


def test_a_queue_with_duplicate_detection(make_backend: Make) -> None:
    backend, transport = backend_with(
        make_backend, {"orders": (200, queue_xml("orders", window="PT2M", max_kb=1024))}
    )
    profile = backend.describe("orders")
    assert profile == EntityProfile(
        "orders",
        kind="queue",
        duplicate_detection=True,
        duplicate_detection_window=timedelta(minutes=2),
        partitioned=False,
        sessions=False,
        max_message_size=1024 * 1024,
    )
    assert len(transport.requests) == 1
    backend.describe("orders")  # cached
    assert len(transport.requests) == 1


def test_a_partitioned_session_queue(make_backend: Make) -> None:
    backend, _ = backend_with(
        make_backend, {"carts": (200, queue_xml("carts", partitioned=True, session=True))}
    )
    profile = backend.describe("carts")
    assert profile.partitioned and profile.sessions and profile.duplicate_detection


def test_a_topic_is_found_after_the_queue_lookup(make_backend: Make, link: FakeLink) -> None:
    backend, transport = backend_with(
        make_backend, {"events": (200, topic_xml("events", window="PT30S", partitioned=True))}
    )
    profile = backend.describe("events")
    assert profile.kind == "topic"
    assert profile.partitioned
    assert profile.duplicate_detection_window == timedelta(seconds=30)
    assert len(transport.requests) == 2  # get_queue, then get_topic
    backend.send("events", [Message("x", message_id="e-1")], timeout=5)
    assert link.senders[0].kwargs == {"topic_name": "events"}


def test_a_known_topic_is_looked_up_as_a_topic_first(make_backend: Make) -> None:
    backend, transport = backend_with(
        make_backend, {"events": (200, topic_xml("events"))}, kinds={"events": "topic"}
    )
    assert backend.describe("events").kind == "topic"
    assert len(transport.requests) == 1


def test_a_standard_queue_without_a_size_element_gets_256_kb(make_backend: Make) -> None:
    backend, _ = backend_with(make_backend, {"q": (200, queue_xml("q", max_kb=None))})
    assert backend.describe("q").max_message_size == 256 * 1024


def test_basic_tier_or_dedup_off_is_described_as_such(make_backend: Make) -> None:
    backend, _ = backend_with(make_backend, {"basic": (200, queue_xml("basic", dedup=False))})
    assert backend.describe("basic").duplicate_detection is False


def test_the_sender_refuses_an_entity_without_duplicate_detection(
    make_backend: Make, link: FakeLink
) -> None:
    backend, _ = backend_with(make_backend, {"basic": (200, queue_xml("basic", dedup=False))})
    with pytest.raises(ConfigurationError, match="duplicate detection off") as info:
        IdempotentSender(backend, "basic")
    assert info.value.field == "duplicate_detection"
    # At-least-once on purpose: accepted, and it sends.
    with IdempotentSender(backend, "basic", require_duplicate_detection=False) as sender:
        result = sender.send(Message("x", message_id="b-1"))
    assert result.outcome == "sent"
    assert link.senders[0].send_messages.call_count == 1


@pytest.mark.parametrize("status", [401, 403])
def test_a_credential_that_cannot_read_properties_asks_for_a_profile(
    make_backend: Make, status: int
) -> None:
    body = "<Error><Code>401</Code><Detail>Manage claim required</Detail></Error>"
    backend, _ = backend_with(make_backend, {"orders": (status, body)})
    with pytest.raises(ConfigurationError, match="pass an explicit profile") as info:
        backend.describe("orders")
    assert info.value.field == "entity"
    assert f"HTTP {status}" in str(info.value)
    assert "profiles={'orders': EntityProfile(" in str(info.value)


def test_a_missing_entity_is_a_configuration_error(make_backend: Make) -> None:
    backend, transport = backend_with(make_backend, {})
    with pytest.raises(ConfigurationError, match="does not exist") as info:
        backend.describe("ghost")
    assert info.value.field == "entity"
    assert len(transport.requests) == 2


def test_a_server_error_is_transient(make_backend: Make) -> None:
    backend, _ = backend_with(make_backend, {"orders": (500, "<Error/>")})
    with pytest.raises(TransientSendError, match="HTTP 500"):
        backend.describe("orders")


def test_the_admin_call_is_bounded(make_backend: Make, mocker: Any) -> None:
    admin = mocker.Mock()
    admin.get_queue.side_effect = lambda name, **kw: _props(requires_duplicate_detection=True)
    backend = make_backend(admin_client=admin, admin_timeout=4)
    backend.describe("orders")
    _, kwargs = admin.get_queue.call_args
    assert kwargs == {"timeout": 4.0, "connection_timeout": 4.0, "read_timeout": 4.0}


def _props(**kw: Any) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(**kw)


def test_the_emulator_has_no_admin_api(make_backend: Make) -> None:
    backend = make_backend(EMULATOR_CONN_STR)
    with pytest.raises(ConfigurationError, match="emulator has no administration API"):
        backend.describe("orders")


def test_explicit_profiles_win(make_backend: Make) -> None:
    explicit = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=1))
    backend, transport = backend_with(
        make_backend, {"orders": (200, queue_xml("orders"))}, profiles={"orders": explicit}
    )
    assert backend.describe("orders") is explicit
    assert transport.requests == []
    emulator = make_backend(EMULATOR_CONN_STR, profiles={"orders": explicit})
    assert emulator.describe("orders") is explicit


def test_profiles_must_be_entity_profiles(make_backend: Make) -> None:
    with pytest.raises(ConfigurationError) as info:
        make_backend(profiles={"orders": {"duplicate_detection": True}})
    assert info.value.field == "profiles"


def test_a_profile_must_be_filed_under_its_own_name(make_backend: Make) -> None:
    with pytest.raises(ConfigurationError, match="describes entity 'payments'"):
        make_backend(profiles={"orders": EntityProfile("payments")})


def test_an_empty_entity_name_is_refused(make_backend: Make) -> None:
    with pytest.raises(ConfigurationError) as info:
        make_backend().describe("")
    assert info.value.field == "entity"


def test_the_admin_client_is_built_from_the_connection_string(
    make_backend: Make, mocker: Any
) -> None:
    from azure.servicebus.management import ServiceBusAdministrationClient

    built = mocker.patch.object(ServiceBusAdministrationClient, "from_connection_string")
    built.return_value.get_queue.return_value = _props(requires_duplicate_detection=True)
    backend = make_backend()
    assert backend.describe("orders").duplicate_detection
    (conn_str,), _ = built.call_args
    assert conn_str == backend._connection_string


def test_a_named_key_credential_cannot_read_the_admin_api() -> None:
    from azure.core.credentials import AzureNamedKeyCredential

    backend = AzureServiceBusBackend(
        fully_qualified_namespace="contoso.servicebus.windows.net",
        credential=AzureNamedKeyCredential("send", "k3y"),
    )
    with backend, pytest.raises(ConfigurationError, match="needs a token credential"):
        backend.describe("orders")


def test_a_token_credential_builds_the_admin_client(mocker: Any) -> None:
    from azure.servicebus.management import ServiceBusAdministrationClient

    credential = mocker.Mock(spec=["get_token"])
    built = mocker.patch(
        "azure.servicebus.management.ServiceBusAdministrationClient", autospec=True
    )
    built.return_value.get_queue.return_value = _props(requires_duplicate_detection=True)
    backend = AzureServiceBusBackend(
        fully_qualified_namespace="contoso.servicebus.windows.net", credential=credential
    )
    with backend:
        assert backend.describe("orders").duplicate_detection
    built.assert_called_once_with("contoso.servicebus.windows.net", credential)
    assert ServiceBusAdministrationClient is not built


def test_two_spellings_of_one_entity_in_profiles_are_refused_naming_both(
    make_backend: Make,
) -> None:
    """Both keys are one entity on Service Bus: which profile wins is not left to dict order."""
    with pytest.raises(ConfigurationError) as info:
        make_backend(
            profiles={"Orders": EntityProfile("Orders"), "orders": EntityProfile("orders")}
        )
    assert info.value.field == "profiles"
    assert "'Orders'" in str(info.value) and "'orders'" in str(info.value)
