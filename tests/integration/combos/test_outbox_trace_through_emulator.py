"""A consumer lands in the web request's trace through the outbox (issue 35).

A "web request" span (the OpenTelemetry SDK, in-memory exporter) enqueues a row in a real
PostgreSQL outbox; a relay publishes it through the emulator with the real azure-servicebus
client (``AzureServiceBusBackend``); a consumer with the real azure-servicebus receiver reads
the message, extracts its context and starts its span: the span is a child of the web
request, and the relay's span links to the web request.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

pytest.importorskip("opentelemetry.sdk")

from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sendonce import EntityProfile, Message
from sendonce.backends import AzureServiceBusBackend
from sendonce.outbox import Relay, enqueue, install

pytestmark = [pytest.mark.postgres, pytest.mark.emulator, pytest.mark.timeout(180)]


def test_a_consumer_joins_the_web_requests_trace_through_the_outbox(
    outbox_url: str, emulator: Any, otel: Any
) -> None:
    install(outbox_url)
    web = otel.tracer_provider.get_tracer("web")
    with web.start_as_current_span("POST /orders", kind=SpanKind.SERVER) as request:
        with psycopg.connect(outbox_url) as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
            conn.execute("INSERT INTO orders VALUES (1), (2)")
            enqueue(
                conn,
                [Message(f"order {n}", message_id=f"order-{n}/created") for n in (1, 2)],
                entity="orders",
            )
            conn.commit()
    web_context = request.get_span_context()

    backend = AzureServiceBusBackend.from_connection_string(emulator.connection_string)
    with backend, Relay(outbox_url, backend, [EntityProfile("orders")]) as relay:
        assert relay.drain().published == 2

    consumer = otel.tracer_provider.get_tracer("billing")
    received: dict[str, dict[str, str]] = {}
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_receiver(
            "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            while len(received) < 2:  # waits for the messages, not a clock
                for message in receiver.receive_messages(max_message_count=2, max_wait_time=5):
                    props = {
                        k.decode(): v.decode() for k, v in message.application_properties.items()
                    }
                    parent = TraceContextTextMapPropagator().extract(props)
                    with consumer.start_as_current_span(
                        "process orders", context=parent, kind=SpanKind.CONSUMER
                    ):
                        pass
                    received[str(message.message_id)] = props

    assert sorted(received) == ["order-1/created", "order-2/created"]
    ids = f"{web_context.trace_id:032x}-{web_context.span_id:016x}"
    expected = f"00-{ids}-{web_context.trace_flags:02x}"
    for props in received.values():
        assert props == {"traceparent": expected, "Diagnostic-Id": expected}
    # The consumer's spans are in the web request's trace, children of the request's span.
    processing = otel.named("process orders")
    assert len(processing) == 2
    for span in processing:
        assert span.context.trace_id == web_context.trace_id
        assert span.parent is not None and span.parent.span_id == web_context.span_id
    # The relay's span (its own trace) links to the web request; its transfer is its child.
    relay_span = otel.one("relay orders")
    assert [(link.context.trace_id, link.context.span_id) for link in relay_span.links] == [
        (web_context.trace_id, web_context.span_id)
    ]
    assert relay_span.context.trace_id != web_context.trace_id
    assert relay_span.attributes["messaging.system"] == "servicebus"
    [call] = otel.children(relay_span)
    assert call.name == "send_many orders"
    assert [t.kind for t in otel.children(call)] == [SpanKind.PRODUCER]
