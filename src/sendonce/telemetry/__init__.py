"""Export what sendonce does through OpenTelemetry (``docs/observability.md``).

sendonce speaks only the OpenTelemetry *API* (the ``otel`` extra): an application that
sets its own tracer and meter providers gets sendonce's spans and metrics with no call
here. This module is for processes that have no setup of their own:

- :func:`configure` sets the SDK's global providers from the standard ``OTEL_*``
  environment variables, exporting over OTLP or to the console. The ``sendonce``
  command calls it for ``--otel``; a Spark executor calls it when
  ``SENDONCE_OTEL_SETUP=sendonce.telemetry:configure`` is in its environment.
- :func:`use` sends sendonce's telemetry to providers of your choosing without touching the
  global ones (tests read spans back this way); each signal is named, ``None`` for none.

The package's core (``_core``) holds the switch, the providers, spans and propagation, and
knows no feature: each feature builds its instruments on it.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigurationError
from . import _core

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["SETUP_VARIABLE", "Exporting", "configure", "reset", "use"]

Exporter = Literal["otlp", "console", "none"]
"""One exporter name of ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` sendonce sets up."""
_EXPORTERS = ("otlp", "console", "none")
SETUP_VARIABLE = _core.SETUP_VARIABLE
"""The environment variable naming the setup a Spark executor calls (``module:function``)."""

_SDK_HINT = (
    "exporting telemetry needs the OpenTelemetry SDK and an exporter: "
    "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"
)


@dataclass
class Exporting:
    """The providers :func:`configure` set; :meth:`shutdown` exports what is left."""

    tracer_provider: Any = None
    meter_provider: Any = None
    exporters: tuple[str, str] = ("none", "none")
    """(traces, metrics) exporters in use."""
    _closed: bool = field(default=False, repr=False)

    def shutdown(self) -> None:
        """Flush and stop both providers (idempotent): call it before the process ends."""
        if self._closed:
            return
        self._closed = True
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.shutdown()


TRACES_VARIABLE = "OTEL_TRACES_EXPORTER"
METRICS_VARIABLE = "OTEL_METRICS_EXPORTER"


def _parse(text: str, source: str) -> tuple[Exporter, ...]:
    """The exporters of a comma-separated list (``console,otlp``); ``none`` stands alone."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    for name in names:
        if name not in _EXPORTERS:
            raise ConfigurationError(
                f"{source}={text.strip()!r} is not an exporter sendonce sets up: use one or "
                f"more of otlp, console (comma-separated), or none",
                field="exporter",
            )
    chosen: tuple[Exporter, ...] = tuple(dict.fromkeys(names))  # type: ignore[arg-type]
    if "none" in chosen and len(chosen) > 1:
        raise ConfigurationError(
            f"{source}={text.strip()!r}: none cannot be listed with another exporter",
            field="exporter",
        )
    return () if chosen in ((), ("none",)) else chosen


def _exporters(exporter: str | None = None) -> tuple[tuple[Exporter, ...], tuple[Exporter, ...]]:
    """(traces, metrics) exporters :func:`configure` sets up; empty: that signal is off.

    ``exporter`` applies to both. Else ``OTEL_TRACES_EXPORTER`` chooses for traces and
    ``OTEL_METRICS_EXPORTER`` for metrics; one left unset follows the other (traces to the
    console alone print metrics there too, never to an OTLP endpoint nobody named), and
    both unset mean ``otlp``, the OpenTelemetry default. ``OTEL_SDK_DISABLED=true`` turns
    both off.
    """
    if exporter is not None:
        both = _parse(exporter, "exporter")
        return both, both
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return (), ()
    traces_text = os.environ.get(TRACES_VARIABLE, "").strip()
    metrics_text = os.environ.get(METRICS_VARIABLE, "").strip()
    traces = _parse(traces_text, TRACES_VARIABLE) if traces_text else None
    metrics = _parse(metrics_text, METRICS_VARIABLE) if metrics_text else None
    if traces is None and metrics is None:
        return ("otlp",), ("otlp",)
    if traces is None:
        traces = metrics
    if metrics is None:
        metrics = traces
    assert traces is not None and metrics is not None
    return traces, metrics


def configure(exporter: str | None = None, *, service_name: str = "sendonce") -> Exporting:
    """Set the OpenTelemetry SDK's global tracer and meter providers, exporting to OTLP or the
    console; returns the :class:`Exporting` to shut down at exit.

    ``exporter`` (``"otlp"``, ``"console"``, ``"none"``, or a comma-separated list) applies
    to traces and metrics. Without it, ``OTEL_TRACES_EXPORTER`` chooses for traces and
    ``OTEL_METRICS_EXPORTER`` for metrics; one left unset follows the other, both unset mean
    ``otlp``, and ``OTEL_SDK_DISABLED=true`` sets nothing up. The OTLP exporters read
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends themselves
    (``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` needs ``opentelemetry-exporter-otlp-proto-grpc``);
    the console goes to stderr. ``OTEL_SERVICE_NAME`` overrides ``service_name``. A missing
    SDK or exporter is a :class:`~sendonce.errors.ConfigurationError` saying what to install.
    """
    traces, metrics_to = _exporters(exporter)
    exporting = Exporting(exporters=(",".join(traces) or "none", ",".join(metrics_to) or "none"))
    if not traces and not metrics_to:
        return exporting
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(f"{_SDK_HINT} ({exc})", field="otel") from None
    # Every exporter is built before any provider is set: a missing one sets nothing.
    span_exporters = [_span_exporter(kind) for kind in traces]
    metric_exporters = [_metric_exporter(kind) for kind in metrics_to]
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": service_name})
    if span_exporters:
        tracer_provider = TracerProvider(resource=resource)
        for span_exporter in span_exporters:
            tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        trace.set_tracer_provider(tracer_provider)
        exporting.tracer_provider = tracer_provider
    if metric_exporters:
        readers = [PeriodicExportingMetricReader(e) for e in metric_exporters]
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        exporting.meter_provider = meter_provider
    return exporting


def _protocol() -> str:
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if os.environ.get(variable):
            return os.environ[variable].strip().lower()
    return "http/protobuf"


def _span_exporter(kind: str) -> Any:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)
    return _otlp("trace_exporter", "OTLPSpanExporter")


def _metric_exporter(kind: str) -> Any:
    if kind == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter(out=sys.stderr)
    return _otlp("metric_exporter", "OTLPMetricExporter")


def _otlp(module: str, name: str) -> Any:
    """The OTLP exporter of the configured protocol (http/protobuf unless grpc)."""
    transport = "grpc" if _protocol() == "grpc" else "http"
    try:
        found = importlib.import_module(f"opentelemetry.exporter.otlp.proto.{transport}.{module}")
    except ImportError as exc:
        raise ConfigurationError(_exporter_hint(exc), field="otel") from None
    return getattr(found, name)()


def _exporter_hint(exc: ImportError) -> str:
    package = (
        "opentelemetry-exporter-otlp-proto-grpc"
        if _protocol() == "grpc"
        else "opentelemetry-exporter-otlp-proto-http"
    )
    return f"the OTLP exporter is not installed: pip install {package} ({exc})"


def use(
    tracer_provider: TracerProvider | EllipsisType | None = ...,
    meter_provider: MeterProvider | EllipsisType | None = ...,
) -> None:
    """Send sendonce's spans to ``tracer_provider`` and its metrics to ``meter_provider``,
    not to the global providers.

    Both are named, each a provider or ``None`` for none of that signal:
    ``use(tracer_provider=tp, meter_provider=None)`` traces and records no metrics;
    ``use(tracer_provider=None, meter_provider=None)`` turns sendonce's telemetry off.
    Leaving one out is a ``ConfigurationError`` naming it: whether an omitted one meant
    "none" or "the global one" would be a guess (``use()`` used to turn telemetry off
    without saying so). Senders made afterwards use them (a sender decides when it is made,
    or opened for ``aio``); :func:`reset` follows the global providers again.
    """
    missing = [
        name
        for name, given in (
            ("tracer_provider", tracer_provider),
            ("meter_provider", meter_provider),
        )
        if given is ...
    ]
    if missing:
        raise ConfigurationError(
            f"telemetry.use() needs {' and '.join(missing)}: a provider, or None for none of "
            "that signal (use(tracer_provider=None, meter_provider=None) turns sendonce's "
            "telemetry off; reset() follows the global providers)",
            field=missing[0],
        )
    assert not isinstance(tracer_provider, EllipsisType)
    assert not isinstance(meter_provider, EllipsisType)
    _core.use(tracer_provider, meter_provider)


def reset() -> None:
    """Undo :func:`use`: follow the global providers again."""
    _core.reset()
