"""``sendonce --otel``: the command exports what it did, over OTLP or to the console.

Each run is a real ``sendonce`` process (a global OpenTelemetry provider cannot be unset,
so never in the test process); OTLP goes to a small collector on 127.0.0.1
(``tests/otlp_collector.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otlp_collector import otlp_collector
from sendonce import EntityProfile
from sendonce.backends import LocalBackend


def sendonce(
    *args: str, cwd: Path, env: dict[str, str] | None = None, blocked: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the command; ``blocked`` names a module made impossible to import (not installed)."""
    prelude = f"import sys; sys.modules[{blocked!r}] = None; " if blocked else ""
    code = prelude + "from sendonce.cli import main; main()"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def orders(tmp_path: Path) -> Path:
    with LocalBackend(tmp_path / "broker.db") as broker:
        broker.create_entity(EntityProfile("orders"))
    records = tmp_path / "orders.jsonl"
    records.write_text("".join(json.dumps({"order_id": i}) + "\n" for i in range(3)))
    return tmp_path


PUBLISH = ("publish", "orders.jsonl", "--to", "local:broker.db", "--entity", "orders")
PUBLISH += ("--id", "{order_id}", "--no-progress")


def test_otel_console_prints_the_spans_and_metrics_on_stderr_not_stdout(orders: Path) -> None:
    done = sendonce("--otel", "console", *PUBLISH, cwd=orders)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3 record(s) to 'orders': sent 3, duplicates 0, failed 0\n"
    decoder, text, objects = json.JSONDecoder(), done.stderr, []
    index = text.find("{")
    while index != -1:
        value, end = decoder.raw_decode(text, index)
        objects.append(value)
        index = text.find("{", end)
    spans = {o["name"]: o for o in objects if "context" in o and "kind" in o}
    assert spans["send_many orders"]["attributes"]["sendonce.sent"] == 3
    assert spans["send orders"]["parent_id"] == spans["send_many orders"]["context"]["span_id"]
    assert spans["send orders"]["resource"]["attributes"]["service.name"] == "sendonce"
    metrics = [
        m["name"]
        for o in objects
        for rm in o.get("resource_metrics", ())
        for sm in rm["scope_metrics"]
        for m in sm["metrics"]
    ]
    assert "sendonce.messages" in metrics and "messaging.client.operation.duration" in metrics


def test_otel_otlp_exports_to_the_endpoint_of_the_standard_variables(orders: Path) -> None:
    with otlp_collector() as (endpoint, collected):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "billing"}
        first = sendonce("--otel", "otlp", *PUBLISH, cwd=orders, env=env)
        # The standard variable alone turns it on too.
        second = sendonce(*PUBLISH, cwd=orders, env={**env, "OTEL_TRACES_EXPORTER": "otlp"})
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert "duplicates 3" in second.stdout
    calls = collected.named("send_many orders")
    assert len(calls) == 2
    assert [c.attributes["sendonce.duplicates"] for c in calls] == [0, 3]
    assert {c.resource["service.name"] for c in calls} == {"billing"}
    [transfer] = [s for s in collected.named("send orders") if s.trace_id == calls[0].trace_id]
    assert transfer.parent_span_id == calls[0].span_id
    assert transfer.attributes["messaging.batch.message_count"] == 3
    assert collected.outcomes() == {"sent": 3, "duplicate": 3}


def test_without_the_sdk_the_command_says_what_to_install(orders: Path) -> None:
    done = sendonce("--otel", "console", *PUBLISH, cwd=orders, blocked="opentelemetry.sdk")
    assert done.returncode == 2
    assert "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http" in done.stderr
    assert "Traceback" not in done.stderr
    with LocalBackend(orders / "broker.db") as broker:
        assert broker.count("orders") == 0  # refused before anything was sent


def test_an_exporter_sendonce_does_not_set_up_is_refused_by_name(orders: Path) -> None:
    done = sendonce(*PUBLISH, cwd=orders, env={"OTEL_TRACES_EXPORTER": "zipkin"})
    assert done.returncode == 2
    assert "OTEL_TRACES_EXPORTER='zipkin'" in done.stderr and "Traceback" not in done.stderr
