"""Issue 23 item 2: CSV files as spreadsheets write them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce.backends.local import LocalBackend
from sendonce.cli import main


def run(*args: str, input: bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "b.db")
    assert run("broker", "create", path, "--entity", "orders").exit_code == 0
    return path


def publish(db: str, source: Path | str, *extra: str, input: bytes | None = None) -> Result:
    return run(
        "publish", str(source), "--to", f"local://{db}", "--entity", "orders", "--id",
        "{order_id}", "--no-progress", *extra, input=input,
    )  # fmt: skip


def bodies(db: str) -> dict[str, dict[str, str]]:
    with LocalBackend(db) as backend:
        return {m.message_id: json.loads(m.body) for m in backend.peek("orders", max_messages=99)}


def test_a_field_over_131072_characters_is_sent_when_the_record_fits(tmp_path, db):
    source = tmp_path / "big.csv"
    source.write_text("order_id,note\n1," + "x" * 200_000 + "\n")
    result = publish(db, source)
    assert result.exit_code == 0, result.stderr
    assert len(bodies(db)["1"]["note"]) == 200_000


def test_a_field_over_the_message_size_is_named_as_such(tmp_path, db):
    source = tmp_path / "huge.csv"
    source.write_text("order_id,note\n1," + "x" * 300_000 + "\n")
    result = publish(db, source)
    assert result.exit_code == 2
    assert "line 2: a field is longer than 262144 characters" in result.stderr
    assert "malformed" not in result.stderr


@pytest.mark.parametrize("encoding", ["cp1252", "utf-16"])
def test_other_encodings_are_read_with_encoding(tmp_path, db, encoding):
    source = tmp_path / "export.csv"
    source.write_bytes("order_id,customer\n1,Müller \u2013 café\n".encode(encoding))
    refused = publish(db, source)
    assert refused.exit_code == 2 and "--encoding" in refused.stderr
    if encoding == "utf-16":
        assert "UTF-16 byte-order mark: give --encoding utf-16" in refused.stderr
    result = publish(db, source, "--encoding", encoding)
    assert result.exit_code == 0, result.stderr
    assert bodies(db)["1"]["customer"] == "Müller \u2013 café"


def test_an_unknown_encoding_is_refused(tmp_path, db):
    (tmp_path / "x.csv").write_text("order_id\n1\n")
    result = publish(db, tmp_path / "x.csv", "--encoding", "klingon")
    assert result.exit_code == 2 and "--encoding" in result.stderr


def test_a_semicolon_file_is_pointed_to_delimiter_and_read_with_it(tmp_path, db):
    source = tmp_path / "semi.csv"
    source.write_text("order_id;amount\n1;5,50\n2;7,00\n")
    refused = publish(db, source)
    assert refused.exit_code == 2
    assert "the header looks separated by ';': give --delimiter ';'" in refused.stderr
    result = publish(db, source, "--delimiter", ";")
    assert result.exit_code == 0, result.stderr
    assert bodies(db)["1"] == {"order_id": "1", "amount": "5,50"}
    tabbed = tmp_path / "tab.csv"
    tabbed.write_text("order_id\tamount\n3\t1\n")
    assert publish(db, tabbed, "--delimiter", "tab").exit_code == 0
    assert "3" in bodies(db)


def test_csv_piped_without_format_gets_a_hint(db):
    result = publish(db, "-", input=b"order_id,year\n1,2017\n")
    assert result.exit_code == 2
    assert "standard input was read as JSON Lines" in result.stderr
    assert "give --format csv" in result.stderr
    assert publish(db, "-", "--format", "csv", input=b"order_id,year\n1,2017\n").exit_code == 0


def test_surrounding_spaces_are_noted_or_stripped(tmp_path, db):
    source = tmp_path / "spaced.csv"
    source.write_text("order_id, amount\n 77 ,5\n77,5\n")
    kept = publish(db, source)
    assert kept.exit_code == 0
    assert "1 record(s) have values with surrounding spaces (the first at line 2)" in kept.stderr
    assert "--strip" in kept.stderr
    assert sorted(bodies(db)) == [" 77 ", "77"]
    run("broker", "purge", db, "--entity", "orders")
    db2 = str(tmp_path / "b2.db")
    assert run("broker", "create", db2, "--entity", "orders").exit_code == 0
    stripped = publish(db2, source, "--strip", "--json")
    report = json.loads(stripped.stdout)
    assert (report["sent"], report["duplicates"]) == (1, 1)
    assert bodies(db2) == {"77": {"order_id": "77", "amount": "5"}}


def test_csv_options_on_json_lines_are_refused(tmp_path, db):
    (tmp_path / "x.jsonl").write_text('{"order_id": 1}\n')
    result = publish(db, tmp_path / "x.jsonl", "--delimiter", ";")
    assert result.exit_code == 2 and "--delimiter applies to CSV input" in result.stderr
