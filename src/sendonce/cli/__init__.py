"""The ``sendonce`` command. Each subcommand group lives in its own module of this package."""

from __future__ import annotations

import importlib

import click

__all__ = ["main"]

# (module, attribute): each is a click command or group, loaded if present.
_SUBCOMMANDS = [
    ("sendonce.cli._broker", "broker"),
    ("sendonce.cli._publish", "publish"),
    ("sendonce.emulator._cli", "emulator"),
    ("sendonce.cli._demo", "demo"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sendonce")
def main() -> None:
    """Idempotent message publishing: every business message exactly once."""


for _module, _name in _SUBCOMMANDS:
    try:
        _command = getattr(importlib.import_module(_module), _name)
    except ModuleNotFoundError as _exc:  # an optional extra is not installed
        if _exc.name is not None and _exc.name.startswith("sendonce"):
            continue
        continue
    main.add_command(_command)
