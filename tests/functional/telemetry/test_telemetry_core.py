"""The telemetry core (``sendonce.telemetry._core``) is the switch every feature follows:
providers chosen through the public ``sendonce.telemetry.use`` reach the sender (its span,
the trace properties of its message), and ``use()`` turns the features off.

It runs in a fresh interpreter, as a user's program would, with no test fixture between.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import sys
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import sendonce.telemetry as telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use(tracer_provider=provider, meter_provider=None)

    from sendonce import EntityProfile, IdempotentSender, Message
    from sendonce.backends import LocalBackend

    with LocalBackend(sys.argv[1]) as broker:
        broker.create_entity(EntityProfile("orders"))
        with IdempotentSender(broker, "orders") as sender:
            sender.send(Message("paid", message_id="order-1"))
        telemetry.use(tracer_provider=None, meter_provider=None)  # off: not traced
        with IdempotentSender(broker, "orders") as sender:
            sender.send(Message("paid", message_id="order-2"))
        props = {m.message_id: dict(m.application_properties or {})
                 for m in broker.receive("orders", max_messages=5)}
    print([s.name for s in exporter.get_finished_spans()])
    print(sorted(props["order-1"]), props["order-2"])
    """
)


def test_the_public_switch_turns_the_senders_telemetry_on_and_off(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "broker.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    spans, properties = done.stdout.splitlines()
    assert spans == "['send orders']"
    assert properties == "['Diagnostic-Id', 'traceparent'] {}"
