"""The sync sender's traces and metrics over the real local broker, every outcome.

Spans and metric points are read back through the OpenTelemetry SDK's in-memory exporter
and reader (the ``otel`` fixture); the messages are read back from the broker file.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from sendonce import (
    EntityProfile,
    IdempotentSender,
    InDoubtError,
    Ledger,
    Message,
    PayloadConflictError,
    PermanentSendError,
    RetryPolicy,
)
from sendonce.backends import LocalBackend
from sendonce.backends._base import Ack
from sendonce.testing import Fault, FaultyBackend

ORDERS = EntityProfile("orders")


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    backend = LocalBackend(tmp_path / "broker.db")
    backend.create_entity(ORDERS)
    yield backend
    backend.close()


def no_wait() -> RetryPolicy:
    return RetryPolicy(sleep=lambda seconds: None, jitter=False, max_attempts=3)


def msg(i: int | str, body: str = "body", **kw: Any) -> Message:
    return Message(body, message_id=f"order-{i}", **kw)


def stored(broker: LocalBackend) -> dict[str, dict[str, Any]]:
    """Every message of the queue, by id, with its application properties."""
    got = broker.receive("orders", max_messages=100)
    return {m.message_id: dict(m.application_properties or {}) for m in got}


def traceparent_of(span: Any) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


class Recording:
    """Passes every call to the broker and keeps the properties each attempt carried."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.sent: list[list[dict[str, Any]]] = []

    messaging_system = "sendonce_local"

    def describe(self, entity: str) -> EntityProfile:
        return self.inner.describe(entity)

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        self.sent.append([dict(m.application_properties or {}) for m in messages])
        return self.inner.send(entity, messages, timeout=timeout, atomic=atomic)

    def schedule(self, *args: Any, **kwargs: Any) -> list[Ack]:
        return self.inner.schedule(*args, **kwargs)

    def close(self) -> None:
        pass


def test_a_sent_message_is_one_producer_span_whose_context_it_carries(
    otel: Any, broker: LocalBackend
) -> None:
    with IdempotentSender(broker, "orders") as sender:
        result = sender.send(msg(1))
    assert result.outcome == "sent"
    # One span: the call is its transfer (issue 35: no second span named the same).
    [span] = otel.spans
    assert span.name == "send orders" and span.kind is SpanKind.PRODUCER
    assert span.parent is None
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "sendonce_local"
    assert attributes["messaging.destination.name"] == "orders"
    assert attributes["messaging.operation.type"] == "send"
    assert attributes["messaging.operation.name"] == "send"
    assert attributes["messaging.message.id"] == "order-1"
    assert "messaging.batch.message_count" not in attributes
    assert "server.address" not in attributes  # the local broker is a file, no server
    assert attributes["sendonce.outcome"] == "sent"
    assert attributes["sendonce.attempts"] == 1
    assert span.status.status_code is StatusCode.UNSET
    # The consumer finds the span's context in the message, under both names.
    properties = stored(broker)["order-1"]
    assert properties["traceparent"] == traceparent_of(span)
    assert properties["Diagnostic-Id"] == properties["traceparent"]
    assert otel.outcomes(destination="orders") == {"sent": 1}
    (attributes, point), *_ = otel.points("messaging.client.operation.duration")
    assert point.count == 1 and attributes["messaging.system"] == "sendonce_local"


def test_a_duplicate_is_counted_and_marked_on_its_span(otel: Any, broker: LocalBackend) -> None:
    with IdempotentSender(broker, "orders") as first:
        first.send(msg(1))
    with IdempotentSender(broker, "orders") as second:  # a new sender: no memory of it
        assert second.send(msg(1)).outcome == "duplicate"
    assert [s.name for s in otel.spans] == ["send orders", "send orders"]
    span = otel.spans[-1]
    assert span.attributes["sendonce.outcome"] == "duplicate"
    assert span.attributes["sendonce.duplicates"] == 1
    assert otel.outcomes() == {"sent": 1, "duplicate": 1}
    assert list(stored(broker)) == ["order-1"]


def test_a_retry_is_an_event_with_attempt_condition_and_backoff_and_the_resend_carries_the_same_context(  # noqa: E501
    otel: Any, broker: LocalBackend
) -> None:
    recording = Recording(broker)
    faulty = FaultyBackend(recording, [Fault.AFTER_COMMIT])
    policy = RetryPolicy(sleep=lambda s: None, jitter=False, initial_backoff=0.25)
    with IdempotentSender(faulty, "orders", retry=policy) as sender:
        result = sender.send(msg(1))
    assert result.outcome == "sent" and result.attempts == 2
    [transfer] = otel.spans
    [(span, event)] = otel.events("sendonce.retry")
    assert span is transfer
    assert event == {
        "sendonce.attempt": 1,
        "error.type": "amqp:connection:forced",
        "sendonce.backoff": 0.25,
    }
    assert transfer.attributes["sendonce.attempts"] == 2
    assert transfer.attributes["sendonce.in_doubt_before"] is True
    assert "sendonce.duplicates" not in transfer.attributes  # our own earlier copy: sent
    # Both attempts carried one context, the one the stored copy has.
    first, second = recording.sent
    assert first == second
    assert first[0]["traceparent"] == traceparent_of(transfer)
    assert stored(broker)["order-1"]["traceparent"] == traceparent_of(transfer)
    [(attributes, point)] = otel.points("sendonce.retries")
    assert point.value == 1 and attributes["error.type"] == "amqp:connection:forced"
    assert otel.outcomes() == {"sent": 1}


def test_in_doubt_is_an_error_with_the_broker_condition_and_an_in_doubt_event(
    otel: Any, broker: LocalBackend
) -> None:
    faulty = FaultyBackend(broker, [Fault.AFTER_COMMIT] * 3)
    with IdempotentSender(faulty, "orders", retry=no_wait()) as sender:
        with pytest.raises(InDoubtError):
            sender.send(msg(1))
    [transfer] = otel.spans
    assert transfer.kind is SpanKind.PRODUCER
    assert transfer.status.status_code is StatusCode.ERROR
    assert transfer.attributes["error.type"] == "amqp:connection:forced"
    assert transfer.attributes["sendonce.outcome"] == "in_doubt"
    assert transfer.attributes["sendonce.attempts"] == 3
    assert [e["sendonce.attempt"] for _, e in otel.events("sendonce.retry")] == [1, 2]
    [(span, event)] = otel.events("sendonce.in_doubt")
    assert span is transfer
    assert event["messaging.message.id"] == "order-1"
    assert event["sendonce.attempts"] == 3 and event["sendonce.reason"] == "retries"
    assert event["error.type"] == "amqp:connection:forced"
    assert otel.outcomes() == {"in_doubt": 1}
    [(attributes, point)] = otel.points("messaging.client.operation.duration")
    assert attributes["error.type"] == "amqp:connection:forced" and point.count == 1
    assert list(stored(broker)) == ["order-1"]  # every attempt landed once


def test_a_refusal_and_a_payload_conflict_are_outcomes_of_their_own(
    otel: Any, broker: LocalBackend
) -> None:
    faulty = FaultyBackend(broker, [Fault.PERMANENT])
    with IdempotentSender(faulty, "orders", retry=no_wait()) as sender:
        with pytest.raises(PermanentSendError):
            sender.send(msg(1))
        sender.send(msg(2, "first body"))
        with pytest.raises(PayloadConflictError):
            sender.send(msg(2, "another body"))
    refused, sent, conflict = otel.named("send orders")
    assert len(otel.spans) == 3  # one per call, each its transfer (if it had one)
    assert conflict.attributes["sendonce.outcome"] == "payload_conflict"
    assert conflict.attributes["error.type"] == "sendonce.errors.PayloadConflictError"
    assert "sendonce.attempts" not in conflict.attributes  # refused before any transfer
    assert sent.attributes["sendonce.attempts"] == 1
    assert refused.attributes["sendonce.outcome"] == "refused"
    assert refused.attributes["error.type"] == "amqp:unauthorized-access"
    assert otel.outcomes() == {"refused": 1, "sent": 1, "payload_conflict": 1}
    assert list(stored(broker)) == ["order-2"]


def test_send_many_counts_each_outcome_of_its_report_and_spans_each_transfer(
    otel: Any, broker: LocalBackend
) -> None:
    # Distinct partition keys: one transfer each; order-0 is a duplicate (sent before),
    # order-1 is refused, order-2 in doubt.
    keyed = EntityProfile("keyed")
    broker.create_entity(keyed)
    faults = [Fault.NONE, Fault.NONE, Fault.PERMANENT] + [Fault.AFTER_COMMIT] * 3
    faulty = FaultyBackend(broker, faults)
    batch = [msg(i, partition_key=f"pk-{i}") for i in range(3)]
    with IdempotentSender(faulty, keyed, retry=no_wait()) as sender:
        sender.send(batch[0])
        report = sender.send_many([*batch, batch[0]])  # the repeat: an in-call duplicate
    assert (report.sent, report.duplicates, report.failed) == (0, 2, 2)
    call = otel.one("send_many keyed")
    assert call.kind is SpanKind.CLIENT
    assert call.attributes["messaging.batch.message_count"] == 4
    assert (call.attributes["sendonce.sent"], call.attributes["sendonce.failed"]) == (0, 2)
    assert call.status.status_code is StatusCode.ERROR
    transfers = otel.children(call)
    assert len(transfers) == 3
    assert {s.attributes["messaging.message.id"] for s in transfers} == {
        "order-0",
        "order-1",
        "order-2",
    }
    assert otel.outcomes(operation="send_many") == {
        "duplicate": 2,
        "refused": 1,
        "in_doubt": 1,
    }


def test_a_batch_transfer_names_its_count_not_an_id(otel: Any, broker: LocalBackend) -> None:
    with IdempotentSender(broker, "orders") as sender:
        report = sender.send_many([msg(i) for i in range(100)])
    assert report.sent == 100
    [transfer] = otel.children(otel.one("send_many orders"))
    assert transfer.attributes["messaging.batch.message_count"] == 100
    assert "messaging.message.id" not in transfer.attributes
    contexts = {props["traceparent"] for props in stored(broker).values()}
    assert contexts == {traceparent_of(transfer)}


def test_each_message_of_a_traced_batch_arrives_whole_with_its_transfers_context(
    otel: Any, broker: LocalBackend
) -> None:
    # The common case (no properties of their own) takes the copy that shares one mapping;
    # a message with properties of its own has them merged; one with its own context keeps
    # it. Each must arrive with every field it was sent with.
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    plain = [
        msg(
            i,
            body=f"body {i} ü",
            subject="order",
            content_type="application/json",
            correlation_id=f"corr-{i}",
            time_to_live=timedelta(hours=1),
        )
        for i in range(3)
    ]
    own = msg("own", application_properties={"k": "v"})
    upstream_one = msg("upstream", application_properties={"traceparent": upstream})
    with IdempotentSender(broker, "orders") as sender:
        assert sender.send_many(plain).sent == 3  # none has properties: the shared copy
        assert sender.send_many([own, upstream_one]).sent == 2  # message by message
    first, second = (otel.children(call)[0] for call in otel.named("send_many orders"))
    context, mixed = traceparent_of(first), traceparent_of(second)
    got = {m.message_id: m for m in broker.receive("orders", max_messages=10)}
    for i, sent in enumerate(plain):
        back = got[f"order-{i}"]
        assert back.body == f"body {i} ü".encode()
        assert (back.subject, back.content_type, back.correlation_id) == (
            "order",
            "application/json",
            f"corr-{i}",
        )
        assert back.time_to_live == timedelta(hours=1)
        assert dict(back.application_properties or {}) == {
            "traceparent": context,
            "Diagnostic-Id": context,
        }
        assert sent.application_properties is None  # the caller's message is untouched
    assert dict(got["order-own"].application_properties or {}) == {
        "k": "v",
        "traceparent": mixed,
        "Diagnostic-Id": mixed,
    }
    assert dict(got["order-upstream"].application_properties or {}) == {"traceparent": upstream}


def test_a_message_with_its_own_trace_context_keeps_it(otel: Any, broker: LocalBackend) -> None:
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with IdempotentSender(broker, "orders") as sender:
        sender.send(msg(1, application_properties={"traceparent": upstream, "k": "v"}))
    assert stored(broker)["order-1"] == {"traceparent": upstream, "k": "v"}


def test_a_send_links_to_the_creation_context_a_message_brings(
    otel: Any, broker: LocalBackend
) -> None:
    # The conventions: a publish span links to each custom creation context its messages
    # carry (the message keeps it); messages without one add no link.
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    other = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with IdempotentSender(broker, "orders") as sender:
        sender.send(msg(1, application_properties={"traceparent": upstream}))
        sender.send_many(
            [
                msg(2, application_properties={"Diagnostic-Id": other}),
                msg(3, application_properties={"traceparent": upstream}),
                msg(4, application_properties={"traceparent": upstream}),
                msg(5),
            ]
        )
        sender.send(msg(6))
    linked = {
        span.attributes.get("messaging.message.id")
        or span.attributes.get("messaging.batch.message_count"): {
            (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in span.links
        }
        for span in otel.named("send orders")
    }
    assert linked == {
        "order-1": {("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")},
        4: {
            ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"),
            ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
        },
        "order-6": set(),
    }
    assert stored(broker)["order-3"] == {"traceparent": upstream}  # kept, not replaced


def test_messages_counted_from_many_threads_and_senders_are_one_point_per_outcome(
    otel: Any, broker: LocalBackend
) -> None:
    # sendonce.messages is counted in the sender and read at collection: two senders of
    # one entity, sending from four threads at once, still make one exact point per outcome.
    from concurrent.futures import ThreadPoolExecutor

    with (
        IdempotentSender(broker, "orders") as first,
        IdempotentSender(broker, "orders") as second,
    ):

        def work(worker: int) -> None:
            sender = first if worker % 2 else second
            for i in range(25):
                sender.send(msg(f"{worker}-{i}"))
            sender.send(msg(f"{worker}-0"))  # a duplicate each

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(work, range(4)))
    points = [a for a, _ in otel.points("sendonce.messages")]
    assert sorted(a["sendonce.outcome"] for a in points) == ["duplicate", "sent"]
    assert otel.outcomes(destination="orders") == {"sent": 100, "duplicate": 4}
    again = otel.outcomes(destination="orders")  # a second collection
    assert again == {"sent": 100, "duplicate": 4}  # cumulative: reading resets nothing


def test_without_telemetry_messages_leave_unchanged(broker: LocalBackend) -> None:
    with IdempotentSender(broker, "orders") as sender:
        sender.send(msg(1, application_properties={"k": "v"}))
        sender.send_many([msg(2), msg(3)])
    assert stored(broker) == {"order-1": {"k": "v"}, "order-2": {}, "order-3": {}}


def test_schedule_and_a_transaction_are_operations_of_their_own(
    otel: Any, broker: LocalBackend
) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    with IdempotentSender(broker, "orders") as sender:
        assert sender.schedule(msg(1), at).outcome == "scheduled"
        with sender.transaction() as tx:
            tx.send(msg(2))
            tx.send(msg(3))
    schedule = otel.one("schedule orders")  # one span: the call is its transfer
    assert schedule.kind is SpanKind.PRODUCER
    assert schedule.attributes["sendonce.outcome"] == "scheduled"
    assert schedule.attributes["messaging.operation.name"] == "schedule"
    assert schedule.attributes["sendonce.attempts"] == 1
    commit = otel.one("transaction orders")
    assert commit.kind is SpanKind.CLIENT
    assert commit.attributes["sendonce.sent"] == 2
    [transfer] = otel.children(commit)
    assert transfer.kind is SpanKind.PRODUCER
    assert transfer.attributes["messaging.batch.message_count"] == 2
    assert otel.outcomes() == {"scheduled": 1, "sent": 2}


def test_ledger_writes_are_spans_of_the_call_and_its_in_doubt_decision_an_event(
    otel: Any, broker: LocalBackend, tmp_path: Path
) -> None:
    # No duplicate detection: an unconfirmed intent is in doubt at once (docs/ledger.md).
    plain = EntityProfile("plain", duplicate_detection=False)
    broker.create_entity(plain)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    faulty = FaultyBackend(broker, [Fault.AFTER_COMMIT])
    with Ledger(url) as ledger, IdempotentSender(faulty, plain, ledger=ledger) as sender:
        with pytest.raises(InDoubtError):
            sender.send(msg(1))
        report = sender.send_many([msg(1), msg(2)])
    assert report.in_doubt == ["order-1"] and report.sent == 1
    # The single send: one span, its ledger writes under it.
    single = next(s for s in otel.named("send plain") if s.parent is None)
    assert single.kind is SpanKind.PRODUCER
    assert single.attributes["sendonce.outcome"] == "in_doubt"
    assert {s.name for s in otel.children(single)} >= {"ledger intent plain"}
    assert not [s for s in otel.children(single) if s.name == "send plain"]
    call = otel.one("send_many plain")
    children = otel.children(call)
    assert {s.name for s in children} == {
        "ledger intent plain",
        "ledger confirm plain",
        "send plain",
    }
    [transfer] = [s for s in children if s.kind is SpanKind.PRODUCER]
    assert transfer.attributes["messaging.message.id"] == "order-2"  # order-1 was not resent
    intent = next(s for s in otel.named("ledger intent plain") if s.parent == call.context)
    assert intent.attributes["sendonce.keys"] == 2
    assert intent.attributes["sendonce.ledger.store"] == "sqlite"
    ledger_events = [e for s, e in otel.events("sendonce.in_doubt") if s is call]
    assert [e["sendonce.reason"] for e in ledger_events] == ["ledger"]
    assert ledger_events[0]["messaging.message.id"] == "order-1"
    durations = {
        a["sendonce.ledger.operation"] for a, _ in otel.points("sendonce.ledger.operation.duration")
    }
    assert durations >= {"intent", "confirm"}
    assert otel.outcomes(operation="send_many") == {"in_doubt": 1, "sent": 1}


def test_transfers_in_flight_from_threads_are_children_of_their_call(
    otel: Any, broker: LocalBackend
) -> None:
    keyed = EntityProfile("keyed")
    broker.create_entity(keyed)
    batch = [msg(i, partition_key=f"pk-{i % 4}") for i in range(8)]
    with IdempotentSender(broker, keyed, max_in_flight=4) as sender:
        assert sender.send_many(batch).sent == 8
    call = otel.one("send_many keyed")
    assert len(otel.children(call)) == 4
    [(_, point)] = otel.points("sendonce.transfers.in_flight")
    assert point.value == 0  # every transfer started has ended


def test_traced_transfers_are_planned_with_room_for_the_trace_context(
    otel: Any, broker: LocalBackend
) -> None:
    small = EntityProfile("small", max_message_size=4096)
    broker.create_entity(small)
    recording = Recording(broker)
    seen: list[list[Message]] = []
    send = recording.send

    def keep(entity: str, messages: Sequence[Message], **kw: Any) -> list[Ack]:
        seen.append(list(messages))
        return send(entity, messages, **kw)

    recording.send = keep  # type: ignore[method-assign]
    with IdempotentSender(recording, small) as sender:
        assert sender.send_many([msg(i, "x" * 100) for i in range(200)]).sent == 200
    assert len(seen) > 1
    for wire in seen:  # each transfer as it went, trace properties included, fits
        assert all("traceparent" in (m.application_properties or {}) for m in wire)
        assert sum(m.size + 64 for m in wire) <= small.max_message_size


class Served(Recording):
    """A backend of one's own that names the server it sends to (the documented seam)."""

    server_address = "broker.example.com"
    server_port = 5671


def test_the_backends_server_is_on_every_span_and_on_the_metric_points(
    otel: Any, broker: LocalBackend
) -> None:
    wrapped = FaultyBackend(Served(broker), [])  # read through the wrapper's inner backend
    with IdempotentSender(wrapped, "orders") as sender:
        sender.send(msg(1))
        sender.send_many([msg(2), msg(3, partition_key="other")])
    assert len(otel.spans) == 4  # the send; the send_many call and its two transfers
    for span in otel.spans:
        assert span.attributes["server.address"] == "broker.example.com"
        assert span.attributes["server.port"] == 5671
    for metric in ("messaging.client.operation.duration", "sendonce.messages"):
        points = otel.points(metric)
        assert points
        assert {(a["server.address"], a["server.port"]) for a, _ in points} == {
            ("broker.example.com", 5671)
        }


@pytest.mark.parametrize(
    ("endpoint", "options", "server"),
    [
        ("sb://shop.servicebus.windows.net/", {}, ("shop.servicebus.windows.net", 5671)),
        (
            "sb://shop.servicebus.windows.net/",
            {"transport_type": "websocket"},
            ("shop.servicebus.windows.net", 443),
        ),
        ("sb://localhost;UseDevelopmentEmulator=true", {}, ("localhost", 5672)),
        ("sb://127.0.0.1:5999;UseDevelopmentEmulator=true", {}, ("127.0.0.1", 5999)),
    ],
)
def test_a_service_bus_backend_names_the_host_and_port_its_client_connects_to(
    endpoint: str, options: dict[str, Any], server: tuple[str, int]
) -> None:
    from azure.servicebus import TransportType

    from sendonce.aio import AzureServiceBusBackend as AsyncBackend
    from sendonce.backends import AzureServiceBusBackend

    if options.get("transport_type") == "websocket":
        options = {"transport_type": TransportType.AmqpOverWebsocket}
    host, _, rest = endpoint.partition(";")
    conn = f"Endpoint={host};SharedAccessKeyName=k;SharedAccessKey=secret"
    conn += f";{rest}" if rest else ""
    for kind in (AzureServiceBusBackend, AsyncBackend):
        backend = kind.from_connection_string(conn, **options)  # no connection made yet
        assert (backend.server_address, backend.server_port) == server
