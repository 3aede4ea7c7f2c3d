"""The end of ``sendonce publish``: what the sending pass accounted for, and its report.

Printed on every exit that got as far as sending (done, failed, stopped, Ctrl-C), as
text or with ``--json`` as one object, with the limit of a re-run's safety.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

import click

from .._message import Message
from .._sender import SendReport
from ..errors import InDoubtError, NotSentError, NotStoredError, redact
from ._doubt_rule import Rule
from ._rerun import RerunPromise
from ._validation import MAX_SHOWN
from ._words import EXIT_FAILED, cli_text, format_duration

__all__ = ["Outcome", "Report", "unreachable_broker"]


@dataclass
class Outcome:
    """What the sending pass accounted for."""

    records: int = 0
    sent: int = 0
    duplicates: int = 0
    from_ledger: int = 0
    """Records not sent because the ledger says an earlier run sent them (in ``duplicates``)."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    in_doubt: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return len(self.failures)

    @property
    def stored(self) -> int:
        return self.sent + self.duplicates

    def add(self, report: SendReport, chunk: list[tuple[Message, int]]) -> None:
        self.records += len(chunk)
        self.sent += report.sent
        self.duplicates += report.duplicates
        self.from_ledger += len(report.from_ledger)
        if not report.failures:
            return
        line_of: dict[tuple[str, str | None], int] = {}
        for message, line in chunk:
            line_of.setdefault((message.message_id, message.partition_key), line)
        for failure in report.failures:
            in_doubt = isinstance(failure.error, InDoubtError)
            self.failures.append(
                {
                    "line": line_of.get((failure.message_id, failure.partition_key)),
                    "message_id": failure.message_id,
                    "error": cli_text(failure.error),
                    "in_doubt": in_doubt,
                }
            )
            if in_doubt:
                self.in_doubt.append(failure.message_id)


class Report:
    """The end of every run that got as far as sending: the summary, then the exit status.

    Printed on every exit (done, failed, stopped, Ctrl-C), as text or with ``--json``
    as one object, so a script always gets a report.
    """

    def __init__(
        self,
        entity: str,
        as_json: bool,
        promise: RerunPromise,
        broker: str | None = None,
        duplicates_reported: bool = True,
    ) -> None:
        self.entity = entity
        self.as_json = as_json
        self.promise = promise
        self.broker = broker
        """The --to url (shown redacted), for the advice on keys in doubt."""
        self.duplicates_reported = duplicates_reported
        """The backend's acks say which copies the broker dropped (``reports_duplicates``);
        when not, a copy it dropped counts as sent, and the report says so."""

    def finish(
        self,
        outcome: Outcome,
        total: int,
        *,
        status: str | None = None,
        code: int | None = None,
        error: str | None = None,
    ) -> NoReturn:
        if code is None:
            code = EXIT_FAILED if outcome.failures else 0
        if status is None:
            status = "failed" if code else "ok"
        if self.as_json:
            data: dict[str, Any] = {
                "status": status,
                "entity": self.entity,
                "records": total,
                "sent": outcome.sent,
                "duplicates": outcome.duplicates,
                "duplicates_reported": self.duplicates_reported,
                "from_ledger": outcome.from_ledger,
                "failed": outcome.failed,
                "in_doubt": outcome.in_doubt,
                "failures": outcome.failures,
            }
            if error is not None:
                data["error"] = error
            if status == "interrupted":
                data["unaccounted"] = total - outcome.records
            data.update(self.promise.as_json())
            data["exit_status"] = code
            click.echo(json.dumps(data, ensure_ascii=False))
        elif status in ("ok", "failed"):
            click.echo(
                f"{total} record(s) to {self.entity!r}: sent {outcome.sent}, "
                f"{self._duplicates(outcome)}, failed {outcome.failed}"
            )
        self._failures(outcome)
        sys.exit(code)

    def _duplicates(self, outcome: Outcome) -> str:
        skipped = (
            f"{outcome.from_ledger} skipped: the ledger says an earlier run sent them"
            if outcome.from_ledger
            else ""
        )
        if self.duplicates_reported:
            return f"duplicates {outcome.duplicates}" + (f" ({skipped})" if skipped else "")
        unknown = "copies the broker dropped are not reported by this broker: they count as sent"
        if skipped:
            return f"duplicates {outcome.duplicates} ({skipped}; {unknown})"
        return "duplicates: not reported by this broker (a copy it dropped counts as sent)"

    def _failures(self, outcome: Outcome) -> None:
        for failure in outcome.failures[:MAX_SHOWN]:
            click.echo(
                f"failed: line {failure['line']}: {failure['message_id']!r}: {failure['error']}",
                err=True,
            )
        if outcome.failed > MAX_SHOWN:
            click.echo(f"failed: ... and {outcome.failed - MAX_SHOWN} more", err=True)
        if outcome.in_doubt:
            click.echo(self._in_doubt_advice(len(outcome.in_doubt)), err=True)
        elif outcome.failures and not outcome.stored:
            click.echo("Nothing was stored: running the same command again is safe.", err=True)
        elif outcome.failures:
            click.echo("The failed records were not stored. " + self.promise.text(), err=True)

    def _in_doubt_advice(self, count: int) -> str:
        promise = self.promise
        if promise.ledger is None:
            return f"{count} message(s) are in doubt. " + promise.text()
        rule = Rule.of(promise.profile)
        if rule.kind == "window" and rule.window is not None and not promise.window_trusted:
            settle = (
                f"The entity's {format_duration(rule.window)} window was declared (--window), "
                "not read from the broker, so running the same command again does not resend "
                "them (were the declaration wrong, a copy would be stored twice); instead"
            )
        elif rule.kind == "window" and rule.window is not None:
            settle = (
                f"Those first attempted less than {format_duration(rule.window)} ago (the "
                "duplicate-detection window) are resent by running the same command again, "
                "and the broker drops a copy; for the others"
            )
        else:
            settle = (
                f"The entity has {rule.words()}, so running the same command again does not "
                "resend them (a copy could be stored twice); instead"
            )
        ledger, broker = redact(promise.ledger), redact(self.broker or "URL")
        if broker.lower().startswith(("amqp://", "amqps://")):  # reconcile cannot read it
            compare = (
                "browse the address's queues for their ids (reconcile cannot read an Artemis "
                "broker yet), then `sendonce ledger confirm` (the broker has it) or `sendonce "
                "ledger release` (it has not: the next run sends it) each one; `sendonce ledger "
            )
        else:
            compare = (
                f"compare them with the broker: `sendonce ledger reconcile {ledger} --entity "
                f"{self.entity} --broker {broker}` (--apply records what it shows), then "
                "`sendonce ledger confirm` (the broker has it) or `sendonce ledger release` (it "
                "has not: the next run sends it) what is left; `sendonce ledger "
            )
        return (
            f"{count} message(s) are in doubt: the ledger holds a send of each that was never "
            f"confirmed. {settle}, {compare}"
            f"in-doubt {ledger} --entity {self.entity}` lists them (docs/ledger.md). Or give "
            "--in-doubt resend (at-least-once: they may be delivered twice)."
        )


def unreachable_broker(sent: SendReport) -> str | None:
    """The broker could not be reached for any record of a call (every attempt of every
    transfer failed before the broker): one sentence saying so, else None."""
    if not sent.failures or sent.sent or sent.duplicates:
        return None
    errors = [f.error for f in sent.failures]
    if not all(
        isinstance(e, NotStoredError) and isinstance(e.last_error, NotSentError) for e in errors
    ):
        return None
    first = errors[0]
    assert isinstance(first, NotStoredError) and first.last_error is not None
    return (
        f"the broker could not be reached (none of {first.attempts} attempt(s) over "
        f"{first.elapsed.total_seconds():.1f}s reached it; last error: "
        f"{cli_text(first.last_error)})"
        ": nothing was stored"
    )
