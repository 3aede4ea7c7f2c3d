"""The ``sendonce`` command. Each subcommand group lives in its own module of this package."""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from .._extras import EXTRA_OF_MODULE, hint
from ..errors import ConfigurationError
from ._words import EXIT_CODES_HELP, InputError, cli_text, echo_json_error, reported_as_json

__all__ = ["main"]

# (module, attribute, extra): each is a click command or group; a command whose
# optional extra is missing is still listed, and says what to install.
_SUBCOMMANDS = [
    ("sendonce.cli._broker", "broker", None),
    ("sendonce.cli._publish", "publish", None),
    ("sendonce.cli._ledger", "ledger", None),
    ("sendonce.cli._outbox", "relay", "outbox"),
    ("sendonce.cli._outbox", "outbox", "outbox"),
    ("sendonce.emulator._cli", "emulator", "emulator"),
    ("sendonce.cli._demo", "demo", None),
]
_LOG_LEVELS = ["debug", "info", "warning", "error"]


class _Sendonce(click.Group):
    """The top-level group: with ``--json``, a refusal click raises while reading the
    options (a missing file, a bad value) is one JSON object on stdout too, as every other
    refusal of every command is (``status``, ``error``, ``exit_status``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["sendonce.json"] = "--json" in args
        rest = super().parse_args(ctx, args)
        ctx.meta[_COMMAND] = self._command_name(ctx, [*ctx.protected_args, *ctx.args])
        return rest

    def _command_name(self, ctx: click.Context, args: list[str]) -> str:
        """``publish``, ``ledger confirm``: the command the arguments name (for the root
        span's name; never an argument's value, which may hold a secret)."""
        words: list[str] = []
        group: click.Command | None = self
        for arg in args:
            if not isinstance(group, click.Group) or arg.startswith("-"):
                break
            command = group.get_command(ctx, arg)
            if command is None:
                break
            words.append(arg)
            group = command
        return " ".join(words)

    def invoke(self, ctx: click.Context) -> object:
        code = 0
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            code = exc.exit_code
            if ctx.meta.get("sendonce.json") and not reported_as_json(exc):
                echo_json_error("error", exc.exit_code, exc.format_message())
            raise
        except click.exceptions.Exit as exc:
            code = exc.exit_code
            raise
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            raise
        except BaseException:
            code = 1
            raise
        finally:
            root = ctx.meta.pop(_ROOT_SPAN, None)
            if root is not None:
                root.end(code)


@click.group(
    cls=_Sendonce,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EXIT_CODES_HELP,
)
@click.version_option(package_name="sendonce")
@click.option(
    "--log-level",
    type=click.Choice(_LOG_LEVELS, case_sensitive=False),
    default="warning",
    show_default=True,
    help="Log messages of the library at this level and above on stderr.",
)
@click.option(
    "--otel",
    type=click.Choice(["otlp", "console"], case_sensitive=False),
    default=None,
    metavar="otlp|console",
    help="Export traces and metrics of what the command does (OpenTelemetry), one trace per "
    "command: over OTLP (to OTEL_EXPORTER_OTLP_ENDPOINT, by default http://localhost:4318) or "
    "to the console (stderr). Without it, OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER turn "
    "it on, each for its signal (one left unset follows the other). Needs the OpenTelemetry "
    "SDK, and for OTLP its exporter (see docs/observability.md).",
)
def main(log_level: str, otel: str | None) -> None:
    """Idempotent message publishing: every business message exactly once."""
    logger = logging.getLogger("sendonce")
    for old in [h for h in logger.handlers if getattr(h, "_sendonce_cli", False)]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler._sendonce_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(log_level.upper())
    if otel is not None or any(os.environ.get(v, "").strip() for v in _OTEL_VARIABLES):
        _export_telemetry(otel)


_OTEL_VARIABLES = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER")
_COMMAND = "sendonce.command"
_ROOT_SPAN = "sendonce.root_span"


def _export_telemetry(exporter: str | None) -> None:
    """Set up the OpenTelemetry SDK for this process, flushed when the command ends, and
    open the command's root span: every span of the command is in its trace."""
    from ..telemetry import configure
    from ._otel import command_span

    if exporter is not None:
        source = "--otel"
    else:  # the variables turned it on: name them, not an option the user did not give
        source = ", ".join(
            f"{v}={os.environ[v].strip()}" for v in _OTEL_VARIABLES if os.environ.get(v, "").strip()
        )
    try:
        exporting = configure(None if exporter is None else exporter.lower())
    except ConfigurationError as exc:
        if getattr(exc, "field", None) == "exporter":  # it names the value it refuses
            raise InputError(cli_text(exc)) from None
        raise InputError(f"{source}: {cli_text(exc)}") from None
    ctx = click.get_current_context()
    ctx.call_on_close(exporting.shutdown)  # runs after the root span has ended
    ctx.meta[_ROOT_SPAN] = command_span(ctx.meta.get(_COMMAND) or "")


def _missing(name: str, extra: str, exc: ModuleNotFoundError) -> click.Command:
    text = hint(f"sendonce {name}", extra)

    @click.command(
        name,
        help=f"(not installed: pip install 'sendonce[{extra}]')",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )
    def missing() -> None:
        raise InputError(f"{text} (module {exc.name!r} is not installed)")

    return missing


for _module, _name, _extra in _SUBCOMMANDS:
    try:
        _command = getattr(importlib.import_module(_module), _name)
    except ModuleNotFoundError as _exc:  # an optional extra is not installed
        _top = (_exc.name or "").partition(".")[0]
        if _extra is None or _top not in EXTRA_OF_MODULE:
            raise
        _command = _missing(_name, _extra, _exc)
    main.add_command(_command)
