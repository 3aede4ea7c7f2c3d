"""A small OTLP/HTTP collector for tests: what a process exported, decoded.

It stands where an OpenTelemetry Collector would: the OTLP exporters of the process under
test (the CLI, a Spark executor) post protobuf requests to ``/v1/traces`` and
``/v1/metrics`` on 127.0.0.1, and the test reads the spans and metric points back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]


@dataclass
class Collected:
    """Everything received so far (appended by the server's threads)."""

    spans: list[Span] = field(default_factory=list)
    points: list[tuple[str, dict[str, Any], Any]] = field(default_factory=list)
    """(metric name, attributes, value: a sum's value or a histogram's count)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def outcomes(self) -> dict[str, int]:
        """The last cumulative ``sendonce.messages`` value of each outcome."""
        latest: dict[tuple[Any, ...], tuple[str, int]] = {}
        with self.lock:
            for name, attributes, value in self.points:
                if name == "sendonce.messages":
                    latest[tuple(sorted(attributes.items()))] = (
                        attributes["sendonce.outcome"],
                        value,
                    )
        totals: dict[str, int] = {}
        for outcome, value in latest.values():
            totals[outcome] = totals.get(outcome, 0) + value
        return totals

    def add_traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    span = Span(
                        s.name,
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        s.kind,
                        _attributes(s.attributes),
                        [(e.name, _attributes(e.attributes)) for e in s.events],
                        resource,
                    )
                    with self.lock:
                        self.spans.append(span)

    def add_metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        for resource_metrics in request.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        value = (
                            point.count
                            if kind == "histogram"
                            else (point.as_int if point.HasField("as_int") else point.as_double)
                        )
                        with self.lock:
                            self.points.append((metric.name, _attributes(point.attributes), value))


@contextmanager
def otlp_collector() -> Iterator[tuple[str, Collected]]:
    """(endpoint for ``OTEL_EXPORTER_OTLP_ENDPOINT``, what it collected); stops on exit."""
    collected = Collected()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.endswith("/v1/traces"):
                collected.add_traces(body)
            elif self.path.endswith("/v1/metrics"):
                collected.add_metrics(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", collected
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
