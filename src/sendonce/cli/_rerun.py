"""What running the same ``publish`` again guarantees, always said with its limit.

Without a ledger a re-run is exactly once only while the broker still remembers
the ids of the first run: until the duplicate-detection window of its first send
ends (or, on an Artemis-style entity, while its id cache still holds them). After
that the broker has forgotten them and nothing can tell that the records were
sent: a re-run sends them again. With ``--ledger`` the ledger remembers them for
its retention, so a re-run is safe for good. Every message that advises a re-run
(Ctrl-C, failures, records in doubt) comes from here, so they all say the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .._entity import EntityProfile
from ._words import format_duration

__all__ = ["RerunPromise", "utc_text"]


def utc_text(moment: datetime) -> str:
    """A moment as the shell user reads it: ``2026-11-24 14:03:12 UTC``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass
class RerunPromise:
    """How long a re-run of this publish stays exactly once, and the words for it."""

    profile: EntityProfile
    ledger: str | None
    """The ledger url given with ``--ledger`` (shown redacted by the caller), if any."""
    margin: timedelta
    """The retry policy's safety margin: a re-run must start this much before the end."""
    first_send: datetime | None = None
    """Wall time of the first send of this run; ``None`` while nothing was sent."""
    window_trusted: bool = True
    """False where the window was declared and the broker cannot confirm it: the ledger then
    resends no unconfirmed key inside it (see ``Ledger.trust_window``)."""

    def started(self) -> None:
        """Note the first send (once): the window of the earliest record starts here."""
        if self.first_send is None:
            self.first_send = datetime.now(UTC)

    @property
    def safe_until(self) -> datetime | None:
        """The last moment a re-run without a ledger is still exactly once, if time-bound."""
        window = self.profile.window
        if self.ledger is not None or self.first_send is None or window is None:
            return None
        if not self.profile.duplicate_detection:
            return None
        return self.first_send + window - self.margin

    def text(self) -> str:
        """The sentence to print wherever the CLI advises running the command again."""
        if self.ledger is not None:
            return (
                "Running the same command again with the same --ledger is safe: the ledger "
                "remembers every record this run sent (for its retention), so a re-run sends "
                "only what is missing, whenever it runs."
            )
        if self.first_send is None:
            return "Nothing was sent yet: running the same command again is safe."
        profile = self.profile
        if profile.count_bounded:
            return (
                "Running the same command again is safe only while the broker's id cache "
                f"(the last {profile.id_cache_size} ids sent to {profile.name!r}) still holds "
                f"these records. {self._forgotten()}"
            )
        until = self.safe_until
        assert until is not None and profile.window is not None
        return (
            f"Running the same command again is safe until {utc_text(until)}, while the "
            f"broker's duplicate-detection window ({format_duration(profile.window)}) of the "
            f"first send lasts. {self._forgotten()}"
        )

    @staticmethod
    def _forgotten() -> str:
        return (
            "After that the broker may have forgotten them, and a re-run cannot detect it: "
            "it would send them again. Use --ledger to make re-runs safe for good."
        )

    def as_json(self) -> dict[str, Any]:
        """The promise as report fields, for scripts (``--json``)."""
        until = self.safe_until
        return {
            "rerun_safe_until": None if until is None else until.isoformat(),
            "rerun": self.text(),
        }
