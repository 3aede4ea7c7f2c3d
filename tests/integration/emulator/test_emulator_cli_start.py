"""`sendonce emulator` tells why it could not start: a busy port, an unusable broker file, or
another system error, each with its own message and exit status."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from pytest_mock import MockerFixture

from sendonce.cli import main
from sendonce.emulator._cli import (
    EXIT_BROKER_FILE,
    EXIT_FAILED,
    EXIT_PORT_IN_USE,
    EXIT_USAGE,
)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from sendonce.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "emulator", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


def test_a_port_in_use_is_named_as_such(tmp_path: Path, busy_port: int) -> None:
    proc = _run("--db", str(tmp_path / "broker.db"), "--port", str(busy_port))
    assert proc.returncode == EXIT_PORT_IN_USE, proc.stderr
    assert f"port {busy_port} on 127.0.0.1 is already in use" in proc.stderr
    assert "--port" in proc.stderr
    assert "broker file" not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_directory_blames_the_broker_file_not_the_socket(tmp_path: Path) -> None:
    db = tmp_path / "missing" / "broker.db"
    proc = _run("--db", str(db), "--port", "0")
    assert proc.returncode == EXIT_BROKER_FILE, proc.stderr
    assert "does not exist" in proc.stderr
    assert str(db) in proc.stderr
    assert "listen" not in proc.stderr and "port" not in proc.stderr
    assert not db.parent.exists()


def test_a_file_that_is_not_a_broker_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "notes.txt"
    db.write_text("not a database\n")
    proc = _run("--db", str(db), "--port", "0")
    assert proc.returncode == EXIT_BROKER_FILE, proc.stderr
    assert "not a SQLite database" in proc.stderr
    assert "`sendonce broker create`" in proc.stderr  # the advice is whole
    assert db.read_text() == "not a database\n"


def test_a_broker_file_the_user_may_not_write_is_named(
    tmp_path: Path, mocker: MockerFixture
) -> None:
    # Root may write anywhere: the refusal of the .lock beside the file is what the OS gives.
    import os

    real_open = os.open
    db = tmp_path / "broker.db"

    def refuse_lock(path: str, *args: object, **kwargs: object) -> int:
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    mocker.patch("os.open", side_effect=refuse_lock)
    result = CliRunner().invoke(main, ["emulator", "--db", str(db), "--port", "0"])
    assert result.exit_code == EXIT_BROKER_FILE, result.output
    assert "may not write" in result.stderr
    assert str(db) in result.stderr


def test_another_os_error_is_reported_with_its_reason(
    tmp_path: Path, mocker: MockerFixture
) -> None:
    # No real peer refuses a loopback listen this way for root: the OS error is injected.
    mocker.patch(
        "sendonce.emulator._server.Listener",
        side_effect=OSError(errno.EACCES, "Permission denied"),
    )
    result = CliRunner().invoke(main, ["emulator", "--db", str(tmp_path / "b.db"), "--port", "80"])
    assert result.exit_code == EXIT_FAILED, result.output
    assert "cannot start the emulator on 127.0.0.1:80: Permission denied" in result.stderr
    assert "in use" not in result.stderr and "broker file" not in result.stderr


def test_a_bad_command_line_is_a_usage_error(tmp_path: Path) -> None:
    proc = _run("--db", str(tmp_path / "b.db"), "--host", "10.0.0.1")
    assert proc.returncode == EXIT_USAGE
    assert "loopback" in proc.stderr


def test_help_lists_the_exit_statuses() -> None:
    result = CliRunner().invoke(main, ["emulator", "--help"])
    assert result.exit_code == 0
    assert "3 the port is already in use" in result.output
    assert "4 the broker file cannot be used" in result.output
