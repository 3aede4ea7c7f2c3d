"""When an unconfirmed ledger key is in doubt: the entity's own rule, in the CLI's words.

The rule itself is library API (:class:`sendonce.ledger.InDoubtRule`: what it is, what
is in doubt when); this module adds the words. Every ledger message (``ledger stats``,
``in-doubt``, the advice ``publish`` prints) says the rule it applies, or that it does
not know it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import click

from ..ledger import IN_DOUBT_MARGIN, InDoubtRule
from ._words import InputError, format_duration

__all__ = ["MARGIN", "Rule", "check_declared", "no_dedup_option"]

F = TypeVar("F", bound=Callable[..., Any])


def no_dedup_option(help: str) -> Callable[[F], F]:
    """``--no-dedup``: the one option, everywhere a command takes a declared rule
    (``publish``, ``relay``, ``ledger in-doubt``), that says the entity has no duplicate
    detection."""
    return click.option("--no-dedup", is_flag=True, help=help)


def check_declared(window: timedelta | None, no_dedup: bool, id_cache_size: int | None) -> None:
    """One declared rule at most: a window, an id cache, or none (exit 2 otherwise)."""
    if no_dedup and (window is not None or id_cache_size is not None):
        given = "--window" if window is not None else "--id-cache-size"
        raise InputError(
            f"--no-dedup and {given} declare two different rules: give one (without duplicate "
            "detection the broker remembers no ids)"
        )


MARGIN = IN_DOUBT_MARGIN


@dataclass(frozen=True, slots=True)
class Rule(InDoubtRule):
    """An entity's duplicate-detection rule, as far as the command knows it (unknown: the
    command was given neither --broker nor --window / --no-dedup), with its words."""

    def words(self) -> str:
        """The rule, as a clause: ``no duplicate detection``."""
        if self.kind == "none":
            return "no duplicate detection"
        if self.kind == "id_cache":
            return f"an id cache of the last {self.id_cache_size} ids, no time window"
        if self.kind == "window" and self.window is not None:
            return f"a {format_duration(self.window)} duplicate-detection window"
        return "an unknown duplicate-detection rule"

    def meaning(self) -> str:
        """What an unconfirmed key of such an entity is, and what settles it."""
        if self.kind == "window" and self.window is not None:
            return (
                f"a re-run within {format_duration(self.window)} of a key's first attempt "
                "resends it and the broker drops a copy; past that, it is in doubt"
            )
        if self.kind == "none":
            return (
                "the broker remembers no ids, so a re-run never resends an unconfirmed key "
                "(a copy would be stored twice): each is in doubt at once"
            )
        if self.kind == "id_cache":
            return (
                "the broker remembers ids by count, not by time, so a re-run never resends an "
                "unconfirmed key: each is in doubt at once"
            )
        return (
            "in doubt once the entity's duplicate-detection window has passed since its first "
            "attempt, at once on an entity without duplicate detection or with an id cache "
            "(give --broker to apply the entity's own rule)"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "duplicate_detection": self.kind,
            "window_seconds": None if self.window is None else self.window.total_seconds(),
            "id_cache_size": self.id_cache_size,
        }
