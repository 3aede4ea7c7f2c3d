"""Replay fault schedules by seed: ``python -m tests.faults.replay SEED [SEED...]``.

``--show`` prints the schedule without running it; ``--verbose`` also prints
every producer's output; ``--keep DIR`` keeps the broker file and journals.
Exits 1 if any seed fails, other than those expected to while a bug is open.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .schedule import dumps, generate, summary
from .suite import open_bug, run_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.replay", description=__doc__)
    parser.add_argument("seeds", nargs="+", help="seeds, or ranges like 1000-1099")
    parser.add_argument("--show", action="store_true", help="print the schedule only")
    parser.add_argument("--verbose", "-v", action="store_true")
    parser.add_argument("--keep", type=Path, help="directory to keep run files in")
    parser.add_argument("--no-emulator", action="store_true", help="never use the emulator")
    args = parser.parse_args(argv)
    seeds: list[int] = []
    for text in args.seeds:
        low, _, high = text.partition("-")
        seeds.extend(range(int(low), int(high) + 1) if high else [int(low)])
    failed: list[int] = []
    expected: list[int] = []
    for seed in seeds:
        if args.show:
            schedule = generate(seed, emulator=not args.no_emulator)
            print(f"seed {seed}: {summary(schedule)}\n{dumps(schedule)}")
            continue
        with tempfile.TemporaryDirectory(prefix=f"faults-{seed}-") as tmp:
            workdir = (args.keep / str(seed)) if args.keep else Path(tmp)
            outcome = run_seed(seed, workdir, emulator=not args.no_emulator)
        print(outcome.explain(verbose=args.verbose), flush=True)
        if not outcome.ok:
            (expected if open_bug(outcome.result.schedule) else failed).append(seed)
    if expected:
        print(f"expected failures (open bugs): {' '.join(map(str, expected))}")
    if failed:
        print(f"FAILED seeds: {' '.join(map(str, failed))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
