"""Issue 23 item 6: a ``local:`` url is refused where the parser would have to guess."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from sendonce import ConfigurationError
from sendonce.backends import connect
from sendonce.cli import main


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("run#3.db", "contains '#', which would end the file name there"),
        (
            "what?.db",
            "unknown option '.db' (the options are busy_timeout, create, durability, "
            "read_only); a '?' in a file name must be written %3F",
        ),
        ("b.db?path=x", "unknown option 'path'"),
        ("b.db?busy_timeout=1e308", "option 'busy_timeout' must be a number of seconds"),
        ("b.db?busy_timeout=nan", "option 'busy_timeout' must be a number of seconds"),
        ("b.db?durability=", "option 'durability' has no value"),
        ("b.db?durability=full&durability=normal", "option 'durability' is given twice"),
        ("b%00.db", "the file name contains a NUL character"),
        ("b.db?durability=f%00ull", "option 'durability' contains a NUL character"),
    ],
)  # fmt: skip
def test_what_the_parser_does_not_understand_is_refused(tmp_path: Path, tail, expected):
    with pytest.raises(ConfigurationError) as refused:
        connect(f"local://{tmp_path}/{tail}")
    assert expected in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # no broker opened under another name


def test_escaped_characters_name_the_file_they_say(tmp_path: Path):
    backend = connect(f"local://{tmp_path}/run%233%3F.db?durability=full")
    try:
        assert Path(backend.path).name == "run#3?.db"  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_the_cli_reports_a_bad_url_naming_the_option(tmp_path: Path):
    source = tmp_path / "o.jsonl"
    source.write_text('{"a": 1}\n')
    result = CliRunner().invoke(
        main,
        ["publish", str(source), "--to", f"local://{tmp_path}/b.db?busy_timeout=1e308",
         "--entity", "e", "--id", "{a}"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--to:" in result.stderr and "'busy_timeout'" in result.stderr
    assert "Traceback" not in result.stderr and "OverflowError" not in result.stderr


# Library edges met through the CLI's users.


def test_a_dataclass_record_is_named_as_such():
    import dataclasses

    from sendonce import MessageIdError, MessageIdTemplate

    @dataclasses.dataclass
    class Order:
        order_id: int

    with pytest.raises(MessageIdError) as refused:
        MessageIdTemplate("{order_id}").build(Order(1))
    assert "the record is a Order, which cannot be read by field name" in str(refused.value)
    assert "dataclasses.asdict(record)" in str(refused.value)
    assert MessageIdTemplate("{order_id}").build(dataclasses.asdict(Order(1))) == "1"


@pytest.mark.parametrize(
    ("window", "shown"),
    [(timedelta(seconds=10), "10 seconds"), (timedelta(days=8), "8 days"),
     (timedelta(days=7, minutes=1), "7 days 1 minute")],
)  # fmt: skip
def test_window_errors_read_as_durations(window, shown):
    from sendonce import EntityProfile

    with pytest.raises(ConfigurationError) as refused:
        EntityProfile("orders", duplicate_detection_window=window)
    text = str(refused.value)
    assert f"{shown} is outside the broker's range 20 seconds to 7 days" in text
    assert "0:00" not in text and "days," not in text
