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
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Literal

from . import _telemetry
from .errors import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["SETUP_VARIABLE", "Exporting", "configure", "reset", "use"]

Exporter = Literal["otlp", "console", "none"]
_EXPORTERS = ("otlp", "console", "none")
SETUP_VARIABLE = _telemetry.SETUP_VARIABLE
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


def _choice(value: str | None, variable: str) -> Exporter:
    text = (value if value is not None else os.environ.get(variable, "otlp")).strip().lower()
    if text not in _EXPORTERS:
        raise ConfigurationError(
            f"{variable}={text!r} is not an exporter sendonce sets up: use one of "
            f"{', '.join(_EXPORTERS)}",
            field="exporter",
        )
    return text  # type: ignore[return-value]


def configure(exporter: str | None = None, *, service_name: str = "sendonce") -> Exporting:
    """Set the OpenTelemetry SDK's global tracer and meter providers, exporting to OTLP or the
    console; returns the :class:`Exporting` to shut down at exit.

    ``exporter`` (``"otlp"``, ``"console"``, ``"none"``) applies to traces and metrics; by
    default each follows ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` (``otlp`` if
    unset). The OTLP exporters read ``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends themselves
    (``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` needs ``opentelemetry-exporter-otlp-proto-grpc``);
    the console goes to stderr. ``OTEL_SERVICE_NAME`` overrides ``service_name``. A missing
    SDK or exporter is a :class:`~sendonce.errors.ConfigurationError` saying what to install.
    """
    traces = _choice(exporter, "OTEL_TRACES_EXPORTER")
    metrics_to = _choice(exporter, "OTEL_METRICS_EXPORTER")
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(f"{_SDK_HINT} ({exc})", field="otel") from None
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": service_name})
    exporting = Exporting(exporters=(traces, metrics_to))
    if traces != "none":
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(traces)))
        trace.set_tracer_provider(tracer_provider)
        exporting.tracer_provider = tracer_provider
    if metrics_to != "none":
        reader = PeriodicExportingMetricReader(_metric_exporter(metrics_to))
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        metrics.set_meter_provider(meter_provider)
        exporting.meter_provider = meter_provider
    return exporting


def _protocol() -> str:
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if os.environ.get(variable):
            return os.environ[variable].strip().lower()
    return "http/protobuf"


def _span_exporter(kind: Exporter) -> Any:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)
    return _otlp("trace_exporter", "OTLPSpanExporter")


def _metric_exporter(kind: Exporter) -> Any:
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
    _telemetry.use(tracer_provider, meter_provider)


def reset() -> None:
    """Undo :func:`use`: follow the global providers again."""
    _telemetry.reset()
