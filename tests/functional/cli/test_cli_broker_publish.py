"""``sendonce broker`` and ``sendonce publish`` end to end on real broker files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce.backends.local import LocalBackend
from sendonce.cli import main

ID = "{order_id}.{year}/payment"


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "broker.db")
    result = run("broker", "create", path, "--entity", "orders", "--window", "1h")
    assert result.exit_code == 0, result.output
    return path


def stored(db: str, entity: str = "orders") -> list[str]:
    with LocalBackend(db) as backend:
        return backend.message_ids(entity)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def jsonl(*records: dict[str, object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_publishing_the_same_file_twice_leaves_each_record_once(tmp_path, db):
    records = [{"order_id": i, "year": 2026, "amount": f"{i}.50"} for i in range(250)]
    source = write(tmp_path, "orders.jsonl", jsonl(*records))
    args = ("publish", source, "--to", f"local://{db}", "--entity", "orders", "--id", ID)
    first = run(*args, "--chunk-size", "100")
    assert first.exit_code == 0, first.output
    assert "sent 250, duplicates 0, failed 0" in first.stdout
    second = run(*args)
    assert second.exit_code == 0, second.output
    assert "sent 0, duplicates 250, failed 0" in second.stdout
    ids = stored(db)
    assert sorted(ids) == sorted(f"{i}.2026/payment" for i in range(250))
    with LocalBackend(db) as backend:
        (first_message,) = backend.peek("orders")
    assert json.loads(first_message.body) == records[0]


def test_csv_with_body_field_and_partition_key(tmp_path):
    db = str(tmp_path / "b.db")
    assert run("broker", "create", db, "--entity", "p", "--partitioned").exit_code == 0
    source = write(
        tmp_path, "in.csv", "order_id,year,region,payload\n1,2026,eu,hello\n1,2026,us,world\n"
    )
    result = run(
        "publish",
        source,
        "--to",
        f"local://{db}",
        "--entity",
        "p",
        "--id",
        ID,
        "--partition-key",
        "{region}",
        "--body-field",
        "payload",
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert "sent 2" in result.stdout
    with LocalBackend(db) as backend:
        got = backend.receive("p", max_messages=5)
    assert [(m.partition_key, m.body) for m in got] == [("eu", b"hello"), ("us", b"world")]


def test_malformed_line_is_reported_with_its_number_and_nothing_is_sent(tmp_path, db):
    text = jsonl({"order_id": 1, "year": 2026}) + "{not json\n" + jsonl({"order_id": 3, "year": 1})
    source = write(tmp_path, "orders.jsonl", text)
    result = run("publish", source, "--to", f"local://{db}", "--entity", "orders", "--id", ID)
    assert result.exit_code == 2
    assert "line 2: malformed JSON" in result.stderr
    assert "nothing was published" in result.stderr
    assert stored(db) == []


def test_missing_template_field_names_line_and_field(tmp_path, db):
    source = write(tmp_path, "orders.jsonl", jsonl({"order_id": 1, "year": 2026}, {"order_id": 2}))
    result = run("publish", source, "--to", f"local://{db}", "--entity", "orders", "--id", ID)
    assert result.exit_code == 2
    assert "line 2:" in result.stderr and "'year'" in result.stderr
    assert stored(db) == []


def test_short_csv_row_is_reported(tmp_path, db):
    source = write(tmp_path, "in.csv", "order_id,year\n1,2026\n2\n")
    result = run("publish", source, "--to", f"local://{db}", "--entity", "orders", "--id", ID)
    assert result.exit_code == 2
    assert "line 3:" in result.stderr
    assert stored(db) == []


def test_same_id_with_different_bodies_in_one_file_is_refused(tmp_path, db):
    source = write(
        tmp_path,
        "orders.jsonl",
        jsonl({"order_id": 1, "year": 2026, "a": 1}, {"order_id": 1, "year": 2026, "a": 2}),
    )
    result = run("publish", source, "--to", f"local://{db}", "--entity", "orders", "--id", ID)
    assert result.exit_code == 2
    assert "line 2:" in result.stderr and "line 1" in result.stderr
    assert stored(db) == []


def test_entity_rules_are_checked_for_every_line_first(tmp_path):
    db = str(tmp_path / "b.db")
    assert run("broker", "create", db, "--entity", "s", "--sessions").exit_code == 0
    source = write(tmp_path, "o.jsonl", jsonl({"order_id": 1, "year": 2026}))
    result = run("publish", source, "--to", f"local://{db}", "--entity", "s", "--id", ID)
    assert result.exit_code == 2
    assert "line 1:" in result.stderr and "--session-id" in result.stderr
    assert stored(db, "s") == []


def test_stdin_input(db):
    result = run(
        "publish",
        "-",
        "--to",
        f"local://{db}",
        "--entity",
        "orders",
        "--id",
        ID,
        input=jsonl({"order_id": 7, "year": 2026}),
    )
    assert result.exit_code == 0, result.output
    assert stored(db) == ["7.2026/payment"]


def test_secret_of_the_url_is_never_printed(tmp_path):
    source = write(tmp_path, "o.jsonl", jsonl({"order_id": 1, "year": 2026}))
    url = (
        "Endpoint=sb://127.0.0.1:9/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRET42;"
        "UseDevelopmentEmulator=true"
    )
    result = run("publish", source, "--to", url, "--entity", "orders", "--id", ID)
    assert result.exit_code != 0
    assert "TOPSECRET42" not in result.output
    bad_url = run(
        "publish", source, "--to", "nope://user:TOPSECRET42@host/x", "--entity", "o", "--id", ID
    )
    assert bad_url.exit_code != 0
    assert "TOPSECRET42" not in bad_url.output


def test_bad_id_template_is_a_usage_error(tmp_path, db):
    source = write(tmp_path, "o.jsonl", jsonl({"a": 1, "b": 2}))
    result = run("publish", source, "--to", f"local://{db}", "--entity", "orders", "--id", "{a}{b}")
    assert result.exit_code == 2
    assert "--id" in result.output


def test_broker_commands(tmp_path):
    db = str(tmp_path / "b.db")
    created = run(
        "broker",
        "create",
        db,
        "--entity",
        "events",
        "--topic",
        "--subscription",
        "a",
        "--subscription",
        "b",
        "--id-cache-size",
        "500",
    )
    assert created.exit_code == 0, created.output
    source = write(tmp_path, "o.jsonl", jsonl(*({"order_id": i, "year": 1} for i in range(3))))
    assert (
        run(
            "publish",
            source,
            "--to",
            f"local://{db}",
            "--entity",
            "events",
            "--id",
            ID,
            "--no-progress",
        ).exit_code
        == 0
    )
    stats = json.loads(run("broker", "stats", db, "--json").stdout)["entities"]
    assert stats["events"]["messages"] == 6 and stats["events"]["ids_remembered"] == 3
    assert "id cache 500 (persisted)" in stats["events"]["profile"]
    peeked = run("broker", "peek", db, "--entity", "events", "--subscription", "a", "--max", "2")
    assert [json.loads(x)["message_id"] for x in peeked.stdout.splitlines()] == [
        "0.1/payment",
        "1.1/payment",
    ]
    received = run(
        "broker", "receive", db, "--entity", "events", "--subscription", "a", "--max", "1"
    )
    assert json.loads(received.stdout)["message_id"] == "0.1/payment"
    purged = run("broker", "purge", db, "--entity", "events")
    assert "purged 5" in purged.stdout
    assert "events" in run("broker", "stats", db).stdout


def test_broker_create_errors(tmp_path):
    db = str(tmp_path / "b.db")
    window = run("broker", "create", db, "--entity", "q", "--window", "5s")
    assert window.exit_code == 2 and "--window" in window.output and "20s" in window.output
    assert not Path(db).exists()  # a refused option leaves no file behind
    bad = run("broker", "create", db, "--entity", "q", "--window", "ten minutes")
    assert bad.exit_code == 2 and "--window" in bad.output
    sub = run("broker", "create", db, "--entity", "q", "--subscription", "s")
    assert sub.exit_code == 2
    assert run("broker", "create", db, "--entity", "q").exit_code == 0
    again = run("broker", "create", db, "--entity", "q")
    assert again.exit_code == 2 and "already exists" in again.output
    exists = run("broker", "create", db, "--entity", "q", "--exist-ok")
    assert exists.exit_code == 0 and "already exists" in exists.stdout
    assert "created" not in exists.stdout
    missing = run("broker", "stats", str(tmp_path / "nope.db"))
    assert missing.exit_code == 2
    unknown = run("broker", "peek", db, "--entity", "nope")
    assert unknown.exit_code == 2 and "nope" in unknown.output


def test_declared_profile_creates_or_must_match(tmp_path, db):
    source = write(tmp_path, "o.jsonl", jsonl({"order_id": 1, "year": 2026}))
    fresh = str(tmp_path / "fresh.db")
    assert run("broker", "create", fresh, "--entity", "other").exit_code == 0
    created = run(
        "publish",
        source,
        "--to",
        f"local://{fresh}",
        "--entity",
        "new",
        "--id",
        ID,
        "--window",
        "5m",
        "--no-progress",
    )
    assert created.exit_code == 0, created.output
    with LocalBackend(fresh) as backend:
        assert backend.describe("new").duplicate_detection_window.total_seconds() == 300
    # "orders" exists with a 1 h window: declaring another one is refused, nothing sent.
    clash = run(
        "publish",
        source,
        "--to",
        f"local://{db}",
        "--entity",
        "orders",
        "--id",
        ID,
        "--window",
        "5m",
    )
    assert clash.exit_code == 2 and "--window" in clash.output and "1h" in clash.output
    assert "datetime" not in clash.output
    assert stored(db) == []
    lonely = run(
        "publish",
        source,
        "--to",
        f"local://{db}",
        "--entity",
        "orders",
        "--id",
        ID,
        "--partitioned",
    )
    assert lonely.exit_code == 2 and "--window" in lonely.output
