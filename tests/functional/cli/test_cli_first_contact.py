"""Issue 14: what a new user hits first, on real broker files through the real command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce import MessageIdError, MessageSpec
from sendonce._sender import IdempotentSender
from sendonce.backends.local import LocalBackend
from sendonce.cli import main

ID = "{order_id}.{year}/payment"


def run(*args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "broker.db")
    assert run("broker", "create", path, "--entity", "orders", "--window", "1h").exit_code == 0
    return path


def stored(db: str, entity: str = "orders") -> list[str]:
    with LocalBackend(db) as backend:
        return sorted(backend.message_ids(entity))


def bodies(db: str, entity: str = "orders") -> list[dict[str, object]]:
    with LocalBackend(db) as backend:
        return [json.loads(m.body) for m in backend.peek(entity, max_messages=100)]


def publish(db: str, source: Path | str, *extra: str, entity: str = "orders") -> Result:
    return run(
        "publish", str(source), "--to", f"local://{db}", "--entity", entity, "--id", ID, *extra
    )


# 1. An empty id cell is missing data: refused, not published as ".2017/payment".


def test_an_empty_csv_cell_in_an_id_field_is_refused_with_line_and_field(tmp_path, db):
    source = tmp_path / "o.csv"
    source.write_text("order_id,year,amount\n,2017,1\n7,2017,2\n,2017,99\n")
    result = publish(db, source)
    assert result.exit_code == 2
    assert "line 2: field 'order_id' is empty" in result.stderr
    assert "line 4: field 'order_id' is empty" in result.stderr
    assert "--allow-empty" in result.stderr and "allow_empty" not in result.stderr
    assert stored(db) == []


def test_an_empty_json_string_in_an_id_field_is_refused(tmp_path, db):
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": "", "year": 2017}\n')
    result = publish(db, source)
    assert result.exit_code == 2 and "line 1: field 'order_id' is empty" in result.stderr
    assert stored(db) == []


def test_allow_empty_opts_in_on_the_command_line_and_in_the_api(tmp_path, db):
    source = tmp_path / "o.csv"
    source.write_text("order_id,year\n,2017\n")
    result = publish(db, source, "--allow-empty", "--no-progress")
    assert result.exit_code == 0, result.output
    assert stored(db) == [".2017/payment"]
    with pytest.raises(MessageIdError, match="'order_id' is empty"):
        MessageSpec(ID).to_message({"order_id": "", "year": 2017})
    assert MessageSpec(ID, allow_empty=True).to_message({"order_id": "", "year": 1}).message_id


# 2. CSV traps.


def test_a_utf8_byte_order_mark_is_skipped(tmp_path, db):
    source = tmp_path / "excel.csv"
    source.write_bytes("customer,order_id,year\nc-1,5,2017\n".encode("utf-8-sig"))
    result = publish(db, source, "--no-progress")
    assert result.exit_code == 0, result.output
    assert bodies(db) == [{"customer": "c-1", "order_id": "5", "year": "2017"}]


def test_a_repeated_header_column_is_refused(tmp_path, db):
    source = tmp_path / "o.csv"
    source.write_text("order_id,year,order_id\n1,2017,2\n")
    result = publish(db, source)
    assert result.exit_code == 2
    assert "line 1:" in result.stderr and "'order_id' more than once" in result.stderr
    assert stored(db) == []


def test_missing_fields_show_the_header_once(tmp_path, db):
    source = tmp_path / "o.csv"
    source.write_text("orderid,year\n1,2017\n2,2017\n")
    result = publish(db, source)
    assert result.exit_code == 2
    assert result.stderr.count("field 'order_id' is missing") == 1  # once, with its lines
    assert "field 'order_id' is missing from the record (lines 2, 3)" in result.stderr
    assert result.stderr.count("the CSV header has the columns 'orderid', 'year'") == 1


# 7. Commands write nowhere they should not.


def test_publish_to_a_mistyped_broker_path_creates_nothing(tmp_path, db):
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 1, "year": 2017}\n')
    typo = tmp_path / "brokr.db"
    result = publish(str(typo), source, "--window", "10m")
    assert result.exit_code == 2
    assert "no broker file" in result.stderr and "sendonce broker create" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in tmp_path.iterdir() if not p.name.startswith("brokr")
    )
    assert not typo.exists()


@pytest.mark.parametrize("window", ["0", "0s", "8d"])
def test_broker_create_with_a_window_out_of_range_leaves_no_file(tmp_path, window):
    path = tmp_path / "new.db"
    result = run("broker", "create", str(path), "--entity", "q", "--window", window)
    assert result.exit_code == 2 and "--window" in result.output
    assert list(tmp_path.iterdir()) == []


def test_read_only_commands_refuse_a_missing_file(tmp_path):
    for command in (["stats"], ["peek", "--entity", "q"], ["purge", "--entity", "q"]):
        result = run("broker", command[0], str(tmp_path / "nope.db"), *command[1:])
        assert result.exit_code == 2
    assert list(tmp_path.iterdir()) == []


# 8. Exit codes, interruption.


def test_usage_errors_exit_2(tmp_path, db):
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 1, "year": 2017}\n')
    bad_url = run("publish", str(source), "--to", "nope://x", "--entity", "o", "--id", ID)
    assert bad_url.exit_code == 2 and "--to" in bad_url.output
    window = publish(db, source, "--window", "1s")
    assert window.exit_code == 2 and "--window" in window.output
    assert "datetime" not in window.output
    assert run("demo", "--orders", "-3").exit_code == 2


def test_exit_codes_are_in_the_help():
    for args in ([], ["publish"], ["broker"]):
        text = run(*args, "--help").output
        assert "Exit status: 0" in text and "130" in text


def test_ctrl_c_says_what_is_stored_and_that_a_rerun_is_safe(tmp_path, db, monkeypatch):
    source = tmp_path / "o.jsonl"
    source.write_text("".join(json.dumps({"order_id": i, "year": 1}) + "\n" for i in range(25)))
    real = IdempotentSender.send_many
    calls = []

    def interrupted(self, messages, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, messages, **kwargs)

    monkeypatch.setattr(IdempotentSender, "send_many", interrupted)
    result = publish(db, source, "--chunk-size", "10", "--no-progress")
    assert result.exit_code == 130
    assert "20 of 25 record(s) are stored" in result.stderr
    assert "again is safe" in result.stderr
    monkeypatch.setattr(IdempotentSender, "send_many", real)
    again = publish(db, source, "--no-progress")
    assert again.exit_code == 0 and "sent 5, duplicates 20" in again.stdout
    assert len(stored(db)) == 25


# 9. Silent traps.


def test_publishing_to_a_topic_without_subscriptions_warns(tmp_path):
    path = str(tmp_path / "b.db")
    assert run("broker", "create", path, "--entity", "events", "--topic").exit_code == 0
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 1, "year": 2017}\n')
    result = publish(path, source, "--no-progress", entity="events")
    assert result.exit_code == 0
    assert "topic 'events' has no subscriptions" in result.stderr


# 10. Scripting and scale.


def test_publish_json_report(tmp_path, db):
    source = tmp_path / "o.jsonl"
    source.write_text("".join(json.dumps({"order_id": i, "year": 1}) + "\n" for i in range(3)))
    first = json.loads(publish(db, source, "--json").stdout)
    rerun = {key: first.pop(key) for key in ("rerun", "rerun_safe_until")}
    assert first == {
        "status": "ok",
        "entity": "orders",
        "records": 3,
        "sent": 3,
        "duplicates": 0,
        "duplicates_reported": True,
        "from_ledger": 0,
        "failed": 0,
        "in_doubt": [],
        "failures": [],
        "exit_status": 0,
    }
    assert "safe until" in rerun["rerun"] and rerun["rerun_safe_until"].endswith("+00:00")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"order_id": 1}\n')
    invalid = publish(db, bad, "--json")
    assert invalid.exit_code == 2
    report = json.loads(invalid.stdout)
    assert report["status"] == "invalid" and report["bad_lines"] == 1


def test_stats_json_has_structured_settings(db):
    stats = json.loads(run("broker", "stats", db, "--json").stdout)["entities"]
    assert stats["orders"]["settings"] == {
        "kind": "queue",
        "duplicate_detection": True,
        "window_seconds": 3600.0,
        "partitioned": False,
        "sessions": False,
        "id_cache_size": None,
        "persist_id_cache": True,
        "max_message_size": stats["orders"]["settings"]["max_message_size"],
        "lock_duration_seconds": 60.0,
        "max_delivery_count": 10,
        "default_ttl_seconds": None,
        "dead_letter_on_expiry": False,
    }


def test_log_level_shows_library_logs(tmp_path, db):
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 1, "year": 2017}\n')
    quiet = run("publish", str(source), "--to", f"local://{db}", "--entity", "orders", "--id", ID)
    assert "DEBUG" not in quiet.stderr
    loud = run(
        "--log-level",
        "debug",
        "publish",
        str(source),
        "--to",
        f"local://{db}",
        "--entity",
        "orders",
        "--id",
        ID,
    )
    assert loud.exit_code == 0 and "DEBUG sendonce" in loud.stderr


def test_records_stream_in_chunks_and_stdin_is_read_twice(tmp_path, db):
    lines = "".join(json.dumps({"order_id": i, "year": 1}) + "\n" for i in range(1050))
    result = run(
        "publish",
        "-",
        "--to",
        f"local://{db}",
        "--entity",
        "orders",
        "--id",
        ID,
        "--chunk-size",
        "100",
        input=lines,
    )
    assert result.exit_code == 0, result.output
    assert "sent 1050" in result.stdout and len(stored(db)) == 1050


def test_conflicting_bodies_far_apart_are_found_before_sending(tmp_path, db):
    rows = [{"order_id": i, "year": 1, "v": 0} for i in range(300)]
    rows.append({"order_id": 3, "year": 1, "v": 1})
    source = tmp_path / "o.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = publish(db, source, "--chunk-size", "50")
    assert result.exit_code == 2
    assert "line 301: builds the same message id as line 4" in result.stderr
    assert stored(db) == []


# 11. Smaller.


@pytest.mark.parametrize("text", ["10m10m", "1e3", "10M", "1h 5m", "5m1h"])
def test_durations_are_strict(text, tmp_path):
    result = run("broker", "create", str(tmp_path / "b.db"), "--entity", "q", "--window", text)
    assert result.exit_code == 2 and "not a duration" in result.output


def test_json_error_columns_count_from_the_line(tmp_path, db):
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 1\n')
    result = publish(db, source)
    assert result.exit_code == 2 and "(column 15)" in result.stderr


def test_errors_name_cli_options_not_python(tmp_path, db):
    source = tmp_path / "o.jsonl"
    source.write_text('{"order_id": 1, "year": 2017, "amount": 5}\n')
    result = publish(db, source, "--body-field", "amount")
    assert result.exit_code == 2
    assert "--body-field 'amount' holds int values, not text" in result.stderr
    assert "bytes or str" not in result.stderr
