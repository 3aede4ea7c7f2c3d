"""What sendonce emitted, read back through the OpenTelemetry SDK's in-memory span exporter
and metric reader (the ``otel`` fixture of ``tests/conftest.py``).

The providers reach sendonce through ``sendonce._telemetry.use``, never the global
OpenTelemetry API: a global provider cannot be unset, and would trace every later test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sendonce import _telemetry


class Capture:
    """The spans and metric points sendonce produced while it was in use."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    # -- spans ---------------------------------------------------------------------

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, (name, [s.name for s in self.spans])
        return found[0]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        span_id = parent.context.span_id
        return [s for s in self.spans if s.parent is not None and s.parent.span_id == span_id]

    def events(self, name: str) -> list[tuple[ReadableSpan, dict[str, Any]]]:
        return [
            (s, dict(e.attributes or {})) for s in self.spans for e in s.events if e.name == name
        ]

    # -- metrics -------------------------------------------------------------------

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, point) of every data point of ``metric`` so far (cumulative)."""
        data = self.reader.get_metrics_data()
        found: list[tuple[dict[str, Any], Any]] = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found.extend((dict(p.attributes or {}), p) for p in m.data.data_points)
        return found

    def outcomes(self, **match: Any) -> Counter[str]:
        """``sendonce.messages`` summed by outcome, over the points whose attributes match."""
        totals: Counter[str] = Counter()
        for attributes, point in self.points("sendonce.messages"):
            if all(attributes.get(_key(k)) == v for k, v in match.items()):
                totals[attributes["sendonce.outcome"]] += point.value
        return totals

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def _key(name: str) -> str:
    return {
        "system": "messaging.system",
        "destination": "messaging.destination.name",
        "operation": "messaging.operation.name",
    }.get(name, name)


@contextmanager
def capturing() -> Iterator[Capture]:
    """sendonce's telemetry on, into a fresh :class:`Capture`, for the ``with`` block."""
    capture = Capture()
    _telemetry.use(capture.tracer_provider, capture.meter_provider)
    try:
        yield capture
    finally:
        _telemetry.reset()
        capture.shutdown()
