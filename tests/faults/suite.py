"""One seed end to end: generate, run, check, and explain a failure so it can be replayed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .checker import Verdict, check
from .runner import RunResult, run_schedule
from .schedule import dumps, generate, summary

REPLAY = "python -m tests.faults.replay {seed}    (or: pytest tests/faults --seed {seed})"

DEFAULT_SEEDS = tuple(range(1, 25))
"""The seeds of the default run (about 90 s on a 2-core machine)."""
SLOW_SEEDS = tuple(range(1000, 1300))
"""The seeds of ``pytest -m slow tests/faults``."""


@dataclass
class Outcome:
    seed: int
    result: RunResult
    verdict: Verdict

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.result.errors

    def explain(self, *, verbose: bool = False) -> str:
        """Everything needed to understand and replay a run."""
        s = self.result.schedule
        lines = [
            f"seed {self.seed}: {'OK' if self.ok else 'FAILED'} in {self.result.elapsed:.1f}s",
            f"  {summary(s)}",
            f"  stats: {self.verdict.stats}",
        ]
        for rec in self.result.incarnations:
            how = (
                "killed by runner" if rec.killed_by_runner
                else "SIGKILL (self)" if rec.returncode == -9 else f"exit {rec.returncode}"
            )
            lines.append(
                f"  producer {rec.producer}.{rec.index}: t={rec.started - s['clock']['base']:.2f}"
                f"..{(rec.ended or 0) - s['clock']['base']:.2f} {how}"
            )
        for error in self.result.errors:
            lines.append(f"  RUN ERROR: {error}")
        for violation in self.verdict.violations[:40]:
            lines.append(f"  VIOLATION {violation}")
        if len(self.verdict.violations) > 40:
            lines.append(f"  ... {len(self.verdict.violations) - 40} more violations")
        if not self.ok or verbose:
            lines.append(f"  replay: {REPLAY.format(seed=self.seed)}")
            lines.append("  schedule: " + dumps(s))
        if verbose:
            for rec in self.result.incarnations:
                lines.extend(f"    p{rec.producer}.{rec.index}| {o}" for o in rec.output)
        return "\n".join(lines)


def run_seed(seed: int, workdir: Path, *, emulator: bool = True) -> Outcome:
    schedule = generate(seed, emulator=emulator)
    result = run_schedule(schedule, workdir)
    ends = {(r.producer, r.index): r.ended or float("inf") for r in result.incarnations}
    stored = [(c.message_id, c.body, c.enqueued) for c in result.stored]
    verdict = check(schedule, result.journals, stored, result.by_subscription, ends)
    return Outcome(seed, result, verdict)
