"""``sendonce emulator``: serve a broker file to Service Bus clients until Ctrl-C."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from ..errors import ConfigurationError

__all__ = ["emulator"]


@click.command("emulator")
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
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except OSError as exc:
        reason = exc.strerror or exc
        raise click.ClickException(f"cannot listen on {host}:{port}: {reason}") from exc
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
