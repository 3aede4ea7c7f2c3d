"""``sendonce.telemetry.use`` says what it does: each signal named, ``None`` for none.

Checked with the real OpenTelemetry SDK: spans reach the provider given, and a call that
names nothing is refused instead of silently turning telemetry off.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sendonce import EntityProfile, IdempotentSender, Message, telemetry
from sendonce.backends.local import LocalBackend
from sendonce.errors import ConfigurationError

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)


@pytest.fixture(autouse=True)
def _follow_the_globals_after() -> Iterator[None]:
    yield
    telemetry.reset()


def _spans_of_one_send(tmp_path: Path, exporter: InMemorySpanExporter) -> int:
    with (
        LocalBackend(tmp_path / "broker.db") as broker,
        IdempotentSender(broker, EntityProfile("orders")) as sender,
    ):
        sender.send(Message("x", message_id=f"m-{len(exporter.get_finished_spans())}"))
    return len(exporter.get_finished_spans())


def test_naming_nothing_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use(tracer_provider=provider, meter_provider=None)
    with pytest.raises(ConfigurationError, match="needs tracer_provider and meter_provider") as bad:
        telemetry.use()
    assert bad.value.field == "tracer_provider"
    assert "turns sendonce's telemetry off" in str(bad.value)
    with pytest.raises(ConfigurationError, match="needs meter_provider") as half:
        telemetry.use(tracer_provider=provider)
    assert half.value.field == "meter_provider"
    assert _spans_of_one_send(tmp_path, exporter) >= 1  # still tracing into the provider


def test_none_for_both_turns_it_off_saying_so(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use(tracer_provider=provider, meter_provider=None)
    traced = _spans_of_one_send(tmp_path, exporter)
    assert traced >= 1
    telemetry.use(tracer_provider=None, meter_provider=None)
    assert _spans_of_one_send(tmp_path, exporter) == traced  # no new span
