"""``sendonce emulator``: serve a broker file to Service Bus clients until Ctrl-C.

A start that fails says which of its two resources failed, each with its own exit
status, so a script (or a person) knows whether to pick another port or fix the file.
"""

from __future__ import annotations

import errno
import signal
import sqlite3
import threading
from types import FrameType

import click

from ..errors import ConfigurationError

__all__ = [
    "EXIT_BROKER_FILE",
    "EXIT_FAILED",
    "EXIT_PORT_IN_USE",
    "EXIT_USAGE",
    "emulator",
]

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PORT_IN_USE = 3
EXIT_BROKER_FILE = 4

EXIT_HELP = (
    "Exit status: 0 stopped by Ctrl-C or SIGTERM; 1 could not start for another reason "
    "(the system's error is printed) or stopped unexpectedly; 2 invalid command line; "
    "3 the port is already in use; 4 the broker file cannot be used (its directory is "
    "missing, it may not be written, it is not a sendonce broker or it is damaged)."
)


class _PortInUse(click.ClickException):
    """Another process listens on the port: pick another one."""

    exit_code = EXIT_PORT_IN_USE


class _BrokerFileUnusable(click.ClickException):
    """The broker file (or its directory, or its ``.lock``) is what must be fixed."""

    exit_code = EXIT_BROKER_FILE


class _CannotStart(click.ClickException):
    """Any other system error: its reason is printed as the system gave it."""

    exit_code = EXIT_FAILED


def _start_failure(exc: BaseException, db: str, host: str, port: int) -> click.ClickException:
    """Tell a broker file that cannot be used from a busy port from any other failure."""
    if isinstance(exc, ConfigurationError):
        if exc.field in ("path", "db_path"):
            return _BrokerFileUnusable(f"cannot serve {db!r}: {exc}")
        return click.UsageError(str(exc))
    if isinstance(exc, sqlite3.Error):  # opening the file failed below sendonce's checks
        return _BrokerFileUnusable(f"cannot serve {db!r}: the broker file: {exc}")
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            return _PortInUse(
                f"port {port} on {host} is already in use (another emulator?): stop what "
                "listens there, or pick another port with --port (0 picks a free one)"
            )
        if exc.filename is not None and _names_broker_file(str(exc.filename), db):
            return _BrokerFileUnusable(f"cannot serve {db!r}: {exc.filename!r}: {reason}")
        return _CannotStart(f"cannot start the emulator on {host}:{port}: {reason}")
    raise exc


def _names_broker_file(filename: str, db: str) -> bool:
    """The broker file or one beside it (``-wal``, ``-shm``, ``.lock``)."""
    return filename.startswith(db)


@click.command("emulator", epilog=EXIT_HELP)
@click.option(
    "--db",
    "db",
    required=True,
    type=click.Path(dir_okay=False),
    help="The local broker file (created if missing).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=5672,
    show_default=True,
    help="TCP port (0 picks a free one).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="IPv4 loopback address to bind (127.0.0.1 or localhost).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1),
    default=None,
    help="Refuse clients beyond this many connections "
    "[default: what the process's file descriptor limit leaves room for].",
)
@click.option(
    "--handshake-timeout",
    type=click.FloatRange(0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a client has to complete its AMQP open.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0, min_open=True),
    default=240.0,
    show_default=True,
    help="Seconds of silence after which a connection is closed (advertised in the open).",
)
def emulator(
    db: str,
    port: int,
    host: str,
    max_connections: int | None,
    handshake_timeout: float,
    idle_timeout: float,
) -> None:
    """Serve a local broker file over AMQP for the azure-servicebus client.

    Prints the connection string, then runs in the foreground until Ctrl-C.
    """
    from ._server import Emulator

    try:
        server = Emulator(
            db,
            host=host,
            port=port,
            max_connections=max_connections,
            handshake_timeout=handshake_timeout,
            idle_timeout=idle_timeout,
        )
        server.start()
    except (ConfigurationError, OSError, sqlite3.Error) as exc:
        raise _start_failure(exc, db, host, port) from exc
    stopped = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    previous = signal.signal(signal.SIGTERM, _stop)
    click.echo(f"serving {db} on {server.host}:{server.port}")
    click.echo(server.connection_string)
    try:
        while server.running and not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        died = not server.running and not stopped.is_set()
        server.stop()
        click.echo("stopped")
    if died:
        raise click.ClickException("the emulator stopped unexpectedly (see the log)")
