"""``sendonce demo``: exactly-once publishing on the embedded broker, with real faults.

A producer process publishes orders through a fault-injecting backend (lost
acks after commit, connection drops before commit, slow acks), checkpoints its
progress after each confirmed chunk, and is killed with SIGKILL right after a
chunk was committed but before its checkpoint. A restarted producer resumes
from the checkpoint, so it resends a chunk the broker already holds. The broker
drops those copies; the demo then proves every order is in the queue exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from .._entity import EntityProfile
from .._message import MessageSpec
from .._retry import RetryPolicy
from .._sender import IdempotentSender
from ..testing import Fault, FaultyBackend
from ._words import InputError

__all__ = ["demo", "run_demo"]

ENTITY = EntityProfile("orders")
SPEC = MessageSpec("{order_id}.{year}/payment", partition_key=None)
CHUNK = 100


def orders(count: int) -> list[dict[str, Any]]:
    """The business records: deterministic, so every run builds the same ids."""
    rng = random.Random(2017)
    return [
        {
            "order_id": 10_000 + i,
            "year": 2017,
            "customer": f"c{rng.randrange(500):03d}",
            "amount": str(Decimal(rng.randrange(100, 100_000)) / 100),
        }
        for i in range(count)
    ]


def _fault_script(seed: int) -> Any:
    rng = random.Random(seed)
    choices = (
        [Fault.NONE] * 10
        + [Fault.AFTER_COMMIT] * 4
        + [Fault.BEFORE_COMMIT] * 3
        + [Fault.SLOW_ACK, Fault.SLOW_ACK]
    )
    return lambda index, entity, messages: rng.choice(choices)


def produce(
    db: Path, checkpoint: Path, count: int, crash_after_chunk: int | None, seed: int
) -> None:
    """One producer process: resume from the checkpoint, publish, checkpoint each chunk."""
    from ..backends.local import LocalBackend

    start = int(checkpoint.read_text()) if checkpoint.exists() else 0
    records = orders(count)
    retry = RetryPolicy(initial_backoff=0.01, max_backoff=0.05, attempt_timeout=5.0, max_attempts=8)
    stats: Counter[str] = Counter()
    with LocalBackend(db) as local:
        faulty = FaultyBackend(
            local, _fault_script(seed), slow_ack_delay=10.0, sleep=lambda s: None
        )
        with IdempotentSender(faulty, ENTITY, retry=retry) as sender:
            for chunk_start in range(start, count, CHUNK):
                chunk = records[chunk_start : chunk_start + CHUNK]
                report = sender.send_many(SPEC.to_message(r) for r in chunk)
                report.raise_for_failures()
                stats["sent"] += report.sent
                stats["duplicates"] += report.duplicates
                stats["faults"] += sum(1 for c in faulty.calls if c.fault is not Fault.NONE)
                faulty.calls.clear()
                if crash_after_chunk is not None and chunk_start // CHUNK == crash_after_chunk:
                    # Committed and acknowledged, but the checkpoint is not written yet.
                    print(json.dumps(dict(stats)), flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                tmp = checkpoint.with_suffix(".tmp")
                tmp.write_text(str(chunk_start + CHUNK))
                tmp.replace(checkpoint)  # atomic: a kill never leaves a torn checkpoint
    print(json.dumps(dict(stats)), flush=True)


def _run_producer(
    db: Path, checkpoint: Path, count: int, crash: int | None, seed: int
) -> tuple[int, dict[str, int]]:
    args = [
        sys.executable,
        "-m",
        "sendonce.cli._demo",
        "--produce",
        str(db),
        str(checkpoint),
        str(count),
        "" if crash is None else str(crash),
        str(seed),
    ]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode not in (0, -signal.SIGKILL) or not lines:
        raise click.ClickException(f"producer failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.returncode, json.loads(lines[-1])


def run_demo(workdir: str | None = None, count: int = 1000) -> int:
    """Run the demo; 0 when every order is in the queue exactly once."""
    from ..backends.local import LocalBackend

    with tempfile.TemporaryDirectory(prefix="sendonce-demo-") as tmp:
        base = Path(workdir or tmp)
        base.mkdir(parents=True, exist_ok=True)
        db, checkpoint = base / "demo-broker.db", base / "producer.checkpoint"
        for path in (db, checkpoint):
            path.unlink(missing_ok=True)
        if workdir is None:
            click.echo(
                f"broker file: {db} (temporary: deleted when the demo ends; give --workdir DIR "
                "to keep it)"
            )
        else:
            click.echo(f"broker file: {db} (kept: `sendonce broker stats {db}` shows it)")
        click.echo(
            f"publishing {count} orders to queue {ENTITY.name!r}, ids like "
            f"{SPEC.to_message(orders(1)[0]).message_id!r}, through injected faults\n"
        )
        code, first = _run_producer(db, checkpoint, count, crash=count // CHUNK // 2, seed=1)
        killed = code == -signal.SIGKILL
        click.echo(
            f"producer 1: sent {first.get('sent', 0)}, faults injected "
            f"{first.get('faults', 0)}, then {'killed with SIGKILL' if killed else 'exited'}"
            f" before checkpointing its last chunk"
        )
        _, second = _run_producer(db, checkpoint, count, crash=None, seed=2)
        click.echo(
            f"producer 2 (restarted from checkpoint): sent {second.get('sent', 0)}, "
            f"duplicates dropped by the broker {second.get('duplicates', 0)}, faults "
            f"injected {second.get('faults', 0)}"
        )
        with LocalBackend(db) as broker:
            ids = broker.message_ids(ENTITY.name)
            sample = broker.peek(ENTITY.name, max_messages=3)
        click.echo("\nfirst messages in the queue:")
        for message in sample:
            click.echo(
                f"  #{message.sequence_number:<5} {message.message_id:<20} "
                f"{message.body.decode('utf-8')}"
            )
        counts = Counter(ids)
        expected = {SPEC.to_message(r).message_id for r in orders(count)}
        twice = sorted(i for i, n in counts.items() if n > 1)
        missing = sorted(expected - set(counts))
        click.echo(f"\nmessages in the queue: {len(ids)} for {count} orders")
        click.echo(f"orders present twice or more: {len(twice)} {twice[:5]}")
        click.echo(f"orders missing: {len(missing)} {missing[:5]}")
        ok = not twice and not missing and len(ids) == count
        click.echo("EXACTLY ONCE: every order is in the queue once." if ok else "FAILED")
        return 0 if ok else 1


def _prepare_workdir(workdir: str) -> None:
    """A missing ``--workdir`` is created only inside an existing directory, and said so:
    a typo in a parent must not grow a tree of directories silently."""
    path = Path(workdir).absolute()
    if path.is_dir():
        return
    if not path.parent.is_dir():
        raise InputError(
            f"--workdir: {str(path.parent)!r} does not exist; create it first, or give an "
            "existing directory"
        )
    try:
        path.mkdir()
    except OSError as exc:
        raise InputError(f"--workdir: cannot create {str(path)!r}: {exc.strerror}") from None
    click.echo(f"created directory {path}", err=True)


DEMO_EXIT_HELP = (
    "Exit status: 0 every order is in the queue exactly once; 1 it is not (the demo says "
    "which orders are missing or twice), or a producer failed; 2 invalid command line (or, "
    "with --spark, the spark extra is missing)."
)


@click.command("demo", epilog=DEMO_EXIT_HELP, short_help="Prove exactly-once through crashes.")
@click.option(
    "--orders",
    "count",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="How many orders the producers publish (without --spark; the Spark demo "
    "publishes 2000 rows).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Keep the broker file here (demo-broker.db; broker.db for --spark), to look at it "
    "afterwards with `sendonce broker stats`/`peek` (default: a temporary directory, removed "
    "at the end). Created if its parent exists.",
)
@click.option(
    "--spark",
    is_flag=True,
    help="Run the Spark demo instead: a local Spark job publishes orders and the first "
    "attempt of every partition is killed after it sent its rows (needs the spark extra "
    "and Java 17).",
)
def demo(count: int, workdir: str | None, spark: bool) -> None:
    """Publish orders through crashes and faults; prove each lands exactly once.

    Two producer processes publish the same orders to a local broker file through a
    backend that injects faults (acks lost after the broker stored a transfer, connections
    dropped before it, slow acks). The first is killed with SIGKILL after a transfer was
    stored but before it checkpointed it; the second resumes from the checkpoint and sends
    that transfer again. The broker drops the copies (the ids come from the orders), and
    the demo reads the queue and says whether every order is there exactly once.
    """
    if workdir is not None:
        _prepare_workdir(workdir)
    if spark:
        from ._demo_spark import run_demo as run_spark_demo

        sys.exit(run_spark_demo(workdir))
    sys.exit(run_demo(workdir, count))


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--produce":
        _, _, db_arg, cp_arg, n_arg, crash_arg, seed_arg = sys.argv
        produce(
            Path(db_arg),
            Path(cp_arg),
            int(n_arg),
            int(crash_arg) if crash_arg else None,
            int(seed_arg),
        )
    else:
        demo()
