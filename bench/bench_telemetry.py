"""What OpenTelemetry costs the sender: off (no provider), and on with the SDK.

Each measurement runs in a fresh interpreter (a global provider cannot be unset), in
interleaved rounds, against the same workloads:

- ``send``: ``IdempotentSender.send`` of one message over a backend that does nothing
  (microseconds per call, CPU time): the sender's whole cost per single send;
- ``send_many``: ``send_many`` of ``--messages`` prepared messages to a fresh local broker
  file (messages per second, wall time), as bench/bench_sender.py.

Trees and modes:

- ``before``: the source tree of ``--before`` (a git revision, default the commit before
  the telemetry seam), extracted with ``git archive``: the baseline;
- ``off``: this tree, opentelemetry not imported (no application uses it);
- ``api``: this tree, the opentelemetry API imported and no provider set;
- ``sdk``: this tree, the SDK's tracer provider (batch span processor, an exporter that
  drops everything) and meter provider (a periodic reader every 60 s, same exporter).

Ratios are medians of the rounds divided by ``before``'s.

    python bench/bench_telemetry.py [--rounds 5] [--calls 20000] [--messages 50000] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _smoke import add_smoke, apply_smoke

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "4939ec9"  # main just before the telemetry seam landed

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path

mode, calls, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "api":
    import opentelemetry.trace, opentelemetry.metrics  # imported, no provider set
elif mode == "sdk":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter, MetricExportResult, PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    class DropMetrics(MetricExporter):
        def export(self, metrics_data, timeout_millis=0, **kwargs):
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis=0):
            return True

        def shutdown(self, timeout_millis=0, **kwargs):
            pass

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    reader = PeriodicExportingMetricReader(DropMetrics(), export_interval_millis=60_000)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends import LocalBackend
from sendonce.backends._base import Ack


class Null:
    def describe(self, entity):
        return EntityProfile(entity)

    def send(self, entity, messages, *, timeout, atomic=False):
        return [Ack("accepted") for _ in messages]

    def schedule(self, entity, messages, at, *, timeout):
        return [Ack("accepted") for _ in messages]

    def close(self):
        pass


singles = [Message(b'{"order": %d}' % i, message_id=f"{i}.2017/payment") for i in range(calls)]
with IdempotentSender(Null(), "orders") as sender:
    for m in singles[:1000]:
        sender.send(m)  # warm up
    start = time.process_time()
    for m in singles[1000:]:
        sender.send(m)
    per_send = (time.process_time() - start) / (calls - 1000) * 1e6

batch = [
    Message(f'{{"order_id": {i}, "amount": "{i % 997}.00"}}', message_id=f"{i}.2017/payment")
    for i in range(count)
]
with tempfile.TemporaryDirectory() as tmp, LocalBackend(Path(tmp) / "b.db") as backend:
    profile = EntityProfile("orders")
    backend.create_entity(profile)
    with IdempotentSender(backend, profile) as sender:
        start = time.perf_counter()
        report = sender.send_many(batch)
        elapsed = time.perf_counter() - start
    assert report.sent == count, report
print(json.dumps({"send_us": per_send, "many_per_s": count / elapsed}))
"""


def extract(revision: str, into: Path) -> Path:
    """The ``src`` tree of ``revision`` under ``into`` (git archive)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def run(mode: str, src: Path, calls: int, messages: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src))
    child_mode = "off" if mode == "before" else mode
    out = subprocess.run(
        [sys.executable, "-c", CHILD, child_mode, str(calls), str(messages)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--before", default=BEFORE, help="git revision of the baseline tree")
    parser.add_argument("--modes", default="before,off,api,sdk")
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), rounds=1, calls=1100, messages=200)
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {mode: ROOT / "src" for mode in modes}
        if "before" in modes:
            trees["before"] = extract(args.before, Path(tmp))
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for round_ in range(args.rounds):
            order = modes if round_ % 2 == 0 else modes[::-1]  # interleaved, alternated
            for mode in order:
                runs[mode].append(run(mode, trees[mode], args.calls, args.messages))
    base = runs.get("before") or runs[modes[0]]
    base_send = statistics.median(r["send_us"] for r in base)
    base_many = statistics.median(r["many_per_s"] for r in base)
    print(f"{args.rounds} interleaved rounds; send over a null backend, send_many of "
          f"{args.messages:,} to a local broker file")
    print(f"{'mode':8} {'send us/call':>13} {'ratio':>6} {'send_many msg/s':>16} {'ratio':>6}")
    for mode in modes:
        send = statistics.median(r["send_us"] for r in runs[mode])
        many = statistics.median(r["many_per_s"] for r in runs[mode])
        print(
            f"{mode:8} {send:13.2f} {send / base_send:6.3f} {many:16,.0f} "
            f"{base_many / many:6.3f}"
        )
    print("ratios: time relative to the first mode (above 1: slower)")


if __name__ == "__main__":
    main()
