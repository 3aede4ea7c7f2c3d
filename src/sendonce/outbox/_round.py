"""What a relay's rounds did with the rows they claimed: one round's outcomes, and the totals.

A :class:`Round` records the fate of each claimed row as its transfers complete (published,
moved aside with a reason, released for a later round) and hands the outcomes of each key to
the settlement as soon as the key is done; :class:`RelayTotals` adds the rounds up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ._store import ClaimedRow, Settled

__all__ = ["RelayTotals", "Round"]


@dataclass(slots=True)
class RelayTotals:
    """What a relay has done since it started."""

    published: int = 0
    dead: int = 0
    released: int = 0
    rounds: int = 0
    dead_reasons: dict[str, int] = field(default_factory=dict)

    def since(self, earlier: RelayTotals) -> RelayTotals:
        """What was done after ``earlier`` (a copy taken then)."""
        reasons = {
            k: v - earlier.dead_reasons.get(k, 0)
            for k, v in self.dead_reasons.items()
            if v != earlier.dead_reasons.get(k, 0)
        }
        return RelayTotals(
            self.published - earlier.published,
            self.dead - earlier.dead,
            self.released - earlier.released,
            self.rounds - earlier.rounds,
            reasons,
        )

    def copy(self) -> RelayTotals:
        return RelayTotals(
            self.published, self.dead, self.released, self.rounds, dict(self.dead_reasons)
        )


_Released = tuple[int, bool, datetime | None, bool, str | None, datetime, int | None, bool]


@dataclass(slots=True)
class Round:
    """The fate of each claimed row, filled in as waves complete.

    Outcomes are handed to the settlement in parts (:meth:`finished`) as soon as their key
    has no row left to send in this round, so the database marks them while later transfers
    are in flight; a key still sending keeps its outcomes (and its head's lease) until it is
    done, so no other relay can start on its later rows meanwhile.
    """

    published: list[tuple[int, str, int | None]] = field(default_factory=list)
    dead: list[tuple[int, str, str]] = field(default_factory=list)
    released: list[_Released] = field(default_factory=list)
    transient: int = 0
    untraced: int = 0
    """Rows sent without their producer's trace context: it would have pushed them over
    the entity's limits (``_telemetry.forwarded``)."""
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    key_of: dict[int, str | None] = field(default_factory=dict)
    """Each claimed row's order key (None: unordered), by row id."""
    handed: set[int] = field(default_factory=set)
    """Rows whose outcome went to a settlement already."""
    _seen: list[int] = field(default_factory=lambda: [0, 0, 0])
    _held: tuple[list[Any], list[Any], list[Any]] = field(default_factory=lambda: ([], [], []))

    def release(self, row: ClaimedRow, *, tried: bool, error: str | None = None) -> None:
        """Back to pending. A row that may have reached the broker keeps its first attempt;
        one that cannot have (never tried, or refused before the broker) gets its old one."""
        self._add(row, tried, tried, error)

    def release_untouched(self, row: ClaimedRow, error: str | None = None) -> None:
        """Tried, yet nothing can have been stored (refused connection, ledger down)."""
        self._add(row, False, True, error)

    def _add(self, row: ClaimedRow, keep: bool, tried: bool, error: str | None) -> None:
        attempted = row.prior_attempt if row.prior_attempt is not None else self.now
        self.released.append(
            (row.id, keep, row.prior_attempt, tried, error, attempted, row.through_before, row.head)
        )

    def finished(self, sending: set[str | None]) -> Settled | None:
        """The outcomes not handed over yet whose key is not in ``sending``; None if none."""
        parts: list[list[Any]] = []
        key_of, handed = self.key_of, self.handed
        columns: tuple[list[Any], list[Any], list[Any]] = (self.published, self.dead, self.released)
        for i, entries in enumerate(columns):
            held = self._held[i]
            fresh = entries[self._seen[i] :]
            self._seen[i] = len(entries)
            ready: list[Any] = []
            keep: list[Any] = []
            for entry in (*held, *fresh) if held else fresh:
                key = key_of.get(entry[0])
                (keep if key is not None and key in sending else ready).append(entry)
            held[:] = keep
            handed.update(entry[0] for entry in ready)
            parts.append(ready)
        if not any(parts):
            return None
        return Settled(parts[0], parts[1], parts[2])
