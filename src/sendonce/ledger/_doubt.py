"""When an unconfirmed ledger key is in doubt: the entity's own rule.

The ledger records sends, not the rules of the entities it sent to, and the rule
decides what an unconfirmed key means: with a duplicate-detection window a re-run
inside it resends the key and the broker drops a copy, so only keys past it are in
doubt; without duplicate detection, or with an Artemis-style id cache (which
remembers ids by count, not by time), a re-run never resends an unconfirmed key, so
every one is in doubt at once. The sender applies the same rule (its deadline is the
first attempt + window - :data:`IN_DOUBT_MARGIN`); ``sendonce ledger`` says it in words.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, Self

from .._entity import EntityProfile

__all__ = ["IN_DOUBT_MARGIN", "InDoubtRule", "RuleKind"]

IN_DOUBT_MARGIN = timedelta(seconds=5)
"""RetryPolicy's default safety margin: a key is resent until first attempt + window - it."""

RuleKind = Literal["window", "none", "id_cache"]
"""``window``: a duplicate-detection time window; ``none``: no duplicate detection;
``id_cache``: an Artemis-style cache of the last N ids."""


@dataclass(frozen=True, slots=True)
class InDoubtRule:
    """An entity's duplicate-detection rule, as far as it is known, and what it makes of an
    unconfirmed key.

    ``InDoubtRule.of(profile)`` reads it from an :class:`~sendonce.EntityProfile` (what a
    backend's ``describe(entity)`` returns); ``InDoubtRule("window",
    window=timedelta(minutes=10))`` declares it; ``InDoubtRule(None)`` is unknown, and
    then every unconfirmed key counts (nothing says a re-run would settle it).
    """

    kind: RuleKind | None
    """None: unknown (no broker to read it from, nothing declared)."""
    window: timedelta | None = None
    id_cache_size: int | None = None

    @classmethod
    def of(cls, profile: EntityProfile) -> Self:
        """The rule ``profile``'s broker applies."""
        if not profile.duplicate_detection:
            return cls("none")
        if profile.id_cache_size is not None:
            return cls("id_cache", id_cache_size=profile.id_cache_size)
        return cls("window", window=profile.window)

    def cutoff(self, now: datetime) -> datetime | None:
        """Keys first attempted before this are in doubt (None: every unconfirmed key)."""
        if self.kind != "window" or self.window is None:
            return None
        return now - self.window + IN_DOUBT_MARGIN

    def in_doubt(self, first_attempt: datetime, now: datetime) -> bool:
        """Whether an unconfirmed key first attempted at ``first_attempt`` is in doubt now:
        no re-run can settle it by resending (the broker would no longer drop the copy)."""
        cutoff = self.cutoff(now)
        return cutoff is None or first_attempt < cutoff
