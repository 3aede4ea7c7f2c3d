"""The outbox relay traced, and secrets across the combinations users put together.

- A relay to the real Artemis broker with a PostgreSQL ledger in the outbox's database:
  a ``relay {entity}`` span per claimed batch (parent of the sender's calls), the lag and
  rows-pending gauges; and no password (the amqp url's, the PostgreSQL url's) in any span
  attribute, event, metric attribute, log record or repr.
- ``sendonce relay`` to the emulator (the real azure-servicebus client), which cannot
  describe entities (``--window`` declares the profile), with ``--otel console`` and debug
  logs, and the CLI's refusals across the three backends and both databases: the Service
  Bus key, the amqp password and the PostgreSQL password never printed, no traceback, the
  option at fault named, the documented exit status.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from artemis.raw import drain, wait_for
from sendonce import EntityProfile, IdempotentSender, Ledger, Message
from sendonce.backends.local import LocalBackend
from sendonce.cli import main
from sendonce.ledger import Key, body_digest
from sendonce.outbox import Relay, enqueue, install, stats

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

NOW = datetime.now(UTC)
PG_SECRET = "pg-secret-7731"
SB_SECRET = "sb-key-secret-5529"


def with_password(url: str) -> str:
    """The url with a password (the throwaway cluster trusts 127.0.0.1: it is ignored)."""
    return url.replace("postgres@", f"postgres:{PG_SECRET}@", 1)


def committed(outbox: str, entity: str, count: int, keys: int = 4) -> None:
    with psycopg.connect(outbox) as conn:
        enqueue(
            conn,
            [
                Message(f"order {n}", message_id=f"k{n % keys}-{n}", partition_key=f"k{n % keys}")
                for n in range(count)
            ],
            entity=entity,
        )
        conn.commit()


def attributes_and_logs(otel: Any, caplog: pytest.LogCaptureFixture) -> str:
    seen = [f"{k}={v}" for s in otel.spans for k, v in (s.attributes or {}).items()]
    seen += [f"{k}={v}" for s in otel.spans for e in s.events for k, v in e.attributes.items()]
    data = otel.reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    seen += [f"{k}={v}" for k, v in (point.attributes or {}).items()]
    return "\n".join(seen) + caplog.text


@pytest.mark.artemis
def test_a_relay_to_artemis_with_a_postgres_ledger_is_traced_and_shows_no_secret(
    artemis_broker, artemis_address: str, outbox_url: str, otel: Any, caplog
) -> None:
    caplog.set_level(logging.DEBUG, logger="sendonce")
    outbox = with_password(outbox_url)  # the ledger lives in the outbox's database
    install(outbox)
    committed(outbox, artemis_address, 40)
    with psycopg.connect(outbox) as conn:
        conflict = Message("another body", message_id="k0-0", partition_key="k0")
        held = Message("held", message_id="held-1", partition_key="held")
        enqueue(conn, [conflict, held], entity=artemis_address)  # the first: moved aside
        conn.commit()
    with psycopg.connect(outbox, autocommit=True) as conn:
        # Another relay holds this row for an hour: it stays pending, and ages.
        conn.execute(
            "UPDATE sendonce_outbox SET lease_owner = 'another relay', "
            "lease_until = now() + interval '1 hour', enqueued_at = now() - interval '1 minute' "
            "WHERE message_id = 'held-1'"
        )
    profile = EntityProfile(artemis_address, id_cache_size=20_000)
    with Relay(
        outbox,
        artemis_broker.url(),
        [profile],
        ledger=outbox,
        poll_interval=0.2,
        prune_interval=0.2,
        batch_size=8,
        per_key=4,
    ) as relay:
        assert artemis_broker.password not in repr(relay) and PG_SECRET not in repr(relay)
        runner = threading.Thread(target=relay.run)
        runner.start()
        try:
            wait_for(lambda: stats(outbox)[0].published == 40, what="40 rows published")
            wait_for(lambda: stats(outbox)[0].dead == 1, what="the conflict moved aside")
            wait_for(
                lambda: [p.value for _, p in otel.points("sendonce.outbox.rows_pending")] == [1],
                what="the pending gauge to say 1 (the held row)",
            )
        finally:
            relay.stop()
            runner.join(timeout=60)
        assert not runner.is_alive()

    batches = otel.named(f"relay {artemis_address}")
    assert batches and all(b.attributes["messaging.system"] == "activemq" for b in batches)
    assert sum(b.attributes["sendonce.published"] for b in batches) == 40
    assert sum(b.attributes.get("sendonce.dead", 0) for b in batches) == 1
    for batch in batches:
        assert batch.attributes["sendonce.rows"] <= 8 * 4  # keys per round, rows per key
        calls = [c.name for c in otel.children(batch)]
        assert f"send_many {artemis_address}" in calls
    stores = {
        s.attributes["sendonce.ledger.store"] for s in otel.spans if s.name.startswith("ledger")
    }
    assert stores == {"postgres"}
    (lag,) = [p.value for _, p in otel.points("sendonce.outbox.lag")]
    assert lag >= 60  # the held row's age
    everything = attributes_and_logs(otel, caplog)
    assert artemis_broker.password not in everything and PG_SECRET not in everything
    with Ledger(outbox) as ledger:
        assert PG_SECRET not in repr(ledger)  # (its url keeps it: other processes open it)
    with IdempotentSender(artemis_broker.url(), profile) as sender:
        assert artemis_broker.password not in repr(sender)
    ids = [str(m.id) for m in drain(artemis_broker.url(), artemis_address)]
    assert len(ids) == len(set(ids)) == 40


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """Exit status, everything printed, and stdout alone."""
    done = CliRunner().invoke(main, list(args), input=stdin)
    return done.exit_code, done.output, done.stdout


@pytest.mark.artemis
@pytest.mark.emulator
def test_no_cli_refusal_or_export_shows_a_key_or_password(
    artemis_broker, outbox_url: str, emulator, broker_path: Path, tmp_path: Path
) -> None:
    outbox = with_password(outbox_url)
    install(outbox)
    committed(outbox, "orders", 12)
    sb = emulator.connection_string.replace("SAS_KEY_VALUE", SB_SECRET)
    amqp_secret = artemis_broker.password

    # The emulator describes no entity: the relay declares its profile, as publish does.
    code, out, _ = run("relay", "--outbox", outbox, "--to", sb, "--entity", "orders", "--drain")
    assert code == 2 and "--window" in out and "Traceback" not in out
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OTEL_SERVICE_NAME": "relay-test"}
    exported = subprocess.run(
        [
            sys.executable,
            "-m",
            "sendonce.cli",
            "--otel",
            "console",
            "--log-level",
            "debug",
            "relay",
            "--outbox",
            outbox,
            "--to",
            sb,
            "--entity",
            "orders",
            "--window",
            "10m",
            "--drain",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads(exported.stdout)["published"] == 12
    assert '"name": "relay orders"' in exported.stderr and '"servicebus"' in exported.stderr
    shown = exported.stdout + exported.stderr
    assert SB_SECRET not in shown and PG_SECRET not in shown
    with LocalBackend(broker_path) as broker:
        assert len(broker.message_ids("orders")) == 12

    closed = "postgresql://postgres:" + PG_SECRET + "@127.0.0.1:1/db?connect_timeout=2"
    wrong_amqp = artemis_broker.url(password="wrong-" + amqp_secret)
    ledger = str(tmp_path / "ledger.db")
    refusals = {
        # (args, exit status, the option named)
        "amqp password": (
            ["relay", "--outbox", outbox, "--to", wrong_amqp, "--entity", "orders"],
            2,
            "--to:",
        ),
        "outbox url option": (
            [
                "relay",
                "--outbox",
                outbox + "?bogus=1",
                "--to",
                sb,
                "--entity",
                "orders",
                "--window",
                "10m",
            ],
            2,
            "--outbox:",
        ),
        "outbox down": (
            ["relay", "--outbox", closed, "--to", sb, "--entity", "orders", "--window", "10m"],
            1,
            "",
        ),
        "missing ledger": (
            [
                "relay",
                "--outbox",
                outbox,
                "--to",
                sb,
                "--entity",
                "orders",
                "--window",
                "10m",
                "--ledger",
                ledger,
            ],
            2,
            "--ledger:",
        ),
        "ledger down": (["ledger", "stats", closed], 1, ""),
        "publish ledger down": (
            [
                "publish",
                "-",
                "--to",
                sb,
                "--entity",
                "orders",
                "--window",
                "10m",
                "--id",
                "{id}",
                "--ledger",
                closed,
                "--no-progress",
            ],
            1,
            "",
        ),
        "in-doubt amqp password": (
            ["ledger", "in-doubt", outbox, "--entity", "orders", "--broker", wrong_amqp],
            2,
            "--broker:",
        ),
        "reconcile artemis": (
            ["ledger", "reconcile", outbox, "--entity", "orders", "--broker", artemis_broker.url()],
            2,
            "cannot read an Artemis broker",
        ),
        "reconcile sb key": (
            ["ledger", "reconcile", closed, "--entity", "orders", "--broker", sb],
            1,
            "",
        ),
        "outbox stats down": (["outbox", "stats", closed], 1, ""),
    }
    assert run("ledger", "create", outbox)[0] == 0
    with Ledger(outbox) as kept:  # a key in doubt, for the ledger commands to look at
        left = Message("left", message_id="left-1")
        kept.store.record_intents(
            "orders", [Key("left-1")], [body_digest(left)], first_attempt=NOW, owner="gone"
        )
    for what, (args, status, named) in refusals.items():
        for as_json in (False, True):
            code, out, stdout = run(*args, *(["--json"] if as_json else []), stdin='{"id": 1}\n')
            assert code == status, (what, out)
            assert "Traceback" not in out, (what, out)
            for secret in (SB_SECRET, PG_SECRET, amqp_secret, "wrong-" + amqp_secret):
                assert secret not in out, (what, secret, out)
            assert named in out, (what, out)
            if as_json:
                assert json.loads(stdout)["exit_status"] == status, (what, out)
    assert not Path(ledger).exists()
