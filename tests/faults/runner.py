"""Runs one schedule: real producer processes, SIGKILLs and restarts, then reads the broker.

Every producer is a separate Python process (``sys.executable``) over one
broker file: directly, or with the real ``azure-servicebus`` client through an
emulator, either its own (it dies with the producer) or one shared by all
producers in the runner's process (it outlives their crashes). A producer
either SIGKILLs itself at the call its schedule names, or is SIGKILLed by the
runner after its n-th committed chunk; the runner restarts it after the
scheduled delay (schedule time), as the next incarnation, until one finishes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sendonce.backends import LocalBackend

from .producer import ScaledTime, profile_of, read_journal

PRODUCER = Path(__file__).with_name("producer.py")
OBSERVER = Path(__file__).with_name("observer.py")
INTERRUPTED = 130  # a producer that exits after a Ctrl-C: restarted like a crashed one
READ_TIMEOUT = 60.0  # reading the broker at the end; longer means opening it deadlocked
SUBSCRIPTIONS = ("audit", "billing")


@dataclass
class Stored:
    """One stored copy as the broker holds it."""

    message_id: str
    body: bytes
    enqueued: float  # schedule time, epoch seconds
    sequence_number: int


@dataclass
class Incarnation:
    producer: int
    index: int
    started: float
    ended: float | None = None
    returncode: int | None = None
    killed_by_runner: bool = False
    output: list[str] = field(default_factory=list)
    stderr: str = ""


@dataclass
class RunResult:
    schedule: dict[str, Any]
    journals: dict[int, list[dict[str, Any]]]
    incarnations: list[Incarnation]
    stored: list[Stored]
    by_subscription: dict[str, list[str]]
    errors: list[str]
    elapsed: float
    base: float  # schedule time 0 (epoch seconds)
    observer_output: list[str] = field(default_factory=list)


class _Process:
    """One running incarnation, its output read by a thread."""

    def __init__(self, run_json: Path, producer: int, index: int, clock: ScaledTime) -> None:
        self.record = Incarnation(producer, index, clock.now())
        self.born = time.monotonic()
        self.progress = 0
        self.proc = subprocess.Popen(
            [sys.executable, str(PRODUCER), str(run_json), str(producer), str(index)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.record.output.append(line.rstrip("\n"))
            if line.startswith("progress"):
                self.progress += 1

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line)

    def finish(self, clock: ScaledTime) -> None:
        for t in self._threads:
            t.join(5)
        self.record.ended = clock.now()
        self.record.returncode = self.proc.returncode
        self.record.stderr = "".join(self._err)[-4000:]


def prepare_broker(db: Path, schedule: dict[str, Any]) -> None:
    profile = profile_of(schedule["entity"])
    with LocalBackend(db) as broker:
        broker.create_entity(profile)
        if profile.kind == "topic":
            for name in SUBSCRIPTIONS:
                broker.create_subscription(profile.name, name)


def run_schedule(schedule: dict[str, Any], workdir: Path, *, timeout: float = 120.0) -> RunResult:
    """Run ``schedule`` in ``workdir`` (a fresh directory) and collect what happened."""
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "broker.db"
    prepare_broker(db, schedule)
    started = time.monotonic()
    # The emulator's broker keeps the wall clock (emulator schedules run at speed 1):
    # schedule time then starts from the wall clock, so both agree.
    # Url senders stamp with the wall clock too (their schedules run at speed 1).
    wall = schedule["transport"] == "emulator" or schedule.get("wall_clock", False)
    base = time.time() if wall else schedule["clock"]["base"]
    run: dict[str, Any] = {
        "schedule": schedule,
        "origin": started,
        "base": base,
        "workdir": str(workdir),
        "db": str(db),
    }
    clock = ScaledTime(base, started, schedule["clock"]["speed"])
    emulator = None
    if schedule["transport"] == "emulator" and schedule.get("emulator_shared"):
        # one emulator for every producer: it outlives their crashes
        from sendonce.emulator import Emulator

        emulator = Emulator(db, poll_interval=0.02).start()
        run["connection_string"] = emulator.connection_string
    run_json = workdir / "run.json"
    run_json.write_text(json.dumps(run), encoding="utf-8")
    observer = _Observer(run_json, workdir) if schedule.get("observer") else None
    try:
        return _supervise(schedule, workdir, run_json, clock, emulator, started, timeout, observer)
    finally:
        if emulator is not None:
            emulator.stop()
        if observer is not None:
            observer.stop()


class _Observer:
    """The process running ``sendonce broker`` commands beside the producers."""

    def __init__(self, run_json: Path, workdir: Path) -> None:
        self.stop_file = workdir / "stop-observer"
        self.proc = subprocess.Popen(
            [sys.executable, str(OBSERVER), str(run_json)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []

    def stop(self) -> str | None:
        """Let it run one last round and end; what went wrong, if anything."""
        if self.proc.returncode is not None:
            return None
        self.stop_file.touch()
        try:
            out, _ = self.proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.output = out.splitlines()
        if self.proc.returncode == 0:
            return None
        failed = [line for line in self.output if not line.startswith("ok ")]
        return "observer (sendonce broker commands): " + "\n".join(failed)


def _supervise(
    schedule: dict[str, Any],
    workdir: Path,
    run_json: Path,
    clock: ScaledTime,
    emulator: Any,
    started: float,
    timeout: float,
    observer: _Observer | None,
) -> RunResult:
    def start(p: int, index: int) -> _Process:
        if emulator is not None:
            from sendonce.emulator import FaultAction

            plan = schedule["producers"][p]["incarnations"][index]
            emulator.faults.add(*(FaultAction(a) for a in plan["emulator_faults"]))
        return _Process(run_json, p, index, clock)

    speed = schedule["clock"]["speed"]
    external = schedule.get("external_kill")
    nemesis = {(n["producer"], n["incarnation"]): n["after_s"] for n in schedule.get("nemesis", [])}

    errors: list[str] = []
    records: list[Incarnation] = []
    running: dict[int, _Process] = {p: start(p, 0) for p in range(len(schedule["producers"]))}
    restart_at: dict[int, tuple[float, int]] = {}
    deadline = started + timeout
    try:
        while running or restart_at:
            now = time.monotonic()
            if now > deadline:
                errors.append(f"run exceeded {timeout}s: killed producers {sorted(running)}")
                for proc in running.values():
                    proc.proc.kill()
                    proc.proc.wait()
                    proc.finish(clock)
                    records.append(proc.record)
                running.clear()
                break
            for p, (when, index) in list(restart_at.items()):
                if now >= when:
                    del restart_at[p]
                    running[p] = start(p, index)
            for p, proc in list(running.items()):
                rec = proc.record
                if (
                    external is not None
                    and external["producer"] == p
                    and rec.index == 0
                    and proc.progress > external["after_progress"]
                    and proc.proc.poll() is None
                ):
                    proc.proc.send_signal(signal.SIGKILL)
                    rec.killed_by_runner = True
                if (
                    (p, rec.index) in nemesis
                    and time.monotonic() - proc.born >= nemesis[(p, rec.index)]
                    and proc.proc.poll() is None
                ):
                    proc.proc.send_signal(signal.SIGKILL)
                    rec.killed_by_runner = True
                if proc.proc.poll() is None:
                    continue
                proc.finish(clock)
                records.append(rec)
                del running[p]
                plans = schedule["producers"][p]["incarnations"]
                if rec.returncode in (-signal.SIGKILL, INTERRUPTED):
                    nxt = rec.index + 1
                    if nxt >= len(plans):
                        errors.append(
                            f"producer {p} incarnation {rec.index} was killed and has no "
                            "next incarnation"
                        )
                        continue
                    delay = plans[nxt]["restart_delay_s"] / speed
                    restart_at[p] = (time.monotonic() + delay, nxt)
                elif rec.returncode != 0:
                    errors.append(
                        f"producer {p} incarnation {rec.index} exited {rec.returncode}:\n"
                        + rec.stderr
                    )
            time.sleep(0.01)
    finally:
        for proc in running.values():  # interrupted: leave no producer behind
            if proc.proc.poll() is None:
                proc.proc.kill()
                proc.proc.wait()

    if observer is not None:
        problem = observer.stop()  # its last round sees the final state too
        if problem is not None:
            errors.append(problem)
    journals = {
        p: read_journal(workdir / f"journal-{p}.jsonl") for p in range(len(schedule["producers"]))
    }
    if emulator is not None:
        emulator.stop()
    stored, by_sub = read_broker_guarded(workdir / "broker.db", schedule, errors)
    return RunResult(
        schedule,
        journals,
        sorted(records, key=lambda r: (r.producer, r.index)),
        stored,
        by_sub,
        errors,
        time.monotonic() - started,
        clock.base,
        observer.output if observer is not None else [],
    )


def read_broker_guarded(
    db: Path, schedule: dict[str, Any], errors: list[str]
) -> tuple[list[Stored], dict[str, list[str]]]:
    """:func:`read_broker`, reported as a run error if opening the file hangs or fails."""
    box: dict[str, Any] = {}

    def read() -> None:
        try:
            box["result"] = read_broker(db, schedule)
        except Exception as exc:  # reported as the run's error
            box["error"] = f"{type(exc).__name__}: {exc}"

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(READ_TIMEOUT)
    if "result" in box:
        result: tuple[list[Stored], dict[str, list[str]]] = box["result"]
        return result
    errors.append(
        "reading the broker at the end: "
        + box.get("error", f"opening the file hung for {READ_TIMEOUT}s (deadlock)")
    )
    return [], {}


def read_broker(db: Path, schedule: dict[str, Any]) -> tuple[list[Stored], dict[str, list[str]]]:
    """Every stored copy (for a topic: one per accepted message), and ids per subscription."""
    entity = schedule["entity"]["name"]
    topic = schedule["entity"]["kind"] == "topic"
    with LocalBackend(db) as broker:
        first = SUBSCRIPTIONS[0] if topic else None
        peeked = broker.peek(entity, max_messages=1_000_000, subscription=first)
        stored = [
            Stored(m.message_id, m.body, m.enqueued_time.timestamp(), m.sequence_number)
            for m in peeked
        ]
        by_sub: dict[str, list[str]] = {}
        if topic:
            # Scheduled messages wait on the topic itself until due (no subscription has them).
            waiting = broker.peek(entity, max_messages=1_000_000)
            stored += [
                Stored(m.message_id, m.body, m.enqueued_time.timestamp(), m.sequence_number)
                for m in waiting
            ]
            by_sub["(topic)"] = broker.message_ids(entity)
            for name in SUBSCRIPTIONS:
                by_sub[name] = broker.message_ids(entity, subscription=name)
                by_sub[name] += [m.message_id for m in waiting]
    return stored, by_sub
