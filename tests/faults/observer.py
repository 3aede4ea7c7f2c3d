"""An observer for the fault-schedule suite: the real ``sendonce broker`` CLI, run again and again.

Run as ``python observer.py RUN_JSON``. Until the runner creates ``stop-observer``
in the run's directory (and one round after), it runs its schedule's commands in turn, each a new
process of the installed ``sendonce`` command (``stats``/``peek`` only read;
``receive`` takes messages away, which the suite's own self-test uses to prove
a lost message is caught). Each command's exit status is printed; a command
that fails or hangs is a run error: reading the broker beside producers must
always work.

Only the standard library is imported: it runs as a script.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

COMMAND_TIMEOUT = 60.0


def sendonce_command() -> list[str]:
    """The console script installed beside this interpreter, else ``python -m sendonce.cli``."""
    script = Path(sys.executable).with_name("sendonce")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sendonce.cli"]


def arguments(command: str, db: str, schedule: dict[str, object]) -> list[str]:
    entity = schedule["entity"]
    assert isinstance(entity, dict)
    if command == "stats":
        return ["broker", "stats", db, "--json"]
    read = ["broker", command, db, "--entity", entity["name"], "--max", "5"]
    if entity["kind"] == "topic":
        read += ["--subscription", "audit"]
    return read


def main(argv: list[str]) -> int:
    run = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    schedule = run["schedule"]
    spec = schedule["observer"]
    stop = Path(run["workdir"]) / "stop-observer"
    base = sendonce_command()
    failures = 0
    runs = 0
    stopping = False
    while not stopping:
        stopping = stop.exists()  # one last round after the producers are done
        for command in spec["commands"]:
            args = base + arguments(command, run["db"], schedule)
            started = time.monotonic()
            try:
                done = subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
            except subprocess.TimeoutExpired:
                print(f"HUNG: sendonce {' '.join(args[len(base) :])} (> {COMMAND_TIMEOUT}s)")
                failures += 1
                continue
            runs += 1
            took = time.monotonic() - started
            if done.returncode != 0:
                failures += 1
                print(
                    f"FAILED ({done.returncode}): sendonce {' '.join(args[len(base) :])}: "
                    + done.stderr.strip()[-600:],
                    flush=True,
                )
            else:
                print(f"ok {command} in {took:.2f}s", flush=True)
            time.sleep(spec["pause_s"])
    print(f"observer ran {runs} commands, {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
