"""Issue 28 item 5 on both ledger stores: the operator's commands read and resolve a SQLite
file and a PostgreSQL database alike (totals and pages, keys from JSON, the live-producer
guard, reconcile against the local broker), and neither store is created by them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends import LocalBackend
from sendonce.cli import main
from sendonce.ledger import Key, Ledger


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def left(ledger_url: str, entity: str, ids: list[str], age: timedelta) -> None:
    then = datetime.now(UTC) - age
    with Ledger(ledger_url, clock=lambda: then) as ledger:
        for start in range(0, len(ids), 40):
            chunk = ids[start : start + 40]
            ledger._prepare(
                entity,
                [Message(f"body {i}", message_id=i) for i in chunk],
                [Key(i) for i in chunk],
                window=timedelta(0),
                margin=timedelta(seconds=5),
            )


def test_no_ledger_command_creates_a_ledger(ledger_url: str) -> None:
    for args in (
        ["stats"],
        ["in-doubt", "--entity", "e"],
        ["release", "--entity", "e", "--id", "1"],
    ):
        result = run("ledger", args[0], ledger_url, *args[1:], "--json")
        assert result.exit_code == 2, result.output
        report = json.loads(result.stdout)
        assert report["status"] == "error" and "there is no ledger" in report["error"]
        assert "sendonce ledger create" in report["error"]
    made = json.loads(run("ledger", "create", ledger_url, "--json").stdout)
    assert made["created"] is True
    assert json.loads(run("ledger", "create", ledger_url, "--json").stdout)["created"] is False
    assert json.loads(run("ledger", "stats", ledger_url, "--json").stdout)["entities"] == {}


def test_keys_in_doubt_are_paged_and_resolved_from_json_on_either_store(
    ledger_url: str, tmp_path: Path
) -> None:
    ids = [f"k{n:03d}" for n in range(120)]
    left(ledger_url, "Audit", ids[:100], timedelta(hours=1))
    left(ledger_url, "audit", ids[100:], timedelta(seconds=10))  # one entity, any spelling
    page = json.loads(
        run(
            "ledger",
            "in-doubt",
            ledger_url,
            "--entity",
            "AUDIT",
            "--no-dedup",
            "--limit",
            "30",
            "--offset",
            "90",
            "--json",
        ).stdout
    )
    assert (page["in_doubt"], page["shown"], page["more"]) == (120, 30, 0)
    assert [k["message_id"] for k in page["keys"]][:11] == ids[90:101]
    assert [k["may_be_in_flight"] for k in page["keys"]][9:11] == [False, True]
    source = tmp_path / "page.json"
    source.write_text(json.dumps(page))
    refused = run("ledger", "release", ledger_url, "--entity", "audit", "--from", str(source),
                  "--json")  # fmt: skip
    report = json.loads(refused.stdout)
    assert refused.exit_code == 2 and len(report["errors"]) == 20  # the 20 young keys
    assert "--force" in report["advice"][0]
    assert all("may still be sending it" in e for e in report["errors"][:20])
    counts = json.loads(run("ledger", "stats", ledger_url, "--json").stdout)["entities"]
    assert [c["unconfirmed"] for c in counts.values()] == [120]  # nothing changed
    forced = run("ledger", "release", ledger_url, "--entity", "audit", "--from", str(source),
                 "--json", "--force")  # fmt: skip
    assert json.loads(forced.stdout)["count"] == 30
    confirmed = run("ledger", "confirm", ledger_url, "--entity", "audit", "--id", "k000", "--json")
    assert json.loads(confirmed.stdout)["count"] == 1
    # A person's confirmation is not a sign of a live producer: the next key is released.
    assert run("ledger", "release", ledger_url, "--entity", "audit", "--id", "k001").exit_code == 0
    counts = json.loads(run("ledger", "stats", ledger_url, "--json").stdout)["entities"]
    assert [(c["keys"], c["unconfirmed"]) for c in counts.values()] == [(89, 88)]


def test_reconcile_applies_what_the_broker_shows_on_either_store(
    ledger_url: str, tmp_path: Path
) -> None:
    broker_path = tmp_path / "broker.db"
    with LocalBackend(broker_path) as broker:
        broker.create_entity(EntityProfile("audit", duplicate_detection=False))
        with IdempotentSender(broker, "audit", require_duplicate_detection=False) as sender:
            sender.send_many([Message(f"body k{n}", message_id=f"k{n}") for n in range(3)])
    left(ledger_url, "audit", [f"k{n}" for n in range(5)], timedelta(hours=1))
    applied = json.loads(
        run(
            "ledger",
            "reconcile",
            ledger_url,
            "--entity",
            "audit",
            "--broker",
            f"local:{broker_path}",
            "--apply",
            "--release-absent",
            "--json",
        ).stdout
    )
    assert (applied["confirmed"], applied["released"], applied["left"]) == (3, 2, 0)
    with Ledger(ledger_url, create=False) as ledger:
        rows = ledger.lookup("audit", [f"k{n}" for n in range(5)])
    assert sorted(k.message_id for k in rows) == ["k0", "k1", "k2"]
    assert {row.outcome for row in rows.values()} == {"resolved"}


@pytest.mark.postgres
def test_a_postgresql_ledger_that_cannot_be_reached_is_transient(tmp_path: Path) -> None:
    url = "postgresql://me:hunter2@127.0.0.1:1/x?connect_timeout=1&attempts=1"
    for args in (["stats", url], ["in-doubt", url, "--entity", "e"], ["create", url]):
        result = run("ledger", *args, "--json")
        assert result.exit_code == 1, result.output
        assert json.loads(result.stdout)["exit_status"] == 1
        assert "hunter2" not in result.stdout + result.stderr
