"""The root span of a ``sendonce`` command: the command line declares its own span at its
own edge, with the telemetry seam's tracer (``sendonce._telemetry``)."""

from __future__ import annotations

import os
from typing import Any

from .. import _telemetry

__all__ = ["CommandSpan", "command_span"]


class CommandSpan:
    """The root span of a ``sendonce`` command (INTERNAL, ``sendonce {command}``): current
    while the command runs, so each of its calls (every chunk ``publish`` sends) is in one
    trace. It carries the CLI conventions' ``process.*`` attributes, never the arguments
    (a connection string may be one)."""

    __slots__ = ("span", "telemetry", "token")

    def __init__(self, telemetry: _telemetry.Telemetry, command: str) -> None:
        self.telemetry = telemetry
        name = f"sendonce {command}".rstrip()
        attributes: dict[str, Any] = {
            "process.executable.name": "sendonce",
            "process.pid": os.getpid(),
        }
        if command:
            attributes["sendonce.command"] = command
        span: Any = telemetry._span(name, "INTERNAL", attributes)
        self.span = span
        self.token = telemetry._context.attach(telemetry._trace.set_span_in_context(span))

    def end(self, exit_code: int) -> None:
        """The command ended with ``exit_code``: an ERROR status when it is not 0."""
        span = self.span
        span.set_attribute("process.exit.code", exit_code)
        if exit_code:
            span.set_attribute(_telemetry.ERROR_TYPE, str(exit_code))
            trace = self.telemetry._trace
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"exit status {exit_code}"))
        try:
            self.telemetry._context.detach(self.token)
        finally:
            span.end()


def command_span(command: str) -> CommandSpan | None:
    """Open the root span of a CLI command (None while not traced)."""
    telemetry = _telemetry.active()
    if telemetry is None or telemetry.tracer is None:
        return None
    return CommandSpan(telemetry, command)
