"""`sendonce publish` memory and time: streaming in two passes vs holding every record.

Runs the real command (a subprocess each) on JSON Lines files of N and N/10
records into a local broker, and records the peak resident memory of each run.
A reference process builds every message of the N-record file and keeps them
in a list, as the command did before it streamed (read all, validate all, then
send). Prints peak memory per run and the ratios measured in this run.

    python bench/bench_cli_publish.py [--records 300000] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _smoke import add_smoke, apply_smoke

ID = "{order_id}.{year}/payment"

_HOLD_ALL = """
import json, sys
from sendonce import MessageSpec
spec = MessageSpec(sys.argv[2])
with open(sys.argv[1], encoding="utf-8") as f:
    messages = [spec.to_message(json.loads(line)) for line in f]
print(len(messages))
"""


def write_records(path: Path, count: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            record = {"order_id": i, "year": 2026, "customer": f"c-{i % 977}", "amount": "19.90"}
            out.write(json.dumps(record) + "\n")


def peak_mib(args: list[str], cwd: Path) -> tuple[float, float]:
    """Run ``args``; its peak RSS in MiB (waited with wait4) and its wall time."""
    started = time.perf_counter()
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        error = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        raise SystemExit(f"{args[:3]} failed: {error}")
    return usage.ru_maxrss / 1024, elapsed  # ru_maxrss is in KiB on Linux


def publish(source: Path, db: Path, cwd: Path) -> tuple[float, float]:
    sendonce = [sys.executable, "-c", "from sendonce.cli import main; main()"]
    subprocess.run(
        [*sendonce, "broker", "create", str(db), "--entity", "orders", "--window", "1h"],
        check=True,
        capture_output=True,
    )
    return peak_mib(
        [
            *sendonce,
            "publish",
            str(source),
            "--to",
            f"local://{db}",
            "--entity",
            "orders",
            "--id",
            ID,
            "--no-progress",
        ],
        cwd,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000)
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), records=200)
    n = args.records
    with tempfile.TemporaryDirectory(prefix="sendonce-bench-cli-") as tmp:
        base = Path(tmp)
        big, small = base / "big.jsonl", base / "small.jsonl"
        write_records(big, n)
        write_records(small, n // 10)
        small_mib, small_s = publish(small, base / "small.db", base)
        big_mib, big_s = publish(big, base / "big.db", base)
        held_mib, _ = peak_mib([sys.executable, "-c", _HOLD_ALL, str(big), ID], base)
        rerun_mib, rerun_s = peak_mib(
            [
                sys.executable,
                "-c",
                "from sendonce.cli import main; main()",
                "publish",
                str(big),
                "--to",
                f"local://{base / 'big.db'}",
                "--entity",
                "orders",
                "--id",
                ID,
                "--no-progress",
            ],
            base,
        )
    print(f"records: {n} (and {n // 10}); file {big.name}")
    print(f"publish {n // 10:>7}: peak {small_mib:7.1f} MiB  {small_s:6.1f} s")
    print(f"publish {n:>7}: peak {big_mib:7.1f} MiB  {big_s:6.1f} s")
    print(f"re-run  {n:>7}: peak {rerun_mib:7.1f} MiB  {rerun_s:6.1f} s (all duplicates)")
    print(f"hold all {n:>6} messages in a list (the old way, building only): {held_mib:.1f} MiB")
    print(f"ratio peak({n}) / peak({n // 10}): {big_mib / small_mib:.2f}")
    print(f"ratio peak(publish {n}) / peak(holding {n} messages): {big_mib / held_mib:.2f}")


if __name__ == "__main__":
    main()
