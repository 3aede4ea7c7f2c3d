"""The telemetry core: the switch, the providers, spans, metrics' shared pieces and W3C
propagation. It knows no feature: each feature declares its own instruments and spans on a
:class:`Core`, at its own edge -- the sender beside its core (``sendonce._sender_telemetry``),
the ledger (``sendonce.ledger._telemetry``), Spark (``sendonce.spark._telemetry``), the
command line (``sendonce.cli._otel``) and the outbox relay.

Nothing here costs anything unless OpenTelemetry is in use: :func:`active` is one
module-global check while the ``opentelemetry`` API has not been imported or no provider
has been set (it never imports the API itself). Once a tracer or meter provider is set
(``opentelemetry.trace.set_tracer_provider`` / ``metrics.set_meter_provider``, or
:func:`use` for sendonce alone), one :class:`Core` is built and kept until the next switch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

__all__ = [
    "DURATION_BUCKETS",
    "OFF",
    "SCHEMA_URL",
    "SETUP_VARIABLE",
    "Core",
    "Scope",
    "Timed",
    "active",
    "carrier",
    "current",
    "error_type",
    "fail",
    "flush",
    "on_switch",
    "reset",
    "traceparent",
    "use",
    "worker_setup",
]

logger = logging.getLogger("sendonce.telemetry")

NAME = "sendonce"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
"""The semantic conventions sendonce follows (docs/observability.md). The messaging ones
have no stable version yet, so ``OTEL_SEMCONV_STABILITY_OPT_IN`` has nothing to switch to
and is not read."""

SETUP_VARIABLE = "SENDONCE_OTEL_SETUP"
"""``module:function`` a process without a provider calls once before its first Spark task
(executors are processes of their own: they need their own provider)."""

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

# -- the semantic conventions' names every feature shares (docs/observability.md) ---------

SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
BATCH_COUNT = "messaging.batch.message_count"
MESSAGE_ID = "messaging.message.id"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
"""The semantic conventions' advised boundaries (seconds) for messaging durations: the SDK's
default ones (0, 5, 10, 25... meant for milliseconds) would put every transfer in one bucket."""


def _version() -> str:
    try:
        return importlib.metadata.version(NAME)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a checkout
        return "unknown"


class Core:
    """A tracer (None when only metrics are on) and a meter, from the providers in use."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        *,
        explicit: bool = False,
    ) -> None:
        from opentelemetry import context, metrics, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.context = context
        self.propagator = TraceContextTextMapPropagator()
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer: Any = None
        if tracer_provider is not None or (
            not explicit and getattr(trace, "_TRACER_PROVIDER", None) is not None
        ):
            provider = tracer_provider or trace.get_tracer_provider()
            if not isinstance(provider, trace.NoOpTracerProvider):
                self.tracer = provider.get_tracer(NAME, _version(), schema_url=SCHEMA_URL)
        if meter_provider is None and explicit:
            meter_provider = metrics.NoOpMeterProvider()
        self.meter: Any = (meter_provider or metrics.get_meter_provider()).get_meter(
            NAME, _version(), schema_url=SCHEMA_URL
        )
        self.extensions: dict[object, Any] = {}
        """What a feature built on this core once (its instruments), by the feature's key."""

    def extension(self, key: object, build: Callable[[Core], Any]) -> Any:
        """The feature ``key``'s object on this core, built by ``build(core)`` on first use."""
        found = self.extensions.get(key)
        if found is None:
            with _lock:
                found = self.extensions.get(key)
                if found is None:
                    found = self.extensions[key] = build(self)
        return found

    def span(
        self, name: str, kind: str, attributes: dict[str, Any], parent: Any = None
    ) -> Span | None:
        """A started span of ``kind`` (``"PRODUCER"``, ``"CLIENT"``...), None if untraced."""
        tracer = self.tracer
        if tracer is None:
            return None
        span: Span = tracer.start_span(
            name, context=parent, kind=getattr(self.trace.SpanKind, kind), attributes=attributes
        )
        return span

    def attach(self, span: Span) -> object:
        """Make ``span`` current; returns the token :meth:`detach` takes."""
        return self.context.attach(self.trace.set_span_in_context(span))

    def detach(self, token: object) -> None:
        self.context.detach(token)  # type: ignore[arg-type]


def error_type(exc: BaseException) -> str:
    """``error.type``: the broker's condition when known, else the exception's full name."""
    for error in (exc, getattr(exc, "last_error", None)):
        condition = getattr(error, "condition", None)
        if isinstance(condition, str) and condition:
            return condition
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


def fail(core: Core, span: Span, exc: BaseException) -> None:
    """Mark ``span`` failed with ``exc``: ``error.type`` and an ERROR status."""
    span.set_attribute(ERROR_TYPE, error_type(exc))
    span.set_status(core.trace.Status(core.trace.StatusCode.ERROR, type(exc).__name__))


class Timed:
    """A span made current (if tracing) and a duration recorded (if ``histogram``): a
    feature's unit of work such as a ledger write or a Spark task."""

    __slots__ = ("attributes", "began", "core", "histogram", "span", "token")

    def __init__(
        self,
        core: Core,
        name: str,
        kind: str,
        attributes: dict[str, Any],
        histogram: Any = None,
        parent: Any = None,
    ) -> None:
        self.core = core
        self.attributes = attributes
        self.histogram = histogram
        self.span = core.span(name, kind, attributes, parent)
        self.token: Any = None
        self.began = 0.0

    def __enter__(self) -> Timed:
        if self.span is not None:
            self.token = self.core.attach(self.span)
        self.began = time.perf_counter()
        return self

    def set(self, **attributes: Any) -> None:
        """Add ``sendonce.<name>`` attributes (counts known at the end)."""
        span = self.span
        if span is not None:
            span.set_attributes({f"sendonce.{name}": value for name, value in attributes.items()})

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.histogram is not None:
            attributes = self.attributes
            if exc is not None:
                attributes = {**attributes, ERROR_TYPE: error_type(exc)}
            self.histogram.record(time.perf_counter() - self.began, attributes)
        span = self.span
        if span is None:
            return
        if exc is not None:
            fail(self.core, span, exc)
        self.core.detach(self.token)
        span.end()


class _Untimed:
    """The scope when telemetry is off: does nothing (one shared instance, :data:`OFF`)."""

    __slots__ = ()

    def __enter__(self) -> _Untimed:
        return self

    def set(self, **attributes: Any) -> None:
        pass

    def __exit__(self, *exc_info: object) -> None:
        pass


OFF = _Untimed()
"""The scope of every feature's unit of work while telemetry is off."""
Scope = Timed | _Untimed


# -- the switch ---------------------------------------------------------------------------

_active: Core | None = None
_explicit = False  # set by use(): the global providers are not consulted
_lock = threading.RLock()
_hooks: list[Callable[[Core | None], None]] = []


def current() -> Core | None:
    """The core in use, without looking for a newly set global provider (the hot hooks)."""
    return _active


def active() -> Core | None:
    """The core, or None while OpenTelemetry is not in use (the common, free case)."""
    core = _active
    if core is not None:
        return core
    return _probe()


def _probe() -> Core | None:
    """Whether a global provider has been set since the last look (never imports the API)."""
    modules = sys.modules
    trace_api = modules.get("opentelemetry.trace")
    metrics_api = modules.get("opentelemetry.metrics._internal")
    traced = trace_api is not None and getattr(trace_api, "_TRACER_PROVIDER", None) is not None
    metered = metrics_api is not None and getattr(metrics_api, "_METER_PROVIDER", None) is not None
    if not traced and not metered:
        return None
    with _lock:
        if _active is None and not _explicit:
            _switch(Core(None, None))
    return _active


def _switch(core: Core | None) -> None:
    global _active
    _active = core
    for hook in list(_hooks):
        hook(core)


def on_switch(hook: Callable[[Core | None], None]) -> None:
    """Call ``hook(core)`` each time telemetry turns on, changes providers or turns off."""
    _hooks.append(hook)


def use(
    tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> None:
    """Send sendonce's spans and metrics to these providers, whatever the global ones are.

    ``use()`` with neither turns sendonce's telemetry off; :func:`reset` goes back to the
    global providers.
    """
    global _explicit
    with _lock:
        _explicit = True
        if tracer_provider is None and meter_provider is None:
            _switch(None)
        else:
            _switch(Core(tracer_provider, meter_provider, explicit=True))


def reset() -> None:
    """Forget :func:`use`: follow the global providers again (looked up on the next call)."""
    global _explicit
    with _lock:
        _explicit = False
        _switch(None)


# -- propagation --------------------------------------------------------------------------


def traceparent(span: Span, max_state: int) -> tuple[str, str | None] | None:
    """The W3C ``traceparent`` of ``span`` and its ``tracestate`` when there is one of at
    most ``max_state`` characters, as ``TraceContextTextMapPropagator`` writes them, without
    its per-call set-up; None for an invalid context (a non-recording span's)."""
    context = span.get_span_context()
    trace_id, span_id = context.trace_id, context.span_id
    if not trace_id or not span_id:
        return None
    parent = f"00-{trace_id:032x}-{span_id:016x}-{context.trace_flags:02x}"
    trace_state = context.trace_state
    state = trace_state.to_header() if trace_state else None
    return parent, state if state and len(state) <= max_state else None


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers (``traceparent``), to ship to another
    process (a Spark task); None when not traced."""
    core = active()
    if core is None or core.tracer is None:
        return None
    headers: dict[str, str] = {}
    core.propagator.inject(headers)
    return headers or None


# -- processes of their own (Spark executors) ---------------------------------------------

_setup_done = False


def worker_setup() -> None:
    """Once per process: call ``$SENDONCE_OTEL_SETUP`` (``module:function``) if it is set and
    no provider is. A failing setup is logged, never raised: telemetry must not fail a send."""
    global _setup_done
    if _setup_done:
        return
    _setup_done = True
    spec = os.environ.get(SETUP_VARIABLE, "").strip()
    if not spec or active() is not None:
        return
    module, _, name = spec.partition(":")
    try:
        setup = getattr(importlib.import_module(module), name or "configure")
        setup()
    except Exception as exc:
        logger.warning("%s=%r failed, telemetry stays off: %r", SETUP_VARIABLE, spec, exc)


def flush(timeout_millis: int = 10_000) -> None:
    """Export what is buffered (a Spark task's end: its worker may be killed, not exited)."""
    core = _active
    if core is None:
        return
    providers: list[Any] = [core.tracer_provider, core.meter_provider]
    if core.tracer_provider is None:
        providers[0] = core.trace.get_tracer_provider()
    if core.meter_provider is None:
        from opentelemetry import metrics

        providers[1] = metrics.get_meter_provider()
    for provider in providers:
        force = getattr(provider, "force_flush", None)
        if callable(force):
            try:
                force(timeout_millis)
            except Exception as exc:  # pragma: no cover - an exporter's own failure
                logger.warning("telemetry flush failed: %r", exc)
