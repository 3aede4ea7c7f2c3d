"""OpenTelemetry on the Artemis backend, against the real broker: spans and metrics name
``activemq``, a cut connection shows as a retry event, in-doubt decisions carry their
reason, and the trace context reaches an Artemis consumer in the message's properties
without touching ``_AMQ_DUPL_ID`` (read with a hand-written proton receiver, and under
``-m slow`` with Artemis' own Core JMS consumer).

Spans and points are read back through the SDK's in-memory exporter and reader (``otel``).
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from artemis.broker import artemis_home
from artemis.faultproxy import FaultProxy
from artemis.raw import drain, message_count, wait_for
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends import ArtemisBackend

pytestmark = [pytest.mark.artemis, pytest.mark.timeout(180)]

RETRY = RetryPolicy(max_attempts=5, initial_backoff=0.05, max_backoff=0.5, attempt_timeout=20)


def traceparent(span: Any) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def every_attribute(otel: Any) -> list[str]:
    """Every span attribute, event attribute and metric point attribute, as text."""
    seen = [f"{k}={v}" for s in otel.spans for k, v in (s.attributes or {}).items()]
    seen += [f"{k}={v}" for s in otel.spans for e in s.events for k, v in e.attributes.items()]
    data = otel.reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    seen += [f"{k}={v}" for k, v in (point.attributes or {}).items()]
    return seen


def test_a_send_through_a_cut_connection_is_traced_and_its_context_reaches_the_consumer(
    artemis_broker, artemis_address: str, otel: Any
) -> None:
    messages = [
        Message(f"body {i}", message_id=f"order-{i}", partition_key=f"k{i % 3}") for i in range(12)
    ]
    with FaultProxy("127.0.0.1", artemis_broker.port) as proxy:
        proxy.cut_after(b"body 5", settle=0.5)  # stored; its disposition (and others') lost
        url = artemis_broker.url(port=proxy.port)
        profile = EntityProfile(artemis_address, id_cache_size=20_000)
        with IdempotentSender(url, profile, retry=RETRY, max_batch_messages=2) as sender:
            report = sender.send_many(messages)
        assert proxy.fired.is_set()
    assert (report.sent, report.failed) == (12, 0)

    assert {s.attributes["messaging.system"] for s in otel.spans} == {"activemq"}
    # The broker the sender connects to (here the proxy in front of it), on every span
    # and on the metric points of the semantic conventions.
    servers = {(s.attributes["server.address"], s.attributes["server.port"]) for s in otel.spans}
    assert servers == {("127.0.0.1", proxy.port)}
    for metric in ("messaging.client.operation.duration", "sendonce.messages"):
        points = otel.points(metric)
        assert points and {(a["server.address"], a["server.port"]) for a, _ in points} == servers
    transfers = otel.named(f"send {artemis_address}")
    retried = [s for s in transfers if any(e.name == "sendonce.retry" for e in s.events)]
    assert retried, "the cut connection left no retry event"
    for span in retried:
        assert span.attributes["sendonce.in_doubt_before"] is True  # a duplicate ack is ours
        (event,) = [e for e in span.events if e.name == "sendonce.retry"]
        assert str(event.attributes["error.type"]).startswith("amqp:connection:")
    assert otel.outcomes(system="activemq", destination=artemis_address) == {"sent": 12}
    assert otel.points("sendonce.retries")
    assert all(a["messaging.system"] == "activemq" for a, _ in otel.points("sendonce.retries"))

    # The consumer: each message once, its duplicate id untouched, and the context of the
    # transfer that carried it (the same on the resend), which a consumer continues.
    by_context = {traceparent(s): s for s in transfers}
    call = otel.one(f"send_many {artemis_address}")
    got = drain(artemis_broker.url(), artemis_address)
    assert sorted(str(m.id) for m in got) == sorted(m.message_id for m in messages)
    for received in got:
        props = dict(received.properties)
        assert props["_AMQ_DUPL_ID"] == str(received.id)
        assert props["traceparent"] == props["Diagnostic-Id"]
        producer = by_context[props["traceparent"]]
        assert producer.context.trace_id == call.context.trace_id
        parent = TraceContextTextMapPropagator().extract(props)
        with otel.tracer_provider.get_tracer("billing").start_as_current_span(
            "process order", context=parent
        ) as consumer:
            assert consumer.get_span_context().trace_id == call.context.trace_id
    assert artemis_broker.password not in " ".join(every_attribute(otel))


def test_in_doubt_decisions_on_artemis_are_events_with_their_reason(
    artemis_broker, artemis_address: str, otel: Any
) -> None:
    """An id cache of 3 ("small-cache.#"): a send whose one attempt lost its answer is in
    doubt (``retries``); after three more ids its resend is refused by the backend, which
    can no longer count on the cache (``not_resent``)."""
    address, direct = f"small-cache.{artemis_address}", artemis_broker.url()
    once = RetryPolicy(max_attempts=1, attempt_timeout=20)
    with (
        FaultProxy("127.0.0.1", artemis_broker.port) as proxy,
        ArtemisBackend(
            "127.0.0.1", proxy.port, user=artemis_broker.user, password=artemis_broker.password
        ) as backend,
        IdempotentSender(backend, EntityProfile(address, id_cache_size=3), retry=once) as sender,
    ):
        proxy.cut_after(b"body of x", settle=None)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(sender.send_many, [Message("body of x", message_id="x")])
            wait_for(lambda: message_count(direct, address) == 1, what="x stored")
            proxy.cut()
            assert running.result().in_doubt == ["x"]
        assert sender.send_many([Message(i, message_id=i) for i in "yzw"]).sent == 3
        assert sender.send_many([Message("body of x", message_id="x")]).in_doubt == ["x"]
    reasons = [
        (span.attributes["sendonce.attempts"], event["sendonce.reason"])
        for span, event in otel.events("sendonce.in_doubt")
    ]
    assert reasons == [(1, "retries"), (0, "not_resent")]
    assert otel.outcomes(system="activemq") == {"sent": 3, "in_doubt": 2}
    assert [str(m.id) for m in drain(direct, address)] == ["x", "y", "z", "w"]


@pytest.mark.slow
def test_artemis_core_jms_consumer_reads_the_trace_context_and_the_duplicate_id(
    artemis_broker, artemis_address: str, otel: Any, tmp_path: Path
) -> None:
    """Artemis' own consumer (``artemis consumer``, the Core JMS client) gets the messages
    with ``traceparent``, ``Diagnostic-Id`` and ``_AMQ_DUPL_ID`` as properties (about 10 s:
    a JVM starts)."""
    profile = EntityProfile(artemis_address, id_cache_size=20_000)
    with IdempotentSender(artemis_broker.url(), profile) as sender:
        assert sender.send_many([Message(f"b{i}", message_id=f"o-{i}") for i in range(3)]).sent
    (transfer,) = otel.named(f"send {artemis_address}")
    dump = tmp_path / "consumed.xml"
    command = [
        str(artemis_home() / "bin" / "artemis"),
        "consumer",
        "--url",
        f"tcp://127.0.0.1:{artemis_broker.port}",
        "--user",
        artemis_broker.user,
        "--password",
        artemis_broker.password,
        "--protocol",
        "CORE",
        "--destination",
        f"queue://{artemis_address}",
        "--message-count",
        "3",
        "--data",
        str(dump),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    consumed = {}
    for message in ET.parse(dump).getroot().iter("message"):
        props = {p.get("name"): p.get("value") for p in message.iter("property")}
        consumed[props["_AMQ_DUPL_ID"]] = props
    assert sorted(consumed) == ["o-0", "o-1", "o-2"]
    for props in consumed.values():
        assert props["traceparent"] == props["Diagnostic-Id"] == traceparent(transfer)
