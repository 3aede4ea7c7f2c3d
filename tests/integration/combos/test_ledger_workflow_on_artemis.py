"""The ledger's operator workflow with an ``amqp://`` broker, as docs/cli.md tells a user to
run it: ``publish --to amqp://... --ledger ... --create-ledger``, the re-run, a key a crashed
producer never confirmed (in doubt at once on an id cache), ``ledger in-doubt`` and
``reconcile`` (which cannot read Artemis: it says so, exit 2, no traceback), and the advice
each prints, which must name what works on Artemis (browse the queue, confirm or release),
not ``reconcile``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from artemis.broker import SEND_ONLY_PASSWORD
from artemis.raw import browse_ids
from sendonce import MessageSpec
from sendonce.cli import main
from sendonce.ledger import Key, Ledger, body_digest

pytestmark = [pytest.mark.artemis, pytest.mark.timeout(180)]


def run(*args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(main, list(args))
    assert "Traceback" not in done.output, done.output
    return done.exit_code, done.stdout, done.stderr


def test_publish_reruns_and_the_doubt_commands_on_an_artemis_address(
    artemis_broker, artemis_address: str, tmp_path: Path
) -> None:
    url, ledger = artemis_broker.url(), str(tmp_path / "ledger.db")
    records = tmp_path / "orders.jsonl"
    records.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(30)))
    publish = ["publish", str(records), "--to", url, "--entity", artemis_address]
    publish += ["--id", "order-{id}", "--ledger", ledger, "--no-progress"]
    code, out, err = run(*publish, "--id-cache-size", "20000", "--create-ledger")
    assert code == 0 and "sent 30" in out, err
    code, out, err = run(*publish)
    assert code == 0 and "sent 0, duplicates 30 (30 skipped" in out, err

    # A producer crashed after writing the intent of order 30 (and maybe sending it).
    crashed = MessageSpec("order-{id}").to_message({"id": 30})
    with Ledger(f"sqlite://{ledger}") as opened:
        opened.store.record_intents(
            artemis_address,
            [Key(crashed.message_id)],
            [body_digest(crashed)],
            first_attempt=datetime.now(UTC) - timedelta(hours=1),
            owner="crashed",
        )
    records.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(32)))
    code, out, err = run(*publish)
    assert code == 1 and "sent 1, duplicates 30" in out and "failed 1" in out
    assert "browse the address's queues" in err and "ledger reconcile" not in err
    assert artemis_broker.password not in out + err

    code, out, err = run("ledger", "in-doubt", ledger, "--entity", artemis_address, "--broker", url)
    assert code == 0 and "1 key(s) in doubt" in out and "id cache of the last 20000" in out
    assert "browse the address's queues" in err and "ledger reconcile" not in err
    # A user who may send but not manage the broker: told to leave --broker out.
    send_only = artemis_broker.send_only_url()
    code, out, err = run(
        "ledger", "in-doubt", ledger, "--entity", artemis_address, "--broker", send_only
    )
    assert code == 2 and "leave --broker out" in err and "--window" not in err
    assert SEND_ONLY_PASSWORD not in out + err
    code, out, err = run("ledger", "in-doubt", ledger, "--entity", artemis_address)
    assert code == 0 and "'order-30'" in out
    code, out, err = run(
        "ledger", "reconcile", ledger, "--entity", artemis_address, "--broker", url, "--apply"
    )
    assert code == 2 and "cannot read an Artemis broker" in err

    # The operator browses the queue: order 30 is not there. Released, the next run sends it.
    assert "order-30" not in browse_ids(url, artemis_address)
    code, out, err = run(
        "ledger", "release", ledger, "--entity", artemis_address, "--id", "order-30"
    )
    assert code == 0, out + err
    code, out, err = run(*publish)
    assert code == 0 and "sent 1, duplicates 31" in out, err
    ids = browse_ids(url, artemis_address)
    assert sorted(ids) == sorted(f"order-{i}" for i in range(32)) and len(ids) == 32
