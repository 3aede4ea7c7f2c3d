"""send/schedule at the SDK seam: one transfer per call, timeouts, sender lifecycle."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus._pyamqp.error import ErrorCondition
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
)

from sendonce import EntityProfile, Message
from sendonce.backends import Ack, Backend
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.errors import (
    ConfigurationError,
    KeyRuleError,
    MessageSizeError,
    PermanentSendError,
    TransientSendError,
    ValidationError,
)

from .conftest import CONN_STR, EMULATOR_CONN_STR, FakeLink

Make = Callable[..., AzureServiceBusBackend]


def msg(i: int, **kw: Any) -> Message:
    return Message(f"body-{i}", message_id=f"order-{i}", **kw)


def test_the_client_is_built_with_its_own_retries_off(make_backend: Make) -> None:
    backend = make_backend(link_timeout=12.5)
    config = backend._client._config
    assert config.retry_total == 0
    assert config.try_timeout == 12.5  # bounds link acquisition inside create_message_batch
    assert isinstance(backend, Backend)


def test_the_real_sender_inherits_retry_total_zero(make_backend: Make) -> None:
    backend = make_backend()
    lanes, lane, _ = backend._take_lane("orders", 5.0, [])  # a real sender; no network yet
    sender = lane.sender
    lanes.give_back(lane, keep=True)
    assert sender._config.retry_total == 0
    assert sender._config.try_timeout == 60.0


@pytest.mark.parametrize("retry_total", [1, 3])
def test_client_retries_cannot_be_turned_back_on(make_backend: Make, retry_total: int) -> None:
    with pytest.raises(ConfigurationError, match="retry_total") as info:
        make_backend(retry_total=retry_total)
    assert info.value.field == "retry_total"


def test_a_ready_client_with_retries_on_is_refused() -> None:
    from azure.servicebus import ServiceBusClient

    client = ServiceBusClient.from_connection_string(CONN_STR)  # retry_total=3 by default
    with pytest.raises(ConfigurationError, match="retry_total=3"):
        AzureServiceBusBackend(client=client)
    client.close()
    ok = ServiceBusClient.from_connection_string(CONN_STR, retry_total=0)
    backend = AzureServiceBusBackend(client=ok)
    assert "contoso.servicebus.windows.net" in repr(backend)
    backend.close()


def test_send_is_one_batch_with_a_timeout(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    acks = backend.send("orders", [msg(1), msg(2), msg(3)], timeout=7.5)
    assert acks == [Ack("accepted")] * 3
    (sender,) = link.senders
    assert sender.send_messages.call_count == 1
    (payload,), kwargs = sender.send_messages.call_args
    assert set(kwargs) == {"timeout"}
    assert 0 < kwargs["timeout"] <= 7.5  # what opening the link left of the call's timeout
    assert isinstance(payload, ServiceBusMessageBatch)
    assert [m.message_id for m in payload._messages] == ["order-1", "order-2", "order-3"]


def test_the_sender_is_cached_per_entity(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    backend.send("orders", [msg(1)], timeout=5)
    backend.send("orders", [msg(2)], timeout=5)
    backend.send("payments", [msg(3)], timeout=5)
    assert len(link.senders) == 2
    assert link.senders[0].kwargs == {"queue_name": "orders"}
    assert link.senders[1].kwargs == {"queue_name": "payments"}


def test_a_transfer_that_does_not_fit_raises_message_size_error_and_sends_nothing(
    make_backend: Make, link: FakeLink
) -> None:
    link.batch_limit = 4096
    backend = make_backend()
    big = [Message("x" * 1500, message_id=f"big-{i}") for i in range(3)]
    with pytest.raises(MessageSizeError, match="'big-2' \\(index 2\\)") as info:
        backend.send("orders", big, timeout=5)
    assert info.value.field == "messages"
    assert link.senders[0].send_messages.call_count == 0


def test_one_message_over_the_batch_limit_goes_alone(make_backend: Make, link: FakeLink) -> None:
    # Premium large messages: up to 100 MB per message, but batches stay at 1 MB.
    link.batch_limit = 2048
    backend = make_backend()
    backend.send("orders", [Message("x" * 4000, message_id="large")], timeout=5)
    (payload,), _ = link.senders[0].send_messages.call_args
    assert isinstance(payload, ServiceBusMessage)
    assert payload.message_id == "large"


def test_max_batch_size_is_passed_to_create_message_batch(
    make_backend: Make, link: FakeLink
) -> None:
    backend = make_backend(max_batch_size=100_000)
    backend.send("orders", [msg(1), msg(2)], timeout=5)
    link.senders[0].create_message_batch.assert_called_with(max_size_in_bytes=100_000)


def test_a_single_message_is_sent_without_a_batch(make_backend: Make, link: FakeLink) -> None:
    """Wrapping one message in a batch would encode it twice for nothing."""
    backend = make_backend()
    backend.send("orders", [msg(1)], timeout=5)
    sender = link.senders[0]
    (payload,), kwargs = sender.send_messages.call_args
    assert isinstance(payload, ServiceBusMessage)  # not a batch
    assert payload.message_id == "order-1"
    assert kwargs["timeout"] > 0


def test_the_link_is_opened_once_per_sender(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    for i in range(3):
        backend.send("orders", [msg(i)], timeout=5)
    assert link.opened == 1


def test_a_failure_while_opening_the_link_is_mapped(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    link.open_failures = [
        ServiceBusAuthenticationError(
            message="token refused", condition=b"amqp:unauthorized-access"
        )
    ]
    with pytest.raises(PermanentSendError) as info:
        backend.send("orders", [msg(1)], timeout=5)
    assert info.value.condition == "amqp:unauthorized-access"
    assert link.senders[0].send_messages.call_count == 0
    link.senders[0].close.assert_called_once()
    backend.send("orders", [msg(1)], timeout=5)  # a fresh sender
    assert len(link.senders) == 2


@pytest.mark.parametrize("timeout", [0, -1, None, float("nan"), float("inf"), True, "5"])
def test_every_call_needs_a_finite_positive_timeout(
    make_backend: Make, link: FakeLink, timeout: Any
) -> None:
    backend = make_backend()
    with pytest.raises(ConfigurationError) as info:
        backend.send("orders", [msg(1)], timeout=timeout)
    assert info.value.field == "timeout"
    with pytest.raises(ConfigurationError):
        backend.schedule("orders", [msg(1)], datetime.now(UTC), timeout=timeout)
    assert link.senders == []


def test_atomic_sends_are_refused(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    with pytest.raises(ConfigurationError, match="no transactions") as info:
        backend.send("orders", [msg(1)], timeout=5, atomic=True)
    assert info.value.field == "atomic"
    assert link.senders == []


def test_an_empty_transfer_sends_nothing(make_backend: Make, link: FakeLink) -> None:
    assert make_backend().send("orders", [], timeout=5) == []
    assert link.senders == []


def test_a_non_message_is_refused_before_anything_is_sent(
    make_backend: Make, link: FakeLink
) -> None:
    with pytest.raises(ValidationError):
        make_backend().send("orders", [msg(1), "not a message"], timeout=5)  # type: ignore[list-item]
    assert link.sent == []


def test_a_connection_error_closes_the_sender_and_the_next_call_opens_a_new_one(
    make_backend: Make, link: FakeLink
) -> None:
    backend = make_backend()
    backend.send("orders", [msg(1)], timeout=5)
    link.failures = [
        ServiceBusConnectionError(message="reset", condition=b"amqp:connection:forced")
    ]
    with pytest.raises(TransientSendError) as info:
        backend.send("orders", [msg(2)], timeout=5)
    assert info.value.condition == "amqp:connection:forced"
    assert info.value.message_id == "order-2"
    first = link.senders[0]
    first.close.assert_called_once()
    backend.send("orders", [msg(2)], timeout=5)
    assert len(link.senders) == 2
    link.senders[1].close.assert_not_called()


def test_a_timeout_is_in_doubt_and_recreates_the_link(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    link.failures = [
        OperationTimeoutError(message="Send timed out", condition=b"amqp:client-error")
    ]
    with pytest.raises(TransientSendError):
        backend.send("orders", [msg(1)], timeout=5)
    backend.send("orders", [msg(1)], timeout=5)
    assert len(link.senders) == 2


def test_server_busy_is_transient(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    link.failures = [ServiceBusServerBusyError(condition=b"com.microsoft:server-busy")]
    with pytest.raises(TransientSendError) as info:
        backend.send("orders", [msg(1)], timeout=5)
    assert info.value.condition == "com.microsoft:server-busy"


def test_a_missing_entity_is_permanent_and_keeps_nothing_half_open(
    make_backend: Make, link: FakeLink
) -> None:
    backend = make_backend()
    link.failures = [MessagingEntityNotFoundError(condition=ErrorCondition.NotFound)]
    with pytest.raises(PermanentSendError) as info:
        backend.send("nope", [msg(1), msg(2)], timeout=5)
    assert info.value.condition == "amqp:not-found"
    assert info.value.message_id is None  # a batch: the sender accounts per message


def test_an_unexpected_exception_is_not_swallowed(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    link.failures = [RuntimeError("a bug")]
    with pytest.raises(RuntimeError, match="a bug"):
        backend.send("orders", [msg(1)], timeout=5)


def test_topics_use_the_topic_sender(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend(kinds={"events": "topic"})
    backend.send("events", [msg(1)], timeout=5)
    assert link.senders[0].kwargs == {"topic_name": "events"}


def test_a_topic_profile_selects_the_topic_sender(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend(profiles={"events": EntityProfile("events", kind="topic")})
    backend.send("events", [msg(1)], timeout=5)
    assert link.senders[0].kwargs == {"topic_name": "events"}


def test_declare_records_the_kind_and_replaces_a_queue_sender(
    make_backend: Make, link: FakeLink
) -> None:
    backend = make_backend()
    backend.send("events", [msg(1)], timeout=5)
    backend.declare(EntityProfile("events", kind="topic"))
    backend.send("events", [msg(2)], timeout=5)
    assert [s.kwargs for s in link.senders] == [{"queue_name": "events"}, {"topic_name": "events"}]
    link.senders[0].close.assert_called_once()
    assert backend.describe("events").kind == "topic"


def test_bad_kinds_are_refused(make_backend: Make) -> None:
    with pytest.raises(ConfigurationError) as info:
        make_backend(kinds={"events": "exchange"})
    assert info.value.field == "kinds"


def test_an_entity_scoped_connection_string_refuses_other_entities(
    make_backend: Make, link: FakeLink
) -> None:
    backend = make_backend(CONN_STR + ";EntityPath=orders")
    backend.send("orders", [msg(1)], timeout=5)
    with pytest.raises(ConfigurationError, match="scoped to entity 'orders'") as info:
        backend.send("payments", [msg(2)], timeout=5)
    assert info.value.field == "entity"


def test_schedule_returns_sequence_numbers_and_passes_the_timeout(
    make_backend: Make, link: FakeLink
) -> None:
    backend = make_backend()
    at = datetime(2030, 1, 1, 12, tzinfo=UTC)
    acks = backend.schedule("orders", [msg(1), msg(2)], at, timeout=3)
    assert acks == [Ack("accepted", 1000), Ack("accepted", 1001)]
    (messages, when), kwargs = link.senders[0].schedule_messages.call_args
    assert set(kwargs) == {"timeout"} and 0 < kwargs["timeout"] <= 3.0
    assert when == at
    assert [m.message_id for m in messages] == ["order-1", "order-2"]


def test_schedule_needs_an_aware_time(make_backend: Make, link: FakeLink) -> None:
    with pytest.raises(ValidationError) as info:
        make_backend().schedule("orders", [msg(1)], datetime(2030, 1, 1), timeout=3)
    assert info.value.field == "at"


def test_a_short_sequence_number_reply_is_in_doubt(
    make_backend: Make, link: FakeLink, mocker: Any
) -> None:
    backend = make_backend()
    backend.send("orders", [msg(0)], timeout=5)
    link.senders[0].schedule_messages.side_effect = lambda *a, **k: [7]
    with pytest.raises(TransientSendError, match="returned 1 sequence numbers"):
        backend.schedule("orders", [msg(1), msg(2)], datetime.now(UTC), timeout=3)


def test_a_failed_schedule_is_mapped(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    link.failures = [ServiceBusConnectionError(message="gone")]
    with pytest.raises(TransientSendError) as info:
        backend.schedule("orders", [msg(1)], datetime.now(UTC) + timedelta(hours=1), timeout=3)
    assert "schedule of message 'order-1'" in str(info.value)


def test_close_is_idempotent_and_closes_senders(make_backend: Make, link: FakeLink) -> None:
    backend = make_backend()
    backend.send("orders", [msg(1)], timeout=5)
    backend.close()
    backend.close()
    link.senders[0].close.assert_called_once()
    with pytest.raises(ConfigurationError, match="closed"):
        backend.send("orders", [msg(2)], timeout=5)


def test_context_manager_closes(link: FakeLink) -> None:
    with AzureServiceBusBackend.from_connection_string(CONN_STR) as backend:
        backend.send("orders", [msg(1)], timeout=5)
    link.senders[0].close.assert_called_once()


def test_connect_builds_the_backend_from_a_connection_string() -> None:
    from sendonce.backends import connect

    backend = connect(EMULATOR_CONN_STR, kinds={"t": "topic"})
    try:
        assert isinstance(backend, AzureServiceBusBackend)
        assert backend.namespace == "127.0.0.1:5672"
        assert backend._client._config.use_tls is False  # the emulator form keeps plain AMQP
    finally:
        backend.close()


@pytest.mark.parametrize(
    "bad",
    [
        "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k",  # no key
        "Endpoint=;SharedAccessKeyName=k;SharedAccessKey=v",
        "garbage",
    ],
)
def test_malformed_connection_strings_are_configuration_errors(bad: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        AzureServiceBusBackend.from_connection_string(bad)
    assert info.value.field == "connection_string"


def test_exactly_one_source_is_required() -> None:
    with pytest.raises(ConfigurationError):
        AzureServiceBusBackend()
    with pytest.raises(ConfigurationError):
        AzureServiceBusBackend(
            connection_string=CONN_STR, fully_qualified_namespace="x.servicebus.windows.net"
        )


def test_a_namespace_and_credential_build_the_client() -> None:
    from azure.core.credentials import AzureNamedKeyCredential

    credential = AzureNamedKeyCredential("send", "k3y")
    backend = AzureServiceBusBackend(
        fully_qualified_namespace="contoso.servicebus.windows.net", credential=credential
    )
    try:
        assert backend._client._config.retry_total == 0
        assert backend._client._credential is credential
        assert repr(backend) == "AzureServiceBusBackend(namespace='contoso.servicebus.windows.net')"
    finally:
        backend.close()


def test_the_backend_refuses_to_be_pickled(make_backend: Make) -> None:
    import pickle

    with pytest.raises(TypeError, match="connect\\(url\\)"):
        pickle.dumps(make_backend())


def test_a_batch_to_a_partitioned_dedup_entity_is_refused(
    make_backend: Make, link: FakeLink
) -> None:
    profile = EntityProfile("orders", partitioned=True)
    backend = make_backend(profiles={"orders": profile})
    with pytest.raises(KeyRuleError, match="one message per transfer") as info:
        backend.send("orders", [msg(1, partition_key="a"), msg(2, partition_key="a")], timeout=5)
    assert info.value.field == "messages"
    backend.send("orders", [msg(1, partition_key="a")], timeout=5)
    assert len(link.sent) == 1


def test_a_batch_mixing_session_ids_is_refused(make_backend: Make, link: FakeLink) -> None:
    profile = EntityProfile("carts", sessions=True)
    backend = make_backend(profiles={"carts": profile})
    with pytest.raises(KeyRuleError, match="mixes partition keys or session ids"):
        backend.send("carts", [msg(1, session_id="s1"), msg(2, session_id="s2")], timeout=5)
    assert link.sent == []
    backend.send("carts", [msg(1, session_id="s1"), msg(2, session_id="s1")], timeout=5)
    assert len(link.sent) == 1


def test_the_sender_over_a_partitioned_entity_sends_one_message_per_transfer(
    make_backend: Make, link: FakeLink
) -> None:
    from sendonce import IdempotentSender

    profile = EntityProfile("orders", partitioned=True)
    backend = make_backend(profiles={"orders": profile})
    with IdempotentSender(backend, "orders") as sender:
        report = sender.send_many([msg(i, partition_key=f"k{i % 2}") for i in range(4)])
    assert report.sent == 4 and report.failed == 0
    assert len(link.sent) == 4  # four transfers of one message each, none batched
    assert all(isinstance(payload, ServiceBusMessage) for payload in link.sent)
