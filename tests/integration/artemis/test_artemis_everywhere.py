"""Everywhere a Service Bus url works, an ``amqp://`` url works (issue 29 item 4): the
asyncio sender, ``sendonce publish --to amqp://...`` (with the ledger), the sample.
Spark is in tests/integration/spark/test_spark_artemis.py.

What the broker holds is read with a hand-written proton receiver (``artemis.raw``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from artemis.faultproxy import FaultProxy
from artemis.raw import drain
from sendonce import EntityProfile, Message, RetryPolicy, aio
from sendonce.cli import main

ROOT = Path(__file__).resolve().parents[3]
RETRY = RetryPolicy(max_attempts=5, initial_backoff=0.05, max_backoff=0.5, attempt_timeout=20)


def test_the_aio_sender_sends_to_artemis_with_transfers_side_by_side_through_a_cut(
    artemis_broker, artemis_address
):
    messages = [
        Message(f"body {i}", message_id=f"order-{i}", partition_key=f"k{i % 16}")
        for i in range(400)
    ]

    async def publish(url: str) -> tuple[int, int, object]:
        backend = aio.connect(url)
        assert isinstance(backend, aio.ThreadedBackend)
        async with (
            backend,
            aio.IdempotentSender(
                backend,
                EntityProfile(artemis_address, id_cache_size=20_000),
                retry=RETRY,
                max_batch_messages=5,
            ) as sender,
        ):
            report = await sender.send_many(messages)
            return sender.max_in_flight, report.sent, report

    with FaultProxy("127.0.0.1", artemis_broker.port) as proxy:
        proxy.cut_after(b"order-200", settle=0.5)  # a transfer stored, its answer lost
        in_flight, sent, _ = asyncio.run(publish(artemis_broker.url(port=proxy.port)))
        assert proxy.fired.is_set()
    assert in_flight == 16 and sent == 400
    ids = [m.id for m in drain(artemis_broker.url(), artemis_address)]
    assert sorted(ids) == sorted(m.message_id for m in messages) and len(ids) == 400


def test_publish_to_an_amqp_url_with_the_ledger_sends_each_record_once(
    artemis_broker, artemis_address, tmp_path: Path
):
    records = tmp_path / "orders.jsonl"
    records.write_text("".join(json.dumps({"id": i, "total": i * 2}) + "\n" for i in range(50)))
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = [
        "publish",
        str(records),
        "--to",
        artemis_broker.url(),
        "--entity",
        artemis_address,
        "--id",
        "order-{id}",
        "--id-cache-size",
        "20000",  # the address does not exist yet: the first send creates it
        "--ledger",
        ledger,
        "--create-ledger",
        "--no-progress",
        "--json",
    ]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["sent"] == 50
    again = CliRunner().invoke(main, [a for a in args if a != "--create-ledger"])
    assert again.exit_code == 0, again.output
    assert (json.loads(again.stdout)["sent"], json.loads(again.stdout)["from_ledger"]) == (0, 50)
    # Described from the broker now that the address exists, no ledger: the broker drops all.
    third = CliRunner().invoke(main, [*args[:8], "--no-progress", "--json"])
    assert third.exit_code == 0, third.output
    ids = [m.id for m in drain(artemis_broker.url(), artemis_address)]
    assert sorted(ids) == sorted(f"order-{i}" for i in range(50)) and len(ids) == 50


def test_publish_user_errors_on_an_amqp_url_print_no_traceback_and_no_password(
    artemis_broker, artemis_address, tmp_path: Path
):
    records = tmp_path / "orders.jsonl"
    records.write_text('{"id": 1}\n')
    secret = "wrong-secret-pw"
    base = ["publish", str(records), "--entity", artemis_address, "--id", "o-{id}"]
    missing = [*base[:3], f"{artemis_address}-missing", *base[4:]]
    runs = {
        "password": [*base, "--to", artemis_broker.url(password=secret), "--no-progress"],
        "address": [*missing, "--to", artemis_broker.url(), "--no-progress"],
        "url": [*base, "--to", f"amqp://u:{secret}@127.0.0.1:5672/path", "--no-progress"],
    }
    for what, args in runs.items():
        done = CliRunner().invoke(main, args)
        assert done.exit_code == 2, (what, done.output)
        assert "Traceback" not in done.output and secret not in done.output, what
        assert done.output.startswith("Error: "), (what, done.output)
    assert drain(artemis_broker.url(), artemis_address) == []


def test_the_sample_publishes_each_order_once_even_when_run_twice(
    artemis_broker, artemis_address, tmp_path: Path
):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ARTEMIS_")},
        "ARTEMIS_URL": artemis_broker.url(),
        "ARTEMIS_ADDRESS": artemis_address,
        "ARTEMIS_LEDGER": f"sqlite:///{tmp_path / 'ledger.db'}",
    }
    sample = str(ROOT / "samples" / "artemis_publish.py")
    runs = [
        subprocess.run(
            [sys.executable, sample], env=env, capture_output=True, text=True, timeout=120
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert "sent 3, from the ledger 0" in runs[0].stdout
    assert "sent 0, from the ledger 3" in runs[1].stdout
    assert artemis_broker.password not in runs[0].stdout + runs[0].stderr
    ids = [m.id for m in drain(artemis_broker.url(), artemis_address)]
    assert sorted(ids) == ["12345.2017/payment", "12346.2017/payment", "12347.2017/payment"]
