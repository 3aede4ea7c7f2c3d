"""``--smoke``, which every benchmark takes: tiny sizes and one round, figures meaningless.

It only proves the script still runs end to end against today's package;
tests/functional/test_bench_smoke.py runs every script of bench/ with it, so a benchmark
cannot rot between the runs that measure. Sizes given on the command line are ignored
under ``--smoke``; without it nothing changes.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_smoke", "apply_smoke"]


def add_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes and one round: checks that the script runs; measures nothing",
    )


def apply_smoke(args: argparse.Namespace, **tiny: Any) -> argparse.Namespace:
    """Under ``--smoke``, set each of ``tiny``'s options on ``args``."""
    if args.smoke:
        for name, value in tiny.items():
            if not hasattr(args, name):
                raise AttributeError(f"--smoke sets {name!r}, which this script does not take")
            setattr(args, name, value)
    return args
