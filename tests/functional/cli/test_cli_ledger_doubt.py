"""Issue 28 items 4-7 on the command line, with real broker and ledger files: a new ledger is
a decision, the operator's way out of doubt, advice in the entity's own rule and CLI words,
one exit-code table and the documented JSON shapes."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce import EntityProfile, IdempotentSender, Message, MessageSpec
from sendonce.backends.local import LocalBackend
from sendonce.cli import main
from sendonce.ledger import Key, Ledger

ID = "{id}"


def run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin, catch_exceptions=False)


def records(path: Path, count: int, prefix: str = "r") -> list[Message]:
    rows = [{"id": f"{prefix}{n:03d}", "n": n} for n in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = MessageSpec(ID)
    return [spec.to_message(r) for r in rows]


def publish(source: Path, entity: str, *extra: str) -> Result:
    return run(
        "publish", str(source), "--to", "local:broker.db", "--entity", entity, "--id", ID,
        "--no-progress", *extra,
    )  # fmt: skip


def intents(
    ledger: str,
    entity: str,
    messages: Sequence[Message],
    *,
    age: timedelta,
    keys: Sequence[Key] | None = None,
) -> None:
    """Unconfirmed intents of ``messages`` written ``age`` ago, as a stopped producer left them."""
    then = datetime.now(UTC) - age
    with Ledger(ledger, clock=lambda: then) as opened:
        opened.prepare(
            entity,
            list(messages),
            list(keys) if keys is not None else [Key(m.message_id) for m in messages],
            window=timedelta(0),
            margin=timedelta(seconds=5),
        )


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a broker: ``audit`` (no duplicate detection), ``orders`` (10m window),
    ``cached`` (an id cache of 100, persisted), ``parts`` (partitioned), ``events`` (a topic
    with subscriptions a and b)."""
    monkeypatch.chdir(tmp_path)
    with LocalBackend(tmp_path / "broker.db") as broker:
        broker.create_entity(EntityProfile("audit", duplicate_detection=False))
        broker.create_entity(EntityProfile("orders"))
        broker.create_entity(EntityProfile("cached", id_cache_size=100))
        broker.create_entity(EntityProfile("parts", partitioned=True))
        broker.create_entity(EntityProfile("events", kind="topic"))
        broker.create_subscription("events", "a")
        broker.create_subscription("events", "b")
    return tmp_path


def stored(entity: str) -> list[str]:
    with LocalBackend("broker.db") as broker:
        return broker.message_ids(entity)


def send(entity: str, messages: Sequence[Message]) -> None:
    with LocalBackend("broker.db") as broker:
        with IdempotentSender(broker, entity, require_duplicate_detection=False) as sender:
            assert sender.send_many(list(messages)).failed == 0


# -- item 4: a new ledger is a decision ------------------------------------------------------


def test_a_mistyped_ledger_path_sends_nothing_and_names_the_path_and_the_flag(here: Path):
    """The issue's case: sqlite:///ledger.db (meant: the file here) on an entity without
    duplicate detection that already holds every order."""
    if os.path.exists("/ledger.db"):
        pytest.skip("/ledger.db exists on this machine: the mistyped path is taken")
    source = here / "orders.jsonl"
    records(source, 20)
    first = publish(source, "audit", "--ledger", "sqlite:ledger.db", "--create-ledger")
    assert first.exit_code == 0, first.output
    assert f"created a new, empty ledger: {here / 'ledger.db'}" in first.stderr
    try:
        typo = publish(source, "audit", "--ledger", "sqlite:///ledger.db")
        assert typo.exit_code == 2, typo.output
        assert "there is no ledger file '/ledger.db'" in typo.stderr
        assert "--create-ledger" in typo.stderr and "Traceback" not in typo.stderr
        as_json = publish(source, "audit", "--ledger", "sqlite:///ledger.db", "--json")
        report = json.loads(as_json.stdout)
        assert (report["status"], report["sent"], report["exit_status"]) == ("error", 0, 2)
        # Even told to create one, a new ledger is refused for an entity holding messages.
        told = publish(source, "audit", "--ledger", "sqlite:///ledger.db", "--create-ledger")
        assert told.exit_code == 2, told.output
        assert "already holds" in told.stderr and "sendonce ledger create /ledger.db" in told.stderr
        assert not os.path.exists("/ledger.db") and not os.path.exists("/ledger.db.lock")
    finally:
        for leftover in ("/ledger.db", "/ledger.db.lock"):
            if os.path.exists(leftover) and not first.exit_code:
                os.unlink(leftover)
    assert sorted(stored("audit")) == [f"r{n:03d}" for n in range(20)]  # each exactly once


def test_a_new_ledger_is_created_where_nothing_would_be_sent_twice(here: Path):
    source = here / "o.jsonl"
    messages = records(source, 5)
    send("orders", messages[:2])
    # Issue 34 item 2: a window does not make a new ledger safe (the broker forgets its
    # ids after it), so an entity that holds messages needs --accept-held there too.
    held = publish(source, "orders", "--ledger", "w.db", "--create-ledger", "--json")
    assert held.exit_code == 2 and not (here / "w.db").exists()
    assert "the 2 message(s) entity 'orders' already holds" in held.stderr
    assert "--accept-held" in held.stderr
    on_window = publish(
        source, "orders", "--ledger", "w.db", "--create-ledger", "--accept-held", "--json"
    )
    # Inside its window the broker still remembers the two and drops their copies.
    assert json.loads(on_window.stdout)["sent"] == 3
    assert f"created a new, empty ledger: {here / 'w.db'} (--create-ledger)" in on_window.stderr
    again = publish(source, "orders", "--ledger", "w.db", "--create-ledger", "--json")
    assert json.loads(again.stdout)["from_ledger"] == 5 and "created" not in again.stderr
    assert run("ledger", "create", "w.db").stdout.startswith("the ledger exists already")


def test_ledger_create_is_the_decision_to_start_a_ledger_for_an_entity_with_messages(here: Path):
    source = here / "o.jsonl"
    messages = records(source, 4)
    send("audit", messages[:1])
    refused = publish(source, "audit", "--ledger", "new.db", "--create-ledger")
    assert refused.exit_code == 2 and not (here / "new.db").exists()
    made = run("ledger", "create", "new.db", "--json")
    assert json.loads(made.stdout) == {
        "status": "ok",
        "created": True,
        "path": str(here / "new.db"),
        "exit_status": 0,
    }
    sent = publish(source, "audit", "--ledger", "new.db", "--json")
    assert json.loads(sent.stdout)["sent"] == 4  # the user decided: r000 is there twice
    assert sorted(stored("audit")) == ["r000", "r000", "r001", "r002", "r003"]


def test_a_ledger_is_named_the_same_way_by_publish_and_the_ledger_commands(here: Path):
    source = here / "o.jsonl"
    records(source, 3)
    assert publish(source, "orders", "--ledger", "l.db", "--create-ledger").exit_code == 0
    for name in ("l.db", str(here / "l.db"), "sqlite:l.db", f"sqlite://{here / 'l.db'}"):
        assert (
            json.loads(run("ledger", "stats", name, "--json").stdout)["entities"]["orders"]["keys"]
            == 3
        )
        again = publish(source, "orders", "--ledger", name, "--json")
        assert json.loads(again.stdout)["from_ledger"] == 3, again.output
    for bad in ("mysql://x/y", "sqlite://host/l.db"):
        for result in (run("ledger", "stats", bad), publish(source, "orders", "--ledger", bad)):
            assert result.exit_code == 2 and "Traceback" not in result.stderr


# -- item 7: one exit-code table, the documented JSON shape -----------------------------------


def test_a_file_that_is_not_a_ledger_is_invalid_for_every_command(here: Path):
    source = here / "o.jsonl"
    records(source, 1)
    (here / "other.db").write_bytes((here / "broker.db").read_bytes())  # a broker, closed
    for result in (
        run("ledger", "stats", "broker.db", "--json"),
        run("ledger", "in-doubt", "broker.db", "--entity", "orders", "--json"),
        run("ledger", "release", "broker.db", "--entity", "orders", "--id", "1", "--json"),
        publish(source, "orders", "--ledger", "sqlite:other.db", "--json"),
        publish(source, "orders", "--ledger", "sqlite:broker.db", "--json"),  # open as --to
    ):
        assert result.exit_code == 2, result.output
        report = json.loads(result.stdout)
        assert report["status"] == "error" and report["exit_status"] == 2
        assert (
            "not a sendonce ledger" in report["error"]
            or "open in this process as a broker" in (report["error"])
        )
    assert stored("orders") == []


def test_a_refused_key_is_reported_in_the_documented_json_shape(here: Path):
    messages = records(here / "o.jsonl", 2)
    intents("sqlite:l.db", "orders", messages, age=timedelta(hours=1))
    refused = run("ledger", "confirm", "l.db", "--entity", "orders", "--id", "r000", "--id",
                  "nope", "--json")  # fmt: skip
    assert refused.exit_code == 2
    report = json.loads(refused.stdout)
    assert set(report) == {"status", "error", "errors", "advice", "exit_status"}
    assert (report["status"], report["exit_status"]) == ("error", 2)
    assert "key 'nope' of 'orders': the ledger has no such key" in report["error"]
    assert "nothing was changed" in report["error"]
    listed = json.loads(run("ledger", "in-doubt", "l.db", "--entity", "orders", "--json").stdout)
    assert listed["in_doubt"] == 2  # r000 was not confirmed either


# -- item 5: totals, pages, many keys, the guard ----------------------------------------------


def test_in_doubt_gives_the_total_and_a_page_at_a_time(here: Path):
    messages = records(here / "o.jsonl", 250)
    intents("sqlite:l.db", "audit", messages, age=timedelta(hours=2))
    first = run("ledger", "in-doubt", "l.db", "--entity", "audit", "--broker", "local:broker.db")
    lines = first.stdout.splitlines()
    assert lines[0] == "250 key(s) in doubt for 'audit' (no duplicate detection); showing 1 to 100:"
    assert lines[1].startswith("'r000': first attempted ") and lines[1].endswith("ago)")
    assert lines[-1] == "... and 150 more (--offset 100 shows the next, --all every one)"
    assert len(lines) == 102
    last = run("ledger", "in-doubt", "l.db", "--entity", "audit", "--no-dedup", "--offset", "200",
               "--limit", "100", "--json")  # fmt: skip
    page = json.loads(last.stdout)
    assert (page["in_doubt"], page["offset"], page["shown"], page["more"]) == (250, 200, 50, 0)
    assert page["keys"][0] == {
        "message_id": "r200",
        "partition_key": None,
        "first_attempt": page["keys"][0]["first_attempt"],
        "may_be_in_flight": False,
    }
    assert page["rule"]["duplicate_detection"] == "none"
    every = json.loads(
        run("ledger", "in-doubt", "l.db", "--entity", "audit", "--all", "--json").stdout
    )
    assert every["shown"] == 250 and every["rule"]["duplicate_detection"] is None


def test_in_doubt_leaves_out_the_keys_a_rerun_settles_inside_the_window(here: Path):
    messages = records(here / "o.jsonl", 10)
    intents("sqlite:l.db", "orders", messages[:4], age=timedelta(hours=1))
    intents("sqlite:l.db", "orders", messages[4:], age=timedelta(minutes=1))
    listed = run("ledger", "in-doubt", "l.db", "--entity", "orders", "--broker", "local:broker.db")
    assert listed.stdout.startswith("4 key(s) in doubt for 'orders' (a 10m duplicate-detection")
    assert "6 more unconfirmed key(s) are still inside the window" in listed.stdout
    assert "a re-run within 10m of a key's first attempt resends it" in listed.stderr
    declared = json.loads(
        run("ledger", "in-doubt", "l.db", "--entity", "orders", "--window", "10m", "--json").stdout
    )
    assert (declared["in_doubt"], declared["inside_window"]) == (4, 6)


def test_stats_and_in_doubt_speak_of_the_entitys_own_rule(here: Path):
    messages = records(here / "o.jsonl", 3)
    for entity in ("audit", "orders", "cached"):
        intents("sqlite:l.db", entity, messages, age=timedelta(hours=1))
    stats = run("ledger", "stats", "l.db", "--broker", "local:broker.db")
    text = stats.stdout
    assert "audit (no duplicate detection)" in text
    assert "cached (an id cache of the last 100 ids, no time window)" in text
    assert "orders (a 10m duplicate-detection window)" in text
    assert "in doubt at once (a re-run does not resend it)" in text
    assert "in doubt once 10m have passed since its first attempt" in text
    unknown = run("ledger", "stats", "l.db").stdout
    assert "at once if it has none or an id cache (--broker says which)" in unknown
    cached = run("ledger", "in-doubt", "l.db", "--entity", "cached", "--broker", "local:broker.db")
    assert "remembers ids by count, not by time" in cached.stderr
    as_json = json.loads(
        run("ledger", "stats", "l.db", "--broker", "local:broker.db", "--json").stdout
    )["entities"]
    assert as_json["cached"]["rule"] == {
        "duplicate_detection": "id_cache",
        "window_seconds": None,
        "id_cache_size": 100,
    }


def test_many_keys_are_confirmed_or_released_from_a_file_stdin_or_json(here: Path):
    messages = records(here / "o.jsonl", 30)
    intents("sqlite:l.db", "audit", messages, age=timedelta(hours=1))
    (here / "ids.txt").write_text("".join(f"r{n:03d}\n" for n in range(10)) + "\n")
    confirmed = run("ledger", "confirm", "l.db", "--entity", "audit", "--from", "ids.txt")
    assert confirmed.exit_code == 0, confirmed.output
    assert confirmed.stdout.startswith("10 key(s) of 'audit' confirmed as sent: 'r000', 'r001'")
    piped = run("ledger", "release", "l.db", "--entity", "audit", "--from", "-", "--json",
                stdin="\n".join(json.dumps(f"r{n:03d}") for n in range(10, 15)))  # fmt: skip
    assert json.loads(piped.stdout)["count"] == 5, piped.output
    listed = run("ledger", "in-doubt", "l.db", "--entity", "audit", "--all", "--json").stdout
    (here / "doubt.json").write_text(listed)
    released = run(
        "ledger", "release", "l.db", "--entity", "audit", "--from", "doubt.json", "--json"
    )
    report = json.loads(released.stdout)
    assert (report["status"], report["resolution"], report["count"]) == ("ok", "release", 15)
    assert report["keys"][0] == {"message_id": "r015", "partition_key": None}
    left = json.loads(run("ledger", "stats", "l.db", "--json").stdout)["entities"]["audit"]
    assert (left["keys"], left["confirmed"], left["unconfirmed"]) == (10, 10, 0)
    # A JSON file given as text is named, not read as ids.
    wrong = run(
        "ledger", "release", "l.db", "--entity", "audit", "--from", "doubt.json",
        "--from-format", "text",
    )  # fmt: skip
    assert wrong.exit_code == 2 and "the ledger has no such key" in wrong.stderr


def test_partitioned_keys_come_with_their_partition_key(here: Path):
    messages = [Message(f"b{n}", message_id=f"m{n}", partition_key=f"p{n}") for n in range(3)]
    keys = [Key(m.message_id, m.partition_key) for m in messages]
    intents("sqlite:l.db", "parts", messages, age=timedelta(hours=1), keys=keys)
    listed = json.loads(run("ledger", "in-doubt", "l.db", "--entity", "parts", "--json").stdout)
    assert listed["keys"][0]["partition_key"] == "p0"
    bare = run("ledger", "confirm", "l.db", "--entity", "parts", "--id", "m0")
    assert bare.exit_code == 2 and "--partition-key" in bare.stderr
    (here / "keys.txt").write_text("m0\tp0\nm1\tp1\n")
    assert (
        run("ledger", "confirm", "l.db", "--entity", "parts", "--from", "keys.txt").exit_code == 0
    )
    one = run(
        "ledger", "release", "l.db", "--entity", "parts", "--id", "m2", "--partition-key", "p2"
    )
    assert one.exit_code == 0, one.output


def test_a_live_producers_keys_are_refused_unless_forced(here: Path):
    messages = records(here / "o.jsonl", 6)
    intents("sqlite:l.db", "audit", messages[:2], age=timedelta(seconds=20))  # just written
    intents("sqlite:l.db", "audit", messages[2:6], age=timedelta(hours=1))
    with Ledger("sqlite:l.db") as ledger:  # its producer acknowledged r002 just now: alive
        ledger.confirm("audit", {Key("r002"): "sent"})
    refused = run("ledger", "release", "l.db", "--entity", "audit", "--id", "r000", "--id", "r003",
                  "--id", "r004")  # fmt: skip
    assert refused.exit_code == 2
    assert "key 'r000' of 'audit': its intent was written 20s ago" in refused.stderr
    assert "may still be sending it" in refused.stderr
    assert (
        "key 'r003' of 'audit': the producer that wrote it confirmed another key" in refused.stderr
    )
    assert "or give --force" in refused.stderr and "Nothing was changed." in refused.stderr
    assert (
        json.loads(run("ledger", "stats", "l.db", "--json").stdout)["entities"]["audit"][
            "unconfirmed"
        ]
        == 5
    )
    short = run("ledger", "release", "l.db", "--entity", "audit", "--id", "r000", "--min-age", "5s")
    assert short.exit_code == 0, short.output
    forced = run("ledger", "release", "l.db", "--entity", "audit", "--id", "r003", "--force")
    assert forced.exit_code == 0, forced.output
    assert (
        json.loads(run("ledger", "stats", "l.db", "--json").stdout)["entities"]["audit"][
            "unconfirmed"
        ]
        == 3
    )


# -- reconcile: what the local broker shows, exactly -------------------------------------------


def test_reconcile_sorts_keys_by_what_the_local_broker_holds_and_remembers(here: Path):
    messages = records(here / "o.jsonl", 6)
    send("orders", messages[:4])
    with LocalBackend("broker.db") as broker:  # r000 taken by a consumer, r001 dead-lettered
        taken = broker.receive("orders", max_messages=2, mode="peek_lock")
        broker.complete("orders", taken[0].lock_token)
        broker.dead_letter("orders", taken[1].lock_token, reason="bad")
    intents("sqlite:l.db", "orders", messages, age=timedelta(minutes=1))
    shown = run("ledger", "reconcile", "l.db", "--entity", "orders", "--broker", "local:broker.db",
                "--min-age", "10s", "--json")  # fmt: skip
    report = json.loads(shown.stdout)
    ids = {
        f: [k["message_id"] for k in report[f]]
        for f in ("held", "remembered", "not_stored", "absent")
    }
    assert ids == {
        "held": ["r001", "r002", "r003"],
        "remembered": ["r000"],
        "not_stored": ["r004", "r005"],  # inside the window: the broker would remember them
        "absent": [],
    }
    assert report["applied"] is False
    assert (
        json.loads(run("ledger", "stats", "l.db", "--json").stdout)["entities"]["orders"][
            "unconfirmed"
        ]
        == 6
    )
    applied = run("ledger", "reconcile", "l.db", "--entity", "orders", "--broker",
                  "local:broker.db", "--min-age", "10s", "--apply")  # fmt: skip
    assert "confirmed 4 key(s), released 2" in applied.stdout, applied.output
    again = json.loads(publish(here / "o.jsonl", "orders", "--ledger", "l.db", "--json").stdout)
    assert (again["sent"], again["from_ledger"]) == (2, 4)
    assert sorted(stored("orders")) == ["r002", "r003", "r004", "r005"]
    with LocalBackend("broker.db") as broker:
        assert [m.message_id for m in broker.peek("orders", sub_queue="dead_letter")] == ["r001"]


def test_reconcile_reads_topics_id_caches_and_partitions(here: Path):
    events = records(here / "e.jsonl", 3, prefix="e")
    send("events", events[:1])
    with LocalBackend("broker.db") as broker:  # subscription a consumed it, b still holds it
        (got,) = broker.receive("events", subscription="a", mode="receive_and_delete")
    assert got.message_id == "e000"
    intents("sqlite:l.db", "events", events, age=timedelta(hours=1))
    cached = records(here / "c.jsonl", 3, prefix="c")
    send("cached", cached[:1])
    with LocalBackend("broker.db") as broker:
        broker.receive("cached", mode="receive_and_delete")
    intents("sqlite:l.db", "cached", cached, age=timedelta(hours=1))
    parts = [Message("x", message_id="m", partition_key=p) for p in ("p1", "p2")]
    send("parts", parts[:1])
    intents("sqlite:l.db", "parts", parts, age=timedelta(hours=1),
            keys=[Key("m", "p1"), Key("m", "p2")])  # fmt: skip

    def found(entity: str) -> dict[str, list[object]]:
        result = run("ledger", "reconcile", "l.db", "--entity", entity, "--broker",
                     "local:broker.db", "--json")  # fmt: skip
        report = json.loads(result.stdout)
        return {
            f: [(k["message_id"], k["partition_key"]) for k in report[f]]
            for f in ("held", "remembered", "not_stored", "absent")
            if report[f]
        }

    assert found("events") == {"held": [("e000", None)], "absent": [("e001", None), ("e002", None)]}
    # An id cache that never evicted, persisted: what it does not remember was never stored.
    assert found("cached") == {
        "remembered": [("c000", None)],
        "not_stored": [("c001", None), ("c002", None)],
    }
    # Partitioned: the key is message id and partition key; past the window, p2 is unproven.
    assert found("parts") == {"held": [("m", "p1")], "absent": [("m", "p2")]}


def test_reconcile_releases_what_it_cannot_prove_only_when_told_and_never_a_live_key(here: Path):
    messages = records(here / "o.jsonl", 4)
    send("audit", messages[:1])
    intents("sqlite:l.db", "audit", messages[:3], age=timedelta(hours=1))
    intents("sqlite:l.db", "audit", messages[3:], age=timedelta(seconds=5))
    told = run("ledger", "reconcile", "l.db", "--entity", "audit", "--broker", "local:broker.db")
    assert "1 held by the broker" in told.stdout and "3 not in the broker" in told.stdout
    assert "the broker keeps no trace of a message once a consumer completed it" in told.stderr
    assert "--apply --release-absent also releases those not in the broker" in told.stdout
    needs_apply = run("ledger", "reconcile", "l.db", "--entity", "audit", "--broker",
                      "local:broker.db", "--release-absent")  # fmt: skip
    assert needs_apply.exit_code == 2
    applied = json.loads(
        run(
            "ledger",
            "reconcile",
            "l.db",
            "--entity",
            "audit",
            "--broker",
            "local:broker.db",
            "--apply",
            "--release-absent",
            "--json",
        ).stdout
    )
    assert (applied["confirmed"], applied["released"], applied["left"]) == (1, 2, 1)
    assert applied["too_young"] == [{"message_id": "r003", "partition_key": None}]
    report = json.loads(publish(here / "o.jsonl", "audit", "--ledger", "l.db", "--json").stdout)
    assert report["sent"] == 2 and report["in_doubt"] == ["r003"]
    assert sorted(stored("audit")) == ["r000", "r001", "r002"]


def test_reconcile_refuses_a_missing_broker_or_entity(here: Path):
    intents("sqlite:l.db", "audit", records(here / "o.jsonl", 1), age=timedelta(hours=1))
    typo = run("ledger", "reconcile", "l.db", "--entity", "audit", "--broker", "local:typo.db")
    assert typo.exit_code == 2 and "there is no broker file" in typo.stderr
    assert not (here / "typo.db").exists()  # an empty broker would read as "never stored"
    artemis = run("ledger", "reconcile", "l.db", "--entity", "audit", "--broker",
                  "amqp://u:secret@127.0.0.1:1")  # fmt: skip
    assert artemis.exit_code == 2 and "cannot read an Artemis broker" in artemis.stderr
    assert "secret" not in artemis.stderr
    unknown = run("ledger", "reconcile", "l.db", "--entity", "nope", "--broker", "local:broker.db")
    assert unknown.exit_code == 2 and "the ledger has no entity 'nope'" in unknown.stderr
    with Ledger("sqlite:l.db") as ledger:
        ledger._prepare("gone", [Message("x", message_id="g")], [Key("g")], window=timedelta(0),
                       margin=timedelta(seconds=5))  # fmt: skip
    missing = run("ledger", "reconcile", "l.db", "--entity", "gone", "--broker", "local:broker.db")
    assert missing.exit_code == 2 and "does not exist in the local broker" in missing.stderr


# -- item 6: advice in the entity's rule, in CLI words -----------------------------------------


def test_publish_to_an_entity_without_duplicate_detection_names_ledger(here: Path):
    source = here / "o.jsonl"
    records(source, 1)
    refused = publish(source, "audit")
    assert refused.exit_code == 2
    assert "give --ledger" in refused.stderr
    assert "duplicate_detection" not in refused.stderr and "=True" not in refused.stderr


@pytest.mark.parametrize(
    ("entity", "says", "never"),
    [
        ("audit", "The entity has no duplicate detection, so running the same command again "
         "does not resend them", "inside the duplicate-detection window"),
        ("cached", "The entity has an id cache of the last 100 ids", "window of that send"),
        ("orders", "less than 10m ago (the duplicate-detection window) are resent by running the "
         "same command again", "does not resend them"),
    ],
)  # fmt: skip
def test_the_advice_on_keys_in_doubt_names_the_entitys_rule(
    here: Path, entity: str, says: str, never: str
):
    source = here / "o.jsonl"
    messages = records(source, 3)
    intents("sqlite:l.db", entity, messages[:1], age=timedelta(hours=1))
    result = publish(source, entity, "--ledger", "l.db")
    assert result.exit_code == 1, result.output
    text = " ".join(result.stderr.split())
    assert says in text and never not in text
    assert f"sendonce ledger reconcile l.db --entity {entity} --broker local:broker.db" in text
    for python in ("Ledger.", "Ledger(", "in_doubt=", "require_duplicate_detection", "=True"):
        assert python not in text
    if entity == "cached":
        assert "remembers ids by count (the last 100)" in text


def test_every_json_refusal_carries_status_error_and_exit_status(here: Path):
    (here / "bad.jsonl").write_text('{"id": 1\n')
    intents("sqlite:l.db", "audit", records(here / "o.jsonl", 1), age=timedelta(hours=1))
    refusals = [
        run("broker", "stats", "typo.db", "--json"),
        publish(here / "bad.jsonl", "orders", "--json"),
        publish(here / "o.jsonl", "orders", "--ledger", "typo.db", "--json"),
        run("ledger", "stats", "typo.db", "--json"),
        run("ledger", "in-doubt", "l.db", "--entity", "nope", "--json"),
        run("ledger", "confirm", "l.db", "--entity", "audit", "--id", "nope", "--json"),
        run("ledger", "reconcile", "l.db", "--entity", "audit", "--broker", "local:t.db", "--json"),
    ]
    for result in refusals:
        report = json.loads(result.stdout)
        assert report["status"] in ("error", "invalid"), result.stdout
        assert report["error"] and report["exit_status"] == result.exit_code == 2


def test_stats_with_a_broker_tolerates_an_entity_deleted_since(here: Path):
    intents("sqlite:l.db", "gone", records(here / "o.jsonl", 1), age=timedelta(hours=1))
    intents("sqlite:l.db", "audit", records(here / "o.jsonl", 1), age=timedelta(hours=1))
    stats = run("ledger", "stats", "l.db", "--broker", "local:broker.db")
    assert stats.exit_code == 0, stats.output
    assert "audit (no duplicate detection)" in stats.stdout and "\ngone\n" in stats.stdout
    typo = run("ledger", "stats", "l.db", "--broker", "local:typo.db")
    assert typo.exit_code == 2 and "there is no broker file" in typo.stderr


def test_a_list_reconcile_prints_is_keys_for_release(here: Path):
    messages = records(here / "o.jsonl", 3)
    send("audit", messages[:1])
    intents("sqlite:l.db", "audit", messages, age=timedelta(hours=1))
    shown = run("ledger", "reconcile", "l.db", "--entity", "audit", "--broker", "local:broker.db",
                "--json")  # fmt: skip
    (here / "absent.json").write_text(json.dumps(json.loads(shown.stdout)["absent"]))
    released = run("ledger", "release", "l.db", "--entity", "audit", "--from", "absent.json",
                   "--json")  # fmt: skip
    assert json.loads(released.stdout)["count"] == 2, released.output
