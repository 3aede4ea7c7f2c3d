"""Issue 23 items 3-5: one validation pass, the command's problems once, errors in CLI words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce.backends.local import LocalBackend
from sendonce.cli import main


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def create(db: str, entity: str, *options: str) -> None:
    result = run("broker", "create", db, "--entity", entity, *options)
    assert result.exit_code == 0, result.output


def stored(db: str, entity: str) -> list[str]:
    with LocalBackend(db) as backend:
        return backend.message_ids(entity)


def publish(db: str, source: Path, entity: str, *extra: str) -> Result:
    return run(
        "publish", str(source), "--to", f"local://{db}", "--entity", entity, "--no-progress",
        *extra,
    )  # fmt: skip


def jsonl(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    source = tmp_path / "o.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return source


# 3. One pass: per-line problems, size and conflicting rows together; the command's once.


def test_line_size_and_conflict_problems_come_in_one_pass(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    rows: list[dict[str, object]] = [{"id": i, "v": "x"} for i in range(5)]
    rows[1] = {"v": "no id"}  # a per-line problem
    rows[2] = {"id": 2, "v": "y" * 300_000}  # over the 256 KB limit
    rows[4] = {"id": 0, "v": "another body"}  # the same id as line 1, another body
    result = publish(db, jsonl(tmp_path, rows), "orders", "--id", "{id}", "--json")
    assert result.exit_code == 2
    errors = json.loads(result.stdout)["errors"]
    assert any("line 2: field 'id' is missing" in e for e in errors)
    assert any(e.startswith("line 3: the message is") and "limit" in e for e in errors)
    assert any(e.startswith("line 5: builds the same message id as line 1") for e in errors)
    assert stored(db, "orders") == []


def test_a_problem_of_the_command_is_reported_once_with_its_line_count(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "sess", "--sessions")
    source = jsonl(tmp_path, [{"order_id": i} for i in range(50)])
    result = publish(db, source, "sess", "--id", "{order_id}")
    assert result.exit_code == 2
    assert result.stderr.count("requires sessions: give --session-id") == 1
    assert "(lines 1, 2, 3, 4, 5 and 45 more: 50 lines)" in result.stderr
    typo = publish(db, source, "sess", "--id", "{orderid}", "--session-id", "{order_id}")
    assert typo.stderr.count("field 'orderid' is missing") == 1
    assert "50 lines" in typo.stderr and "50 bad line(s)" in typo.stderr
    assert stored(db, "sess") == []


def test_partition_key_and_session_id_that_differ_are_one_problem_in_cli_words(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "sess", "--sessions")
    source = jsonl(tmp_path, [{"order_id": 100000 + i, "s": "x"} for i in range(20)])
    result = publish(
        db, source, "sess", "--id", "{order_id}", "--partition-key", "{order_id}",
        "--session-id", "{s}",
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.count("--partition-key gives") == 1
    assert "20 lines" in result.stderr
    assert "partition_key" not in result.stderr and "session_id" not in result.stderr


# 4. Errors in the CLI's words.


@pytest.mark.parametrize(
    ("options", "expected", "python_names"),
    [
        (["--id", "{a}{b}"], "--id: template '{a}{b}'", ["message_id"]),
        (["--id", "{a}", "--timeout", "0s"], "--timeout: the time limit", ["attempt_timeout"]),
        (
            ["--id", "{a}", "--window", "10m", "--sessions"],
            "entity 'orders' has no sessions, but the options ask for --sessions;",
            ["not sessions", "(--sessions)"],
        ),
        (
            ["--id", "{a}", "--window", "20m"],
            "has a 10m duplicate-detection window, but the options ask for --window 20m",
            ["0:10:00", "timedelta"],
        ),
    ],
)
def test_errors_name_options_never_python(tmp_path, options, expected, python_names):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    result = publish(db, jsonl(tmp_path, [{"a": 1}]), "orders", *options)
    assert result.exit_code == 2
    assert expected in " ".join(result.output.split())
    for name in python_names:
        assert name not in result.output
    assert stored(db, "orders") == []


def test_a_connection_string_without_a_key_is_named_in_cli_words(tmp_path):
    url = "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=a"
    result = run(
        "publish", str(jsonl(tmp_path, [{"a": 1}])), "--to", url, "--entity", "e", "--id", "{a}"
    )
    assert result.exit_code == 2
    assert "the connection string has no SharedAccessKey part" in result.stderr
    assert "connection_string" not in result.stderr


def test_broker_create_names_the_differing_option(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    result = run("broker", "create", db, "--entity", "orders", "--topic", "--exist-ok")
    assert result.exit_code == 2
    assert "entity 'orders' is a queue, but the options ask for --topic" in result.stderr


# 5. --session-id on an entity without sessions.


def test_session_id_on_an_entity_without_sessions_is_refused(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    source = jsonl(tmp_path, [{"a": 1, "s": "x"}])
    result = publish(db, source, "orders", "--id", "{a}", "--session-id", "{s}")
    assert result.exit_code == 2
    assert "--session-id: entity 'orders' has no sessions" in result.stderr
    assert stored(db, "orders") == []


# 5. Refusals and reports a script or an operator needs.


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--id-cache-size", "5", "--window", "1h"], "--id-cache-size and --window conflict"),
        (["--no-dedup", "--window", "1h"], "--no-dedup and --window conflict"),
        (["--no-dedup", "--id-cache-size", "5"], "--no-dedup and --id-cache-size conflict"),
        (["--no-persist-id-cache"], "--no-persist-id-cache needs --id-cache-size"),
    ],
)
def test_conflicting_create_options_are_refused_leaving_no_file(tmp_path, options, expected):
    db = tmp_path / "b.db"
    result = run("broker", "create", str(db), "--entity", "e", *options)
    assert result.exit_code == 2 and expected in result.output
    assert not db.exists()


def test_broker_delete_removes_the_entity_and_its_ids(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    create(db, "keep")
    source = jsonl(tmp_path, [{"a": 1}])
    assert publish(db, source, "orders", "--id", "{a}").exit_code == 0
    refused = run("broker", "delete", db, "--entity", "orders", input="n\n")
    assert refused.exit_code != 0
    assert stored(db, "orders") == ["1"]
    deleted = run("broker", "delete", db, "--entity", "orders", "--yes")
    assert deleted.exit_code == 0 and "deleted 'orders'" in deleted.stdout
    with LocalBackend(db) as backend:
        assert [p.name for p in backend.entities()] == ["keep"]
    create(db, "orders")  # a new entity: its ids start afresh, as on Service Bus
    assert publish(db, source, "orders", "--id", "{a}").exit_code == 0
    assert stored(db, "orders") == ["1"]


def test_the_dead_letter_queue_can_be_peeked_and_received(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    assert (
        publish(db, jsonl(tmp_path, [{"a": 1}, {"a": 2}]), "orders", "--id", "{a}").exit_code == 0
    )
    with LocalBackend(db) as backend:
        [message] = backend.receive("orders", mode="peek_lock")
        assert message.lock_token is not None
        backend.dead_letter("orders", message.lock_token, reason="bad order")
    peeked = run("broker", "peek", db, "--entity", "orders", "--dead-letter")
    [line] = peeked.stdout.splitlines()
    assert json.loads(line)["dead_letter_reason"] == "bad order"
    taken = run("broker", "receive", db, "--entity", "orders", "--dead-letter")
    assert json.loads(taken.stdout)["message_id"] == "1"
    assert run("broker", "peek", db, "--entity", "orders", "--dead-letter").stdout == ""
    assert stored(db, "orders") == ["2"]


def test_a_missing_entity_is_named_with_the_existing_ones(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    create(db, "payments")
    for args in (
        ["broker", "peek", db, "--entity", "order"],
        ["broker", "stats", db, "--entity", "order"],
        ["publish", str(jsonl(tmp_path, [{"a": 1}])), "--to", f"local://{db}", "--entity",
         "order", "--id", "{a}"],
    ):  # fmt: skip
        result = run(*args)
        assert result.exit_code == 2, result.output
        assert "'order' does not exist" in result.stderr
        assert "'orders', 'payments'" in result.stderr


def test_publish_window_says_it_creates_a_missing_entity(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    result = publish(db, jsonl(tmp_path, [{"a": 1}]), "new", "--id", "{a}", "--window", "5m")
    assert result.exit_code == 0
    assert "entity 'new' does not exist: creating it as a queue with a 5m window" in result.stderr


def test_json_reports_a_refusal_too(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    result = publish(db, jsonl(tmp_path, [{"a": 1}]), "nope", "--id", "{a}", "--json")
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert report["status"] == "error" and report["exit_status"] == 2 and report["sent"] == 0
    assert "'nope' does not exist" in report["error"]


def test_demo_workdir_in_a_missing_directory_is_refused(tmp_path):
    result = run("demo", "--workdir", str(tmp_path / "missing" / "x"))
    assert result.exit_code == 2 and "does not exist; create it first" in result.stderr
    assert not (tmp_path / "missing").exists()


# 7. Help texts say what each command does, not what another one does.


def test_broker_help_speaks_of_broker_files_not_records():
    text = " ".join(run("broker", "--help").output.split())
    assert "Exit status: 0 done; 1 the broker file could not be read or written" in text
    assert "records" not in text and "re-run" not in text
    assert "delete" in text and "backup" in text


def test_json_commands_report_a_refusal_as_json(tmp_path):
    db = str(tmp_path / "b.db")
    create(db, "orders")
    for args in (
        ["broker", "stats", db, "--entity", "nope", "--json"],
        ["ledger", "stats", str(tmp_path / "missing.db"), "--json"],
        ["ledger", "in-doubt", str(tmp_path / "missing.db"), "--entity", "e", "--json"],
    ):
        result = run(*args)
        assert result.exit_code == 2, result.output
        report = json.loads(result.stdout)
        assert report["status"] == "error" and report["exit_status"] == 2
        assert report["error"] in result.stderr
