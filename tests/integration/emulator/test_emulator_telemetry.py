"""Traces through the emulator with the real azure-servicebus client, producer to consumer.

The producer's transfer span travels in each message (``traceparent``, ``Diagnostic-Id``);
the azure-servicebus client's own receive span (azure-core tracing on OpenTelemetry) links
to it, and a consumer that extracts it puts its processing span in the producer's trace.
Runs that need a *global* provider (azure-core's tracing uses only the global one) run in
a child process: a global provider cannot be unset and would trace every later test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode
from opentelemetry.trace import SpanKind

from sendonce import EntityProfile, IdempotentSender, Message, NotStoredError, RetryPolicy
from sendonce.backends import AzureServiceBusBackend, LocalBackend
from sendonce.emulator import Emulator, Fault, FaultAction

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

CHILD = r"""
import json, sys
from azure.core.settings import settings
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sendonce import EntityProfile, IdempotentSender, Message

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # the application's own setup: sendonce follows it
settings.tracing_implementation = "opentelemetry"  # and so does the azure-servicebus client

conn = sys.argv[1]
with IdempotentSender(conn, EntityProfile("orders")) as sender:
    sender.send_many([Message(f"body {i}", message_id=f"order-{i}") for i in range(3)])

received = []
tracer = trace.get_tracer("consumer")
with ServiceBusClient.from_connection_string(conn, retry_total=0) as client:
    with client.get_queue_receiver(
        "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        while len(received) < 3:
            for message in receiver.receive_messages(max_message_count=3, max_wait_time=5):
                props = {k.decode(): v.decode() for k, v in message.application_properties.items()}
                # A consumer continuing the producer's trace (docs/observability.md).
                parent = TraceContextTextMapPropagator().extract(props)
                with tracer.start_as_current_span("process orders", context=parent):
                    pass
                received.append({"id": str(message.message_id), "keys": sorted(props), **props})

def ident(ctx):
    return [f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"]

spans = [
    {
        "name": s.name,
        "kind": s.kind.name,
        "context": ident(s.context),
        "parent": ident(s.parent) if s.parent else None,
        "links": [ident(link.context) for link in s.links],
    }
    for s in exporter.get_finished_spans()
]
print(json.dumps({"spans": spans, "received": received}))
"""


def test_a_consumer_links_to_and_continues_the_producers_trace(emulator: Emulator) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, emulator.connection_string],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    spans, received = out["spans"], out["received"]
    [call] = [s for s in spans if s["name"] == "send_many orders"]
    [transfer] = [s for s in spans if s["name"] == "send orders" and s["kind"] == "PRODUCER"]
    assert transfer["parent"] == call["context"]
    # Each message carries the transfer's context once, under the client's own names,
    # though the client (tracing on) would have added its own: it keeps ours.
    assert sorted(m["id"] for m in received) == ["order-0", "order-1", "order-2"]
    for message in received:
        assert message["keys"] == ["Diagnostic-Id", "traceparent"]
        assert message["traceparent"] == message["Diagnostic-Id"]
        assert message["traceparent"].split("-")[1:3] == transfer["context"]
    # The client's receive span links to the producer's transfer span ...
    receives = [s for s in spans if s["name"] == "ServiceBus.receive"]
    assert receives and any(transfer["context"] in s["links"] for s in receives)
    # ... and a consumer that extracts the context joins the producer's trace.
    processing = [s for s in spans if s["name"] == "process orders"]
    assert len(processing) == 3
    assert all(s["parent"] == transfer["context"] for s in processing)


def test_a_resend_through_the_emulator_carries_the_same_context_and_lands_once(
    otel: object, emulator: Emulator, store: LocalBackend
) -> None:
    emulator.faults.add(Fault(FaultAction.DROP_AFTER_COMMIT, entity="orders"))
    policy = RetryPolicy(sleep=lambda s: None, jitter=False)
    backend = AzureServiceBusBackend.from_connection_string(emulator.connection_string)
    with backend, IdempotentSender(backend, EntityProfile("orders"), retry=policy) as sender:
        result = sender.send(Message("paid", message_id="order-1"))
    assert result.outcome == "sent" and result.attempts == 2
    capture = otel  # the in-memory capture (tests/otel_capture.py)
    [transfer] = capture.named("send orders")  # type: ignore[attr-defined]
    assert transfer.kind is SpanKind.PRODUCER
    assert transfer.attributes["messaging.system"] == "servicebus"
    host, _, port = emulator.connection_string.split("sb://")[1].split(";")[0].partition(":")
    assert (transfer.attributes["server.address"], transfer.attributes["server.port"]) == (
        host,
        int(port),
    )
    [(attributes, _)] = capture.points("messaging.client.operation.duration")  # type: ignore[attr-defined]
    assert (attributes["server.address"], attributes["server.port"]) == (host, int(port))
    [(span, retry)] = capture.events("sendonce.retry")  # type: ignore[attr-defined]
    assert span is transfer and retry["sendonce.attempt"] == 1
    ctx = transfer.context
    traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_receiver(
            "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            got = receiver.receive_messages(max_message_count=5, max_wait_time=3)
    # The first attempt was stored; the resend (same id, same context) was dropped.
    assert [str(m.message_id) for m in got] == ["order-1"]
    assert got[0].application_properties[b"traceparent"].decode() == traceparent
    assert capture.outcomes() == {"sent": 1}  # type: ignore[attr-defined]


def test_nothing_reached_the_broker_is_the_not_stored_outcome(otel: object) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conn = (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey=secret;"
        "UseDevelopmentEmulator=true"
    )
    policy = RetryPolicy(sleep=lambda s: None, jitter=False, max_attempts=2, attempt_timeout=5)
    backend = AzureServiceBusBackend.from_connection_string(conn)
    with backend, IdempotentSender(backend, EntityProfile("orders"), retry=policy) as sender:
        with pytest.raises(NotStoredError):
            sender.send(Message("paid", message_id="order-1"))
    capture = otel
    [call] = capture.named("send orders")  # type: ignore[attr-defined]
    assert call.kind is SpanKind.PRODUCER  # one span: the call is its transfer
    assert call.attributes["sendonce.outcome"] == "not_stored"
    assert (call.attributes["server.address"], call.attributes["server.port"]) == (
        "127.0.0.1",
        port,
    )
    assert capture.outcomes() == {"not_stored": 1}  # type: ignore[attr-defined]
    assert "secret" not in json.dumps([dict(s.attributes) for s in capture.spans])  # type: ignore[attr-defined]
