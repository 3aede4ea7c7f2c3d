"""The root span of a ``sendonce`` command: the command line declares its own span at its
own edge, on the telemetry core (``sendonce.telemetry._core``), which knows no feature."""

from __future__ import annotations

import os
from typing import Any

from ..telemetry import _core

__all__ = ["CommandSpan", "command_span"]


class CommandSpan:
    """The root span of a ``sendonce`` command (INTERNAL, ``sendonce {command}``): current
    while the command runs, so each of its calls (every chunk ``publish`` sends) is in one
    trace. It carries the CLI conventions' ``process.*`` attributes, never the arguments
    (a connection string may be one)."""

    __slots__ = ("core", "span", "token")

    def __init__(self, core: _core.Core, command: str) -> None:
        self.core = core
        name = f"sendonce {command}".rstrip()
        attributes: dict[str, Any] = {
            "process.executable.name": "sendonce",
            "process.pid": os.getpid(),
        }
        if command:
            attributes["sendonce.command"] = command
        span: Any = core.span(name, "INTERNAL", attributes)
        self.span = span
        self.token = core.context.attach(core.trace.set_span_in_context(span))

    def end(self, exit_code: int) -> None:
        """The command ended with ``exit_code``: an ERROR status when it is not 0."""
        span = self.span
        span.set_attribute("process.exit.code", exit_code)
        if exit_code:
            span.set_attribute("error.type", str(exit_code))
            trace = self.core.trace
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"exit status {exit_code}"))
        try:
            self.core.context.detach(self.token)
        finally:
            span.end()


def command_span(command: str) -> CommandSpan | None:
    """Open the root span of a CLI command (None while not traced)."""
    core = _core.active()
    if core is None or core.tracer is None:
        return None
    return CommandSpan(core, command)
