"""The ``sendonce`` command. Each subcommand group lives in its own module of this package."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from .._extras import EXTRA_OF_MODULE, hint
from ._words import EXIT_CODES_HELP, InputError

__all__ = ["main"]

# (module, attribute, extra): each is a click command or group; a command whose
# optional extra is missing is still listed, and says what to install.
_SUBCOMMANDS = [
    ("sendonce.cli._broker", "broker", None),
    ("sendonce.cli._publish", "publish", None),
    ("sendonce.cli._ledger", "ledger", None),
    ("sendonce.emulator._cli", "emulator", "emulator"),
    ("sendonce.cli._demo", "demo", None),
]
_LOG_LEVELS = ["debug", "info", "warning", "error"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(package_name="sendonce")
@click.option(
    "--log-level",
    type=click.Choice(_LOG_LEVELS, case_sensitive=False),
    default="warning",
    show_default=True,
    help="Log messages of the library at this level and above on stderr.",
)
def main(log_level: str) -> None:
    """Idempotent message publishing: every business message exactly once."""
    logger = logging.getLogger("sendonce")
    for old in [h for h in logger.handlers if getattr(h, "_sendonce_cli", False)]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler._sendonce_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(log_level.upper())


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
