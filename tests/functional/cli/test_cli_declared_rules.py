"""Issue 34 items 1, 2, 5, 6 and 10 on the command line, with real broker and ledger files:
a rule declared with the option every command shares (``--no-dedup``), a new ledger for an
entity that holds messages refused whatever its rule, entity names that ignore case, advice
that names only options the command has, and no window words where there is no window.

The Service Bus connection strings here name the emulator on a port nothing listens on:
every refusal tested happens before a connection is made, so nothing can be sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce import IdempotentSender, Message, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.cli import main
from sendonce.ledger import Key, Ledger

ID = "{id}"
NOWHERE = (
    "Endpoint=sb://127.0.0.1:9;SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def records(path: Path, count: int, start: int = 0) -> list[Message]:
    rows = [{"id": f"r{n:04d}", "n": n} for n in range(start, start + count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = MessageSpec(ID)
    return [spec.to_message(r) for r in rows]


def publish(source: Path, entity: str, *extra: str, to: str = "local:broker.db") -> Result:
    return run(
        "publish", str(source), "--to", to, "--entity", entity, "--id", ID, "--no-progress",
        *extra,
    )  # fmt: skip


def stored(entity: str) -> list[str]:
    with LocalBackend("broker.db") as broker:
        return broker.message_ids(entity)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a broker: ``audit`` (no duplicate detection, made with `broker create
    --no-dedup`) and ``orders`` (a 20 s window)."""
    monkeypatch.chdir(tmp_path)
    for created in (
        run("broker", "create", "broker.db", "--entity", "audit", "--no-dedup"),
        run("broker", "create", "broker.db", "--entity", "orders", "--window", "20s"),
    ):
        assert created.exit_code == 0, created.output
    return tmp_path


# -- item 1: --no-dedup on publish and relay; its advice; --id-cache-size for Service Bus ------


def test_publish_declares_no_duplicate_detection_with_no_dedup(here: Path) -> None:
    source = here / "a.jsonl"
    records(source, 30)
    first = publish(source, "audit", "--no-dedup", "--ledger", "l.db", "--create-ledger", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["sent"] == 30
    again = publish(source, "audit", "--no-dedup", "--ledger", "l.db", "--json")
    assert json.loads(again.stdout)["from_ledger"] == 30
    assert sorted(stored("audit")) == [f"r{n:04d}" for n in range(30)]


def test_no_dedup_is_compared_with_the_entity_and_with_the_other_rules(here: Path) -> None:
    source = here / "a.jsonl"
    records(source, 3)
    wrong = publish(source, "orders", "--no-dedup", "--ledger", "l.db", "--create-ledger")
    assert wrong.exit_code == 2
    assert "has duplicate detection on, but the options ask for --no-dedup" in wrong.stderr
    both = publish(source, "audit", "--no-dedup", "--window", "10m", "--ledger", "l.db")
    assert both.exit_code == 2
    assert "--no-dedup and --window declare two different rules" in both.output
    created = publish(
        source, "fresh", "--no-dedup", "--ledger", "l.db", "--create-ledger", "--json"
    )
    assert created.exit_code == 0, created.output
    assert "creating it as a queue with no duplicate detection (--no-dedup)" in created.stderr
    with LocalBackend("broker.db") as broker:
        assert not broker.describe("fresh").duplicate_detection
    assert stored("orders") == [] and stored("audit") == []


@pytest.mark.parametrize("window", ["0", "8d"])
def test_a_declared_window_out_of_range_is_refused_not_replaced(here: Path, window: str) -> None:
    source = here / "a.jsonl"
    records(source, 1)
    result = publish(source, "fresh", "--window", window)
    assert result.exit_code == 2 and "outside the broker's range 20s to 7d" in result.output
    with LocalBackend("broker.db") as broker:
        assert "fresh" not in {p.name for p in broker.entities()}


def test_relay_takes_no_dedup_as_publish_does(here: Path) -> None:
    # Refused before the outbox is opened: nothing listens at that url.
    both = run(
        "relay", "--outbox", "postgresql://nobody@127.0.0.1:9/none", "--to", "local:broker.db",
        "--entity", "audit", "--no-dedup", "--window", "10m", "--drain",
    )  # fmt: skip
    assert both.exit_code == 2
    assert "--no-dedup and --window declare two different rules" in both.output


def test_the_advice_of_a_broker_that_cannot_describe_names_no_dedup(here: Path) -> None:
    source = here / "a.jsonl"
    records(source, 3)
    result = publish(source, "audit", "--ledger", "l.db", "--create-ledger", to=NOWHERE)
    assert result.exit_code == 2, result.output
    assert "declare its profile with --window" in result.stderr
    assert "or with --no-dedup if it has no duplicate detection" in result.stderr


@pytest.mark.parametrize("command", ["publish", "relay"])
def test_id_cache_size_is_refused_for_a_service_bus_connection_string(
    here: Path, command: str
) -> None:
    source = here / "a.jsonl"
    records(source, 3)
    if command == "publish":
        result = publish(source, "audit", "--id-cache-size", "1000", "--json", to=NOWHERE)
        assert json.loads(result.stdout)["sent"] == 0
    else:
        result = run(
            "relay", "--outbox", "postgresql://nobody@127.0.0.1:9/none", "--to", NOWHERE,
            "--entity", "audit", "--id-cache-size", "1000", "--drain",
        )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--id-cache-size" in result.stderr and "--window" in result.stderr
    assert "Service Bus" in result.stderr


# -- item 2: a new ledger for an entity that holds messages, whatever its rule ------------------


def test_a_new_ledger_for_a_windowed_entity_that_holds_messages_is_refused(here: Path) -> None:
    """The issue's day 1 / day 2: 1,000 records on an entity with a 20 s window, then 21 s
    later (the broker's clock set back rather than a sleep) a superset of 1,500 with a new
    ledger. Refused, naming the count and the flag; with the flag, the documented cost."""
    day1 = records(here / "day1.jsonl", 1000)
    then = datetime.now(UTC) - timedelta(seconds=21)
    with LocalBackend("broker.db", clock=lambda: then) as broker:
        with IdempotentSender(broker, "orders") as sender:
            assert sender.send_many(day1).sent == 1000
    day2 = here / "day2.jsonl"
    records(day2, 1500)

    refused = publish(day2, "orders", "--ledger", "l.db", "--create-ledger", "--json")
    assert refused.exit_code == 2, refused.output
    assert "the 1000 message(s) entity 'orders' already holds" in refused.stderr
    assert "20s duplicate-detection window" in refused.stderr
    assert "--accept-held" in refused.stderr
    assert json.loads(refused.stdout)["sent"] == 0
    assert not (here / "l.db").exists() and len(stored("orders")) == 1000

    accepted = publish(
        day2, "orders", "--ledger", "l.db", "--create-ledger", "--accept-held", "--json"
    )
    assert accepted.exit_code == 0, accepted.output
    # As documented: the broker forgot day 1's ids (its window passed), the new ledger never
    # knew them, so they are stored again.
    assert json.loads(accepted.stdout)["sent"] == 1500
    assert len(stored("orders")) == 2500
    rerun = publish(day2, "orders", "--ledger", "l.db", "--json")
    assert json.loads(rerun.stdout)["from_ledger"] == 1500 and len(stored("orders")) == 2500


def test_accept_held_goes_with_create_ledger(here: Path) -> None:
    source = here / "a.jsonl"
    records(source, 1)
    result = publish(source, "orders", "--ledger", "l.db", "--accept-held")
    assert result.exit_code == 2 and "--accept-held goes with --create-ledger" in result.output


# -- item 5: names ignore case ------------------------------------------------------------------


def test_publish_finds_an_entity_whatever_the_case_of_its_name(here: Path) -> None:
    source = here / "o.jsonl"
    records(source, 10)
    plain = publish(source, "ORDERS", "--json")
    assert plain.exit_code == 0, plain.output
    declared = publish(source, "Orders", "--window", "20s", "--json")
    assert declared.exit_code == 0, declared.output
    assert "creating it" not in declared.stderr
    assert json.loads(declared.stdout)["duplicates"] == 10
    differing = publish(source, "ORDERS", "--window", "10m")
    assert differing.exit_code == 2 and "has a 20s duplicate-detection window" in differing.stderr
    with LocalBackend("broker.db") as broker:
        assert sorted(p.name for p in broker.entities()) == ["audit", "orders"]
    assert len(stored("orders")) == 10


# -- item 6: ledger stats --broker names only its own options -----------------------------------


def test_ledger_stats_over_a_broker_that_cannot_describe_advises_its_own_options(
    here: Path,
) -> None:
    spec = MessageSpec(ID)
    message = spec.to_message({"id": "x"})
    with Ledger("sqlite:l.db") as ledger:
        ledger._prepare(
            "audit", [message], [Key("x")], window=timedelta(0), margin=timedelta(seconds=5)
        )
    stats = run("ledger", "stats", "l.db", "--broker", NOWHERE)
    assert stats.exit_code == 2, stats.output
    assert "leave --broker out" in stats.stderr
    assert "declare the rule with" not in stats.stderr and "declare its profile" not in stats.stderr
    doubt = run("ledger", "in-doubt", "l.db", "--entity", "audit", "--broker", NOWHERE)
    assert doubt.exit_code == 2
    assert "declare the rule with --window (or --no-dedup) instead of --broker" in doubt.stderr


# -- item 10: no window words without a window --------------------------------------------------


def test_broker_stats_shows_no_window_for_an_entity_without_one(here: Path) -> None:
    shown = json.loads(run("broker", "stats", "broker.db", "--json").stdout)["entities"]
    audit, orders = shown["audit"]["settings"], shown["orders"]["settings"]
    assert audit["duplicate_detection"] is False and audit["window_seconds"] is None
    assert orders["window_seconds"] == 20.0


def test_the_resend_warning_on_an_entity_without_duplicate_detection_says_no_window(
    here: Path, caplog: pytest.LogCaptureFixture
) -> None:
    messages: Sequence[Message] = records(here / "a.jsonl", 2)
    keys = [Key(m.message_id) for m in messages]
    then = datetime.now(UTC) - timedelta(hours=1)
    with Ledger("sqlite:l.db", clock=lambda: then) as ledger:
        ledger._prepare("audit", messages, keys, window=timedelta(0), margin=timedelta(seconds=5))
    with caplog.at_level(logging.WARNING, logger="sendonce.ledger"):
        with Ledger("sqlite:l.db", in_doubt="resend") as ledger:
            again = ledger._prepare(
                "audit", messages, keys, window=timedelta(0), margin=timedelta(seconds=5)
            )
    assert again.send == [0, 1]
    warnings = [r.getMessage() for r in caplog.records if "resending it" in r.getMessage()]
    assert len(warnings) == 2
    assert all("window" not in w and "nothing says the broker remembers" in w for w in warnings)


# -- item 1, in the library: Ledger(trust_window=False) --------------------------------------


def test_a_ledger_that_does_not_trust_the_window_resends_no_unconfirmed_key(here: Path) -> None:
    """What publish does over a broker that cannot check a declared window: an intent left
    unconfirmed a minute ago, well inside the entity's 10m window, is in doubt at once instead
    of resent, and says why; a trusting ledger resends it (the broker drops any copy)."""
    assert (
        run("broker", "create", "broker.db", "--entity", "tenmin", "--window", "10m").exit_code == 0
    )
    messages = records(here / "a.jsonl", 3)
    keys = [Key(m.message_id) for m in messages]
    then = datetime.now(UTC) - timedelta(minutes=1)
    for name in ("wary.db", "trusting.db"):
        with Ledger(f"sqlite:{name}", clock=lambda: then) as ledger:
            ledger._prepare(
                "tenmin", messages, keys, window=timedelta(minutes=10), margin=timedelta(seconds=5)
            )
    with LocalBackend("broker.db") as broker:
        with Ledger("sqlite:wary.db", trust_window=False) as wary:
            assert wary.options.trust_window is False
            assert wary.options.open(wary.url).trust_window is False
            with IdempotentSender(broker, "tenmin", ledger=wary) as sender:
                report = sender.send_many(messages)
        assert (report.sent, report.failed) == (0, 3)
        assert all(
            "was declared, not read from the broker" in str(f.error) for f in report.failures
        )
        assert broker.message_ids("tenmin") == []
        with Ledger("sqlite:trusting.db") as trusting:
            with IdempotentSender(broker, "tenmin", ledger=trusting) as sender:
                assert sender.send_many(messages).sent == 3
    with pytest.raises(ValueError, match="trust_window"):
        Ledger("sqlite:wary.db", trust_window="no")  # type: ignore[arg-type]
