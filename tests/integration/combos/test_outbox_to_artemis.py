"""The transactional outbox relayed to the real Artemis broker, as a user runs it: ``sendonce
relay --to amqp://...`` after a relay died between the broker's accept and the row's mark,
with and without a ledger, and the operator's way out of doubt when the ledger holds keys it
never saw confirmed (Artemis' id cache has no time window: such a key is in doubt at once).

What the broker holds is read with a hand-written proton receiver, not through sendonce.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from artemis.faultproxy import FaultProxy
from artemis.raw import browse_ids, drain, message_count, wait_for
from sendonce import EntityProfile, Message, RetryPolicy
from sendonce.cli import main
from sendonce.outbox import Relay, dead_rows, enqueue, install, stats

pytestmark = [pytest.mark.artemis, pytest.mark.postgres, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent
KEYS = 6


def committed(outbox: str, entity: str, count: int) -> list[Message]:
    """``count`` orders over ``KEYS`` customers, each its own transaction, in order."""
    batch = [
        Message(f"order {n}", message_id=f"c{n % KEYS}-{n}", partition_key=f"c{n % KEYS}")
        for n in range(count)
    ]
    with psycopg.connect(outbox) as conn:
        for message in batch:
            enqueue(conn, [message], entity=entity)
            conn.commit()
    return batch


def cli(*args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(main, list(args))
    assert "Traceback" not in done.output, done.output
    return done.exit_code, done.stdout, done.stderr


def crash_a_relay(outbox: str, broker_url: str, entity: str, ledger: str | None = None) -> None:
    """A relay that dies right after the broker accepted its first transfer; then its
    leases run out."""
    command = [sys.executable, str(HERE / "crashing_relay.py"), outbox, broker_url, entity]
    command += ["20000", *([ledger] if ledger else [])]
    died = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert died.returncode == 9, died.stderr
    (row,) = stats(outbox)
    assert row.published == 0  # it died before marking anything
    wait_for(lambda: stats(outbox)[0].leased == 0, what="the dead relay's leases to expire")


def in_commit_order_per_key(ids: list[str]) -> bool:
    seen: dict[str, list[int]] = defaultdict(list)
    for message_id in ids:
        key, number = message_id.split("-")
        seen[key].append(int(number))
    return all(numbers == sorted(numbers) for numbers in seen.values())


def test_a_relay_killed_between_the_brokers_accept_and_the_mark_publishes_each_row_once(
    artemis_broker, artemis_address: str, outbox_url: str
) -> None:
    install(outbox_url)
    batch = committed(outbox_url, artemis_address, 60)
    crash_a_relay(outbox_url, artemis_broker.url(), artemis_address)
    assert message_count(artemis_broker.url(), artemis_address) >= 1  # stored, never marked

    code, out, err = cli(
        "relay",
        "--outbox",
        outbox_url,
        "--to",
        artemis_broker.url(),
        "--entity",
        artemis_address,
        "--id-cache-size",  # declared, as a user without the manage permission must
        "20000",
        "--drain",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["published"] == 60  # a resent copy is accepted (and dropped)
    ids = [str(m.id) for m in drain(artemis_broker.url(), artemis_address)]
    assert sorted(ids) == sorted(m.message_id for m in batch) and len(ids) == 60
    assert in_commit_order_per_key(ids)


def test_with_a_ledger_the_rows_a_dead_relay_left_in_doubt_are_moved_aside_then_settled(
    artemis_broker, artemis_address: str, outbox_url: str, tmp_path: Path
) -> None:
    """The dead relay wrote its intents and never its confirmations. On an id cache the
    ledger cannot resend inside a window, so the next relay moves those rows aside (it used
    to release them every round, for ever, holding their keys back). The operator reads the
    keys in doubt, browses the queue, confirms what it holds, releases the rest, requeues:
    every order on the broker once, in commit order per customer."""
    url, ledger = artemis_broker.url(), str(tmp_path / "ledger.db")
    assert cli("ledger", "create", ledger)[0] == 0
    install(outbox_url)
    batch = committed(outbox_url, artemis_address, 60)
    crash_a_relay(outbox_url, url, artemis_address, f"sqlite://{ledger}")
    relay = ("relay", "--outbox", outbox_url, "--to", url, "--entity", artemis_address)
    relay += ("--ledger", ledger, "--drain", "--json")

    code, out, err = cli(*relay)
    assert code == 0, err
    summary = json.loads(out)
    in_doubt = {row.message_id for row in dead_rows(outbox_url)}
    assert summary["dead_reasons"] == {"in-doubt": len(in_doubt)} and in_doubt
    assert summary["published"] + len(in_doubt) == 60
    assert (stats(outbox_url)[0].pending, stats(outbox_url)[0].leased) == (0, 0)

    # The operator: which keys, what the broker holds, then confirm or release each.
    code, out, _ = cli("ledger", "in-doubt", ledger, "--entity", artemis_address, "--all")
    assert code == 0 and f"{len(in_doubt)} key(s) unconfirmed" in out
    code, out, err = cli(
        "ledger", "in-doubt", ledger, "--entity", artemis_address, "--broker", url, "--all"
    )
    assert code == 0 and "id cache" in out and "browse the address's queues" in err
    code, out, err = cli(
        "ledger", "reconcile", ledger, "--entity", artemis_address, "--broker", url, "--json"
    )
    refusal = json.loads(out)
    assert (code, refusal["status"], refusal["exit_status"]) == (2, "error", 2)
    assert "cannot read an Artemis broker" in refusal["error"]
    assert artemis_broker.password not in out + err
    held = set(browse_ids(url, artemis_address)) & in_doubt
    (tmp_path / "held.txt").write_text("".join(f"{i}\n" for i in sorted(held)))
    (tmp_path / "absent.txt").write_text("".join(f"{i}\n" for i in sorted(in_doubt - held)))
    for resolution, listed in (("confirm", "held.txt"), ("release", "absent.txt")):
        if (tmp_path / listed).read_text():
            code, out, err = cli(
                "ledger", resolution, ledger, "--entity", artemis_address,
                "--from", str(tmp_path / listed), "--force",
            )  # fmt: skip
            assert code == 0, out + err
    code, out, _ = cli("ledger", "in-doubt", ledger, "--entity", artemis_address)
    assert code == 0 and "no keys" in out
    code, out, err = cli("outbox", "requeue", outbox_url, "--entity", artemis_address, "--all")
    assert code == 0, err

    code, out, err = cli(*relay)
    assert code == 0, err
    assert (json.loads(out)["published"], json.loads(out)["dead"]) == (len(in_doubt), 0)
    ids = [str(m.id) for m in drain(url, artemis_address)]
    assert sorted(ids) == sorted(m.message_id for m in batch) and len(ids) == 60
    assert in_commit_order_per_key(ids)


def test_without_a_ledger_a_row_the_backend_will_not_resend_is_moved_aside_not_retried(
    artemis_broker, artemis_address: str, outbox_url: str
) -> None:
    """An id cache of 3 ("small-cache.#"): the transfer's answer is lost after the broker
    stored it; by the next round a resend reaches back farther than the backend allows, so
    it refuses (in doubt, not resent). That never changes: the row is moved aside, where it
    used to be released every round and block its key."""
    address = f"small-cache.{artemis_address}"
    install(outbox_url)
    committed(outbox_url, address, 1)
    with FaultProxy("127.0.0.1", artemis_broker.port) as proxy:
        proxy.cut_after(b"order 0", settle=0.5)
        once = RetryPolicy(max_attempts=1, attempt_timeout=20)
        with Relay(
            outbox_url,
            artemis_broker.url(port=proxy.port),
            [EntityProfile(address, id_cache_size=3)],
            retry=once,
        ) as relay:
            first = relay.drain()  # in doubt after its one attempt: released, kept
            second = relay.drain()
    assert proxy.fired.is_set()
    assert (first.published, first.dead, first.released) == (0, 0, 1)
    assert (second.published, second.dead_reasons) == (0, {"in-doubt": 1})
    (dead,) = dead_rows(outbox_url)
    assert dead.message_id == "c0-0" and "not resent" in dead.error
    assert [str(m.id) for m in drain(artemis_broker.url(), address)] == ["c0-0"]


def test_sigterm_interrupts_transfers_waiting_on_artemis_after_the_stop_timeout(
    artemis_broker, artemis_address: str, outbox_url: str
) -> None:
    """The broker stops answering (its answers are swallowed): the relay's transfers wait.
    SIGTERM, then ``--stop-timeout 1s``: the waiting transfers are interrupted, the leases
    released, exit 0, long before the transfers' own timeouts (3 attempts of 10 s) would
    end. The interruption used to be a flag the blocked main thread saw only then."""
    install(outbox_url)
    batch = committed(outbox_url, artemis_address, 20)
    with FaultProxy("127.0.0.1", artemis_broker.port) as proxy:
        proxy.cut_after(b"order 0", settle=None)
        command = [sys.executable, "-m", "sendonce.cli", "relay", "--outbox", outbox_url]
        command += ["--to", artemis_broker.url(port=proxy.port), "--entity", artemis_address]
        command += ["--id-cache-size", "20000", "--stop-timeout", "1s", "--json"]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            wait_for(proxy.fired.is_set, what="the relay's first transfer")
            wait_for(lambda: stats(outbox_url)[0].leased > 0, what="rows claimed")
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=20)  # the transfers alone would take 30 s
        finally:
            process.kill()
            proxy.cut()
    assert process.returncode == 0, err
    assert json.loads(out)["status"] == "ok" and "Traceback" not in err
    (row,) = stats(outbox_url)
    assert (row.leased, row.published) == (0, 0)  # released: the broker never answered
    code, out, err = cli(
        "relay", "--outbox", outbox_url, "--to", artemis_broker.url(),
        "--entity", artemis_address, "--drain", "--json",
    )  # fmt: skip
    assert code == 0 and json.loads(out)["published"] == 20, err
    ids = [str(m.id) for m in drain(artemis_broker.url(), artemis_address)]
    assert sorted(ids) == sorted(m.message_id for m in batch) and len(ids) == 20
