"""Issue 34 items 9, 12 and 13 on the command line: a broker that does not report dropped
copies is said to, docs/cli.md's claims match what the commands do, every option has help."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from sendonce import EntityProfile
from sendonce.backends import LocalBackend
from sendonce.backends._base import reports_duplicates
from sendonce.cli import main

ROOT = Path(__file__).resolve().parents[3]
CLI_DOC = (ROOT / "docs" / "cli.md").read_text()


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _publish_table() -> str:
    section = CLI_DOC[CLI_DOC.index("## `sendonce publish`") : CLI_DOC.index("`publish` never")]
    return section


# -- item 9: duplicates a broker does not report -------------------------------------------


def test_the_backends_say_whether_they_report_duplicates(tmp_path: Path) -> None:
    with LocalBackend(tmp_path / "b.db") as local:
        assert reports_duplicates(local)
    assert not reports_duplicates(object())  # a backend that does not say: not reported


def test_a_rerun_over_amqp_says_duplicates_are_not_reported(tmp_path: Path) -> None:
    pytest.importorskip("proton")
    from sendonce.emulator import Emulator

    db = tmp_path / "broker.db"
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
    source = tmp_path / "o.jsonl"
    source.write_text("".join(json.dumps({"id": n}) + "\n" for n in range(20)))
    with Emulator(db, port=0) as emulator:
        publish = (
            "publish", str(source), "--to", emulator.connection_string, "--entity", "orders",
            "--id", "{id}", "--window", "10m", "--no-progress",
        )  # fmt: skip
        first = run(*publish)
        assert first.exit_code == 0, first.output
        again = run(*publish)
        assert again.exit_code == 0, again.output
        report = json.loads(run(*publish, "--json").stdout)
    assert "sent 20, duplicates: not reported by this broker" in again.stdout
    assert "duplicates 0" not in again.stdout
    assert (report["duplicates_reported"], report["sent"]) == (False, 20)
    with LocalBackend(db) as broker:
        assert sorted(broker.message_ids("orders"), key=int) == [str(n) for n in range(20)]


def test_a_rerun_on_the_local_broker_still_counts_its_duplicates(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
    source = tmp_path / "o.jsonl"
    source.write_text("".join(json.dumps({"id": n}) + "\n" for n in range(5)))
    publish = ("publish", str(source), "--to", f"local://{db}", "--entity", "orders", "--id",
               "{id}", "--no-progress")  # fmt: skip
    assert run(*publish).exit_code == 0
    assert "sent 0, duplicates 5, failed 0" in run(*publish).stdout
    assert json.loads(run(*publish, "--json").stdout)["duplicates_reported"] is True


def test_the_cli_page_says_what_an_amqp_rerun_prints() -> None:
    flat = re.sub(r"\s+", " ", CLI_DOC)
    assert "sent 250, duplicates: not reported by this broker" in flat


# -- item 12: docs/cli.md says what the commands do ----------------------------------------


def test_a_window_conflict_is_exit_2_as_the_publish_table_says(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
    source = tmp_path / "o.jsonl"
    source.write_text('{"id": 1}\n')
    done = run("publish", str(source), "--to", f"local://{db}", "--entity", "orders", "--id",
               "{id}", "--window", "20s", "--no-progress")  # fmt: skip
    assert done.exit_code == 2
    row = next(line for line in _publish_table().splitlines() if line.startswith("| `--window"))
    assert "refused (exit 2" in row and "exit 1" not in row


def test_every_publish_option_is_in_the_publish_table() -> None:
    command = main.get_command(click.Context(main), "publish")
    assert command is not None
    table = _publish_table()
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            names = [*param.opts, *param.secondary_opts]
            assert any(f"`{n}" in table for n in names), f"{names} are not in the table"


def test_an_overlong_id_is_answered_in_the_commands_words(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
    source = tmp_path / "o.jsonl"
    source.write_text(json.dumps({"id": "x" * 200}) + "\n")
    done = run("publish", str(source), "--to", f"local://{db}", "--entity", "orders", "--id",
               "{id}", "--no-progress")  # fmt: skip
    assert done.exit_code == 2
    assert "over the limit of 128" in done.stderr
    assert "overflow=" not in done.output and "give --id a template" in done.stderr


# -- item 13: help text and one spelling of errors -----------------------------------------


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(main)
    found: list[tuple[str, click.Command]] = []

    def walk(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                walk(sub, f"{path} {name}")
        else:
            found.append((path, command))

    walk(main, "sendonce")
    return found


def test_every_option_of_every_command_has_help_text() -> None:
    missing = [
        f"{path} {max(p.opts, key=len)}"
        for path, command in _commands()
        for p in command.params
        if isinstance(p, click.Option) and p.name != "help" and not p.help
    ]
    assert missing == []
    assert all(command.help for _, command in _commands())


def test_demo_help_says_what_it_does_and_its_exit_statuses() -> None:
    done = run("demo", "--help")
    assert done.exit_code == 0
    flat = re.sub(r"\s+", " ", done.stdout)
    assert "killed with SIGKILL" in flat and "Exit status: 0 every order" in flat
    assert "--spark" in flat and "Java 17" in flat


def test_errors_are_spelled_one_way(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    with LocalBackend(db) as broker:
        broker.create_entity(EntityProfile("orders"))
    source = tmp_path / "o.jsonl"
    source.write_text("not json\n")
    bad_line = run("publish", str(source), "--to", f"local://{db}", "--entity", "orders",
                   "--id", "{id}", "--no-progress")  # fmt: skip
    usage = run("publish", str(source), "--to", f"local://{db}", "--id", "{id}")
    for done in (bad_line, usage):
        assert done.exit_code == 2
        assert "Error: " in done.stderr and "error: " not in done.stderr
