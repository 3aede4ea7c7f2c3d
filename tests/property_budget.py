"""How many examples a Hypothesis property draws: a quarter in the default run, all in CI's.

The README's ``pytest`` is the loop every change goes through, so its property tests draw a
quarter of their examples (at least 10; Hypothesis's own database replays any failure it has
seen). ``HYPOTHESIS_PROFILE=full`` (.ci/run's property step) draws every one::

    @settings(max_examples=examples(400), deadline=None)
"""

from __future__ import annotations

import os

FULL = os.environ.get("HYPOTHESIS_PROFILE") == "full"


def examples(full: int) -> int:
    """``full`` under ``HYPOTHESIS_PROFILE=full``, else a quarter of it (at least 10)."""
    return full if FULL else min(full, max(10, full // 4))
