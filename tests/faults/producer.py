"""A producer process for the fault-schedule suite; also the message model the checker shares.

Run as ``python producer.py RUN_JSON PRODUCER INCARNATION``. It publishes its
share of business ids in chunks through ``IdempotentSender`` over the faults
its schedule gives it, and keeps a journal (append + flush + fsync per event)
so that a restart after SIGKILL knows what was in flight and when it was first
attempted. Its rules are exactly what the SDK promises, no more:

- Resending a call that was in flight when the process died is safe only while
  the broker still remembers its ids: the restart passes the journaled first
  attempt (``first_attempt=``), so the sender keeps the original deadline and
  sends nothing once it has passed (``InDoubtError``: in doubt for good).
- ``InDoubtError`` ids are journaled; with ``redrive_in_doubt`` a final pass
  resends those whose first attempt is still inside the window.
- ``PermanentSendError`` means nothing was stored: with ``permanent_policy``
  ``"abandon"`` the ids are given up (the checker expects them absent), with
  ``"redrive"`` a final pass sends them again as new sends.

Only the standard library and ``sendonce`` are imported: it runs as a script.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from sendonce import (
    EntityProfile,
    IdempotentSender,
    InDoubtError,
    Message,
    PermanentSendError,
    RetryPolicy,
    SendFailure,
    SendReport,
    SendResult,
)
from sendonce.backends._base import Ack
from sendonce.testing import Fault, FaultyBackend

# Give a resumed call a little more margin than the policy's own, for the
# moment between computing its deadline and the retry loop reading the clock.
RESUME_SLACK = 0.5
# Where scheduled messages are scheduled (schedule time): far beyond any run.
SCHEDULED_AT = 1_900_000_000.0 + 30 * 86400


# -- the message model (shared with the checker) ---------------------------------------


def message_id(n: int) -> str:
    return f"order-{n}"


def id_number(mid: str) -> int:
    return int(mid.rsplit("-", 1)[1])


def body(n: int) -> str:
    """The one body of business event ``n``: every producer sends the same bytes."""
    return json.dumps({"order": n, "amount_cents": (n * 7919) % 100_000, "currency": "EUR"})


def profile_of(entity: dict[str, Any]) -> EntityProfile:
    return EntityProfile(
        entity["name"],
        kind=entity["kind"],
        duplicate_detection_window=timedelta(seconds=entity["window_s"]),
        partitioned=entity["partitioned"],
        sessions=entity["sessions"],
        id_cache_size=entity.get("id_cache_size"),
    )


def message(n: int, entity: dict[str, Any]) -> Message:
    """Keys are deterministic functions of the id, so overlapping producers dedup."""
    session = f"s{n % 3}" if entity["sessions"] else None
    pkey = f"pk{n % 5}" if entity["partitioned"] and entity["explicit_pk"] else None
    if session is not None:
        pkey = session
    return Message(body(n), message_id=message_id(n), partition_key=pkey, session_id=session)


# -- time --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaledTime:
    """Schedule time: runs ``speed`` times faster than real time, the same in every process.

    Every process of a run computes it from the same monotonic origin, so the
    broker's window stamps, the retry deadlines and the journal agree.
    """

    base: float
    origin: float
    speed: float

    def now(self) -> float:
        return self.base + (time.monotonic() - self.origin) * self.speed

    def now_dt(self) -> datetime:
        return datetime.fromtimestamp(self.now(), UTC)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)

    async def async_sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0) / self.speed)


class ScaledTimeouts:
    """Passes call timeouts (schedule seconds) to the inner backend in real seconds."""

    def __init__(self, inner: Any, speed: float) -> None:
        self.inner = inner
        self.speed = speed

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        acks: list[Ack] = self.inner.send(
            entity, messages, timeout=timeout / self.speed, atomic=atomic
        )
        return acks

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        acks: list[Ack] = self.inner.schedule(entity, messages, at, timeout=timeout / self.speed)
        return acks

    def describe(self, entity: str) -> EntityProfile:
        profile: EntityProfile = self.inner.describe(entity)
        return profile

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class KillSwitch:
    """SIGKILLs this very process at a scheduled call: a crash at an exact, replayable point.

    ``phase``: ``"before"`` (nothing of the call reached the broker) or
    ``"after_commit"`` (the broker stored it; the producer never hears back).
    """

    def __init__(self, inner: Any, kill: dict[str, Any] | None, log: Callable[[str], None]) -> None:
        self.inner = inner
        self.kill = kill
        self.calls = 0
        self.log = log

    def _maybe_kill(self, phase: str) -> None:
        kill = self.kill
        if kill is not None and kill["at_call"] == self.calls and kill["phase"] == phase:
            self.log(f"self-kill at call {self.calls} ({phase})")
            os.kill(os.getpid(), signal.SIGKILL)

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        self._maybe_kill("before")
        acks: list[Ack] = self.inner.send(entity, messages, timeout=timeout, atomic=atomic)
        self._maybe_kill("after_commit")
        self.calls += 1
        return acks

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        self._maybe_kill("before")
        acks: list[Ack] = self.inner.schedule(entity, messages, at, timeout=timeout)
        self._maybe_kill("after_commit")
        self.calls += 1
        return acks

    def describe(self, entity: str) -> EntityProfile:
        profile: EntityProfile = self.inner.describe(entity)
        return profile

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class AsyncKillSwitch:
    """:class:`KillSwitch` for an async backend (the ``sendonce.aio`` Service Bus client)."""

    def __init__(self, inner: Any, kill: dict[str, Any] | None, log: Callable[[str], None]) -> None:
        self.sync = KillSwitch(inner, kill, log)
        self.inner = inner

    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        self.sync._maybe_kill("before")
        acks: list[Ack] = await self.inner.send(entity, messages, timeout=timeout, atomic=atomic)
        self.sync._maybe_kill("after_commit")
        self.sync.calls += 1
        return acks

    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        self.sync._maybe_kill("before")
        acks: list[Ack] = await self.inner.schedule(entity, messages, at, timeout=timeout)
        self.sync._maybe_kill("after_commit")
        self.sync.calls += 1
        return acks

    async def describe(self, entity: str) -> EntityProfile:
        profile: EntityProfile = await self.inner.describe(entity)
        return profile

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class AsyncCancelPoint:
    """Cancels the task of the send call running now at a planned transport call.

    ``arm(point, task)`` at a call's start: ``{"transfer": k, "phase": "before"}``
    cancels the task as the call's k-th transport call starts (the transfer is then
    in flight when the cancellation lands), ``"after"`` right after the broker
    answered it (stored, the sender not yet told). ``{"after_s": x}`` is handled by
    the producer with a timer instead.
    """

    def __init__(self, inner: Any, log: Callable[[str], None]) -> None:
        self.inner = inner
        self.log = log
        self.point: dict[str, Any] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.count = 0

    def arm(self, point: dict[str, Any] | None, task: asyncio.Task[Any] | None) -> None:
        self.point = point if point and "transfer" in point else None
        self.task = task
        self.count = 0

    def _cancel_if(self, phase: str, index: int) -> None:
        point, task = self.point, self.task
        if point is None or task is None or point["phase"] != phase:
            return
        if point["transfer"] == index:
            self.log(f"cancelling the call's task {phase} its transport call {index}")
            task.cancel()

    async def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        index = self.count
        self.count += 1
        self._cancel_if("before", index)
        acks: list[Ack] = await self.inner.send(entity, messages, timeout=timeout, atomic=atomic)
        self._cancel_if("after", index)
        return acks

    async def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        index = self.count
        self.count += 1
        self._cancel_if("before", index)
        acks: list[Ack] = await self.inner.schedule(entity, messages, at, timeout=timeout)
        self._cancel_if("after", index)
        return acks

    async def describe(self, entity: str) -> EntityProfile:
        profile: EntityProfile = await self.inner.describe(entity)
        return profile

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# Holds the broker's write lock (as any other writer may) for argv[2] seconds.
LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
conn.close()
"""


class LockWaitInterrupt:
    """At scheduled calls, SIGINTs this process while it waits for the broker's write lock.

    Another process takes the write lock (``BEGIN IMMEDIATE``) and holds it for
    ``hold_s``; a moment after the call starts waiting for it, the process gets
    SIGINT: a notebook cell interrupted, a signal-based test timeout. The
    ``KeyboardInterrupt`` comes out of the call wherever Python delivers it.
    """

    armed = False  # SIGINT raises KeyboardInterrupt only while a scheduled call runs

    def __init__(
        self, inner: Any, db: str, plan: dict[str, float], log: Callable[[str], None]
    ) -> None:
        self.inner = inner
        self.db = db
        self.plan = {int(k): v for k, v in plan.items()}
        self.calls = 0
        self.log = log

    @contextlib.contextmanager
    def _interrupted(self) -> Iterator[None]:
        hold = self.plan.get(self.calls)
        self.calls += 1
        if hold is None:
            yield
            return
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, self.db, str(hold)], stdout=subprocess.PIPE, text=True
        )
        assert locker.stdout is not None
        locker.stdout.readline()  # "locked": our call will wait for it
        self.log(f"SIGINT during a lock wait at call {self.calls - 1} (held {hold}s)")
        timer = threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGINT))
        LockWaitInterrupt.armed = True
        timer.start()
        try:
            yield
        finally:
            LockWaitInterrupt.armed = False
            timer.cancel()
            locker.wait()

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        with self._interrupted():
            acks: list[Ack] = self.inner.send(entity, messages, timeout=timeout, atomic=atomic)
        return acks

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        with self._interrupted():
            acks: list[Ack] = self.inner.schedule(entity, messages, at, timeout=timeout)
        return acks

    def describe(self, entity: str) -> EntityProfile:
        profile: EntityProfile = self.inner.describe(entity)
        return profile

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _on_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C as Python delivers it, but only inside a scheduled call (else it is late)."""
    if LockWaitInterrupt.armed:
        raise KeyboardInterrupt
    print("SIGINT arrived after its call returned: ignored", flush=True)


def die_with_parent() -> None:
    """A forked child is SIGKILLed with its parent, as if the whole process group died."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


# -- the journal ---------------------------------------------------------------------------


class Journal:
    """Append-only JSON lines, each flushed and fsynced before the producer moves on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = read_journal(path)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the process
        if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            self._file.write("\n")  # end a line torn by a SIGKILL: ours start on a new one

    def write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.events.append(event)

    def close(self) -> None:
        self._file.close()


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Events of a journal; a line torn by a SIGKILL mid-write is skipped.

    A torn ``attempt`` means the send never started; a torn ``done`` leaves the
    call in flight, to be resumed: both are safe to forget.
    """
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


# -- the producer ---------------------------------------------------------------------------


class Producer:
    def __init__(self, run: dict[str, Any], index: int, incarnation: int) -> None:
        self.run = run
        self.schedule = schedule = run["schedule"]
        self.index = index
        self.incarnation = incarnation
        self.spec = schedule["producers"][index]
        self.plan = self.spec["incarnations"][incarnation]
        self.entity = schedule["entity"]
        self.profile = profile_of(self.entity)
        self.time = ScaledTime(run["base"], run["origin"], schedule["clock"]["speed"])
        retry = schedule["retry"]
        self.margin = float(retry["safety_margin_s"])
        window = self.profile.window
        self.window = None if window is None else window.total_seconds()
        self.journal = Journal(Path(run["workdir"]) / f"journal-{index}.jsonl")
        self.seq = 0
        self._retry_seed = schedule["seed"] * 1000 + index * 10 + incarnation
        self.call_prefix = f"{incarnation}."  # a forked child's calls: "{incarnation}.f{c}."
        self.tag = f"p{index}.{incarnation}"
        self.kept: list[Any] = []  # helper handles kept open between chunks
        self.url_senders: dict[str, IdempotentSender] = {}

    # -- plumbing ---------------------------------------------------------------------

    def log(self, text: str) -> None:
        print(
            f"[{self.tag} t={self.time.now() - self.time.base:.2f}] {text}",
            flush=True,
        )

    @property
    def max_in_flight(self) -> int:
        """Transfers a sender keeps in flight (the schedule's ``max_in_flight``)."""
        return int(self.schedule.get("max_in_flight", 1))

    def policy(self, extra_margin: float = 0.0) -> RetryPolicy:
        r = self.schedule["retry"]
        self._retry_seed += 1
        return RetryPolicy(
            max_attempts=r["max_attempts"],
            initial_backoff=r["initial_backoff"],
            max_backoff=r["max_backoff"],
            attempt_timeout=r["attempt_timeout"],
            safety_margin=timedelta(seconds=self.margin + extra_margin),
            sleep=self.time.sleep,
            clock=self.time.now,
            seed=self._retry_seed,
            async_sleep=self.time.async_sleep,
        )

    def fault_script(self) -> Callable[[int, str, Sequence[Message]], Fault]:
        table = {int(k): Fault(v) for k, v in self.plan["faults"].items()}

        def script(call: int, entity: str, messages: Sequence[Message]) -> Fault:
            return table.get(call, Fault.NONE)

        return script

    def open_backend(self) -> tuple[Any, Callable[[], None]]:
        """The backend stack: faults, then the kill switch, then the transport."""
        db = self.run["db"]
        cleanup: list[Callable[[], None]] = []
        transport: Any
        if self.schedule["transport"] == "emulator":
            from sendonce.backends import AzureServiceBusBackend
            from sendonce.emulator import Emulator, FaultAction

            conn_str = self.run.get("connection_string")
            if conn_str is None:
                # an emulator of our own: it dies with this process, like a broker node.
                # Its broker runs on the wall clock: emulator runs use speed 1 and a
                # wall-clock base, so it agrees with ours.
                emulator = Emulator(db, poll_interval=0.02)
                emulator.faults.add(*(FaultAction(a) for a in self.plan["emulator_faults"]))
                emulator.start()
                cleanup.append(emulator.stop)
                conn_str = emulator.connection_string
            transport = AzureServiceBusBackend(
                connection_string=conn_str, profiles={self.profile.name: self.profile}
            )
        else:
            from sendonce.backends import LocalBackend

            transport = LocalBackend(db, clock=self.time.now_dt)
        scaled: Any = ScaledTimeouts(transport, self.time.speed)
        if self.plan.get("interrupts"):
            scaled = LockWaitInterrupt(scaled, db, self.plan["interrupts"], self.log)
        killer = KillSwitch(scaled, self.plan["kill"], self.log)
        faulty = FaultyBackend(
            killer,
            self.fault_script(),
            slow_ack_delay=self.schedule["slow_ack_delay"],
            sleep=self.time.sleep,
        )

        self.aio_backend: Any = None
        if self.schedule.get("api", "").startswith("aio"):
            self.loop = asyncio.new_event_loop()
            if self.schedule["transport"] == "emulator":
                # the async Service Bus client itself; only the emulator's faults apply
                from sendonce.aio import AzureServiceBusBackend as AsyncServiceBus

                aio_transport = AsyncServiceBus(
                    connection_string=conn_str, profiles={self.profile.name: self.profile}
                )
                self.aio_backend = AsyncKillSwitch(aio_transport, self.plan["kill"], self.log)
                loop = self.loop
                cleanup.append(lambda: loop.run_until_complete(aio_transport.close()))
            else:
                from sendonce.aio import ThreadedBackend

                # not closed: closing it would close the sync stack (closed below)
                self.aio_backend = ThreadedBackend(faulty)
            cleanup.insert(0, self.loop.close)

        if self.aio_backend is not None:
            self.aio_backend = self.cancel_point = AsyncCancelPoint(self.aio_backend, self.log)

        def close() -> None:
            transport.close()
            for step in reversed(cleanup):
                step()

        self.killer, self.faulty = killer, faulty
        return faulty, close

    def reopen_backend(self) -> tuple[Any, Callable[[], None]]:
        """A new backend stack whose fault and kill schedules go on where the last one was."""
        calls, faults = self.killer.calls, self.faulty.calls
        backend, close = self.open_backend()
        self.killer.calls = calls
        self.faulty.calls = faults
        return backend, close

    def open_url_senders(self) -> None:
        """Two senders that open the broker by url, kept open for the whole incarnation."""
        spec = self.spec.get("url_senders")
        if not spec:
            return
        url = "local://" + str(Path(self.run["db"]).resolve())
        self.url_senders["a"] = IdempotentSender(url, self.profile, retry=self.policy())
        if spec["second"] == "same":
            self.url_senders["b"] = IdempotentSender(url, self.entity["name"], retry=self.policy())
        else:
            side = EntityProfile("orders-side", duplicate_detection_window=timedelta(minutes=10))
            self.url_senders["side"] = IdempotentSender(url, side, retry=self.policy())
            self.url_senders["b"] = self.url_senders["a"]

    def url_sender_for(self, kind: str, chunk: int | None) -> IdempotentSender | None:
        """The url sender that carries chunk ``chunk`` (``None``: the backend stack)."""
        spec = self.spec.get("url_senders")
        if not self.url_senders or spec is None or kind != "chunk" or chunk is None:
            return None
        choice = spec["pattern"][chunk % len(spec["pattern"])]
        if choice == "stack":
            return None
        if choice == "b" and "side" in self.url_senders:
            # the second sender, on its own entity, sends between the first one's calls
            side = Message(f"side {chunk}", message_id=f"side-{self.index}-{chunk}")
            with contextlib.suppress(InDoubtError, PermanentSendError):
                self.url_senders["side"].send(side)
        return self.url_senders[choice]

    def helper_handles(self, k: int) -> None:
        """Open, use and close other handles on the broker file while the stack's stays open."""
        from sendonce.backends import LocalBackend

        name = self.entity["name"]
        for at, action in self.spec.get("handles", []):
            if at != k:
                continue
            if action == "probe":
                with LocalBackend(self.run["db"], clock=self.time.now_dt) as helper:
                    helper.stats(name)
                    helper.describe(name)
            elif action == "open":
                helper = LocalBackend(self.run["db"], clock=self.time.now_dt)
                helper.stats(name)
                self.kept.append(helper)
            elif self.kept:
                self.kept.pop(0).close()

    # -- one logical send -----------------------------------------------------------------

    def send_call(
        self,
        backend: Any,
        numbers: list[int],
        *,
        kind: str,
        chunk: int | None,
        origin: float | None,
        resumes: str | None = None,
    ) -> None:
        """Send ``numbers`` as journaled calls; ``origin`` is the first attempt of a resend.

        A resend must finish before ``origin + window - margin``: the sender does
        that itself when given ``first_attempt=origin`` (and sends nothing, with
        ``InDoubtError``, once it has passed). ``sender.transaction()`` takes no
        ``first_attempt``, so a transactional group is resent with the policy's
        margin widened by the age of ``origin``, or not at all once too old.
        """
        if origin is None or self.schedule.get("api") != "transaction":
            self._attempt(
                backend, numbers, kind=kind, chunk=chunk, origin=origin, extra=0.0, resumes=resumes
            )
            return
        now = self.time.now()
        extra = 0.0
        if self.window is not None:
            age = now - origin
            extra = age + RESUME_SLACK
            if self.margin + extra + 0.1 >= self.window:
                self.journal.write(
                    {
                        "ev": "expired",
                        "ids": numbers,
                        "t": now,
                        "origin": origin,
                        "kind": kind,
                        "chunk": chunk,
                        "resumes": resumes,
                    }
                )
                self.log(f"refusing to resend {len(numbers)} ids first tried {age:.1f}s ago")
                return
        self._attempt(
            backend, numbers, kind=kind, chunk=chunk, origin=origin, extra=extra, resumes=resumes
        )

    def _attempt(
        self,
        backend: Any,
        numbers: list[int],
        *,
        kind: str,
        chunk: int | None,
        origin: float | None,
        extra: float,
        resumes: str | None,
    ) -> None:
        now = self.time.now()
        call_id = f"{self.call_prefix}{self.seq}"
        self.seq += 1
        self.journal.write(
            {
                "ev": "attempt",
                "call": call_id,
                "ids": numbers,
                "t": now,
                "origin": now if origin is None else origin,
                "kind": kind,
                "chunk": chunk,
                "resumes": resumes,
            }
        )
        messages = [message(n, self.entity) for n in numbers]
        every = self.schedule.get("scheduled_every", 0)
        later = [m for m in messages if every and id_number(m.message_id) % every == 0]
        now_ = [m for m in messages if not (every and id_number(m.message_id) % every == 0)]
        report = SendReport()
        api = self.schedule.get("api", "send_many")
        cancel = self.plan.get("cancels", {}).get(str(self.seq - 1))
        try:
            self._send(backend, report, api, now_, later, chunk, kind, origin, extra, cancel)
        except (asyncio.CancelledError, KeyboardInterrupt) as exc:
            # The application cancelled the call's task, or Ctrl-C came mid-call: its
            # transfers may have been stored, so the call is in flight, as after a crash.
            # Resume it at once with its original first attempt (or exit, and the
            # restarted incarnation finds it in flight).
            cancelled = isinstance(exc, asyncio.CancelledError)
            event: dict[str, Any] = {"ev": "interrupted", "call": call_id, "t": self.time.now()}
            if cancelled:
                event["how"] = "cancel"
            self.journal.write(event)
            what = "cancelled" if cancelled else "interrupted in"
            if self.spec.get("after_cancel" if cancelled else "after_interrupt") == "exit":
                self.log(f"{what} call {call_id}: exiting")
                raise SystemExit(130) from None
            self.log(f"{what} call {call_id}: resuming it")
            self.send_call(
                backend,
                numbers,
                kind="resume",
                chunk=chunk,
                origin=now if origin is None else origin,
                resumes=call_id,
            )
            return
        self.journal.write(self.done_event(call_id, report))

    def _send(
        self,
        backend: Any,
        report: SendReport,
        api: str,
        now_: list[Message],
        later: list[Message],
        chunk: int | None,
        kind: str,
        origin: float | None,
        extra: float,
        cancel: dict[str, Any] | None = None,
    ) -> None:
        if api.startswith("aio"):
            first = origin
            task = self.loop.create_task(
                self._aio_send(report, api, now_, later, first, self.policy(extra))
            )
            self.cancel_point.arm(cancel, task)
            if cancel is not None and "after_s" in cancel:
                self.log(f"cancelling the call's task after {cancel['after_s']}s")
                self.loop.call_later(cancel["after_s"], task.cancel)
            try:
                # raises CancelledError once the task has ended cancelled; a call that
                # finished before its cancellation is simply done
                self.loop.run_until_complete(task)
            finally:
                self.cancel_point.arm(None, None)
            return
        url_sender = self.url_sender_for(kind, chunk)
        with (
            contextlib.nullcontext(url_sender)
            if url_sender is not None
            else IdempotentSender(
                backend,
                self.profile,
                retry=self.policy(extra),
                max_in_flight=self.max_in_flight,
            )
        ) as sender:
            first = None if api == "transaction" else origin  # resumes keep their deadline
            if api == "send_many":
                if now_:
                    part = sender.send_many(now_, first_attempt=first)
                    report.results.extend(part.results)
                    report.failures.extend(part.failures)
            elif api == "transaction":
                try:
                    with sender.transaction() as tx:
                        tx.send_many(now_)
                    assert tx.report is not None
                    report.results.extend(tx.report.results)
                    report.failures.extend(tx.report.failures)
                except (InDoubtError, PermanentSendError) as exc:
                    report.failures.extend(
                        SendFailure(m.message_id, m.partition_key, exc) for m in now_
                    )
            else:
                for m in now_:
                    self._one(report, m, partial(sender.send, m, first_attempt=first))
            at = datetime.fromtimestamp(SCHEDULED_AT, UTC)
            for m in later:
                self._one(report, m, partial(sender.schedule, m, at, first_attempt=first))

    async def _aio_send(
        self,
        report: SendReport,
        api: str,
        now_: list[Message],
        later: list[Message],
        first: float | None,
        policy: RetryPolicy,
    ) -> None:
        """The same call through ``sendonce.aio``; ``aio_send`` runs one task per message."""
        from sendonce.aio import IdempotentSender as AsyncSender

        async def one(m: Message, coro: Any) -> None:
            try:
                report.results.append(await coro)
            except (InDoubtError, PermanentSendError) as exc:
                report.failures.append(SendFailure(m.message_id, m.partition_key, exc))

        at = datetime.fromtimestamp(SCHEDULED_AT, UTC)
        async with AsyncSender(
            self.aio_backend, self.profile, retry=policy, max_in_flight=self.max_in_flight
        ) as sender:
            if api == "aio_send_many":
                if now_:
                    part = await sender.send_many(now_, first_attempt=first)
                    report.results.extend(part.results)
                    report.failures.extend(part.failures)
            else:
                await asyncio.gather(*(one(m, sender.send(m, first_attempt=first)) for m in now_))
            for m in later:
                await one(m, sender.schedule(m, at, first_attempt=first))

    @staticmethod
    def _one(report: SendReport, m: Message, call: Callable[[], SendResult]) -> None:
        try:
            report.results.append(call())
        except (InDoubtError, PermanentSendError) as exc:
            report.failures.append(SendFailure(m.message_id, m.partition_key, exc))

    def done_event(self, call_id: str, report: SendReport) -> dict[str, Any]:
        sent = [id_number(r.message_id) for r in report.results if r.outcome != "duplicate"]
        dup = [id_number(r.message_id) for r in report.results if r.outcome == "duplicate"]
        in_doubt, permanent, other = [], [], []
        for failure in report.failures:
            n = id_number(failure.message_id)
            if isinstance(failure.error, InDoubtError):
                in_doubt.append(n)
            elif isinstance(failure.error, PermanentSendError):
                permanent.append(n)
            else:
                other.append([n, f"{type(failure.error).__name__}: {failure.error}"])
        return {
            "ev": "done",
            "call": call_id,
            "t": self.time.now(),
            "sent": sent,
            "duplicate": dup,
            "in_doubt": in_doubt,
            "permanent": permanent,
            "other": other,
            # the sequence numbers the sender reported, to check against the broker
            "seq": [
                [id_number(r.message_id), r.sequence_number]
                for r in report.results
                if r.sequence_number is not None
            ],
        }

    # -- the run ------------------------------------------------------------------------------

    def in_flight(self) -> list[tuple[dict[str, Any], list[int]]]:
        """Attempts of earlier incarnations never settled, with the ids still unsettled.

        An attempt is settled by its ``done``; a resend of it (attempts and
        expiries that name it in ``resumes``) settles the ids it covers.
        """
        events = self.journal.events
        done = {e["call"] for e in events if e["ev"] == "done"}
        covered: dict[str, set[int]] = {}
        for e in events:
            if e.get("resumes"):
                covered.setdefault(e["resumes"], set()).update(e["ids"])
        out = []
        for e in events:
            if e["ev"] != "attempt" or e["call"] in done:
                continue
            if e["call"].startswith(f"{self.incarnation}."):
                continue
            left = [n for n in e["ids"] if n not in covered.get(e["call"], set())]
            if left:
                out.append((e, left))
        return out

    def unresolved(self) -> tuple[dict[int, float], list[int]]:
        """Ids whose last outcome is in doubt (with their origin), and ids failed permanently."""
        origin_of: dict[str, float] = {}
        state: dict[int, tuple[str, float]] = {}
        for e in self.journal.events:
            if e["ev"] == "attempt":
                origin_of[e["call"]] = e["origin"]
            elif e["ev"] == "done":
                origin = origin_of[e["call"]]
                for key in ("sent", "duplicate"):
                    for n in e[key]:
                        state[n] = ("ok", origin)
                for n in e["in_doubt"]:
                    state[n] = ("doubt", origin)
                for n in e["permanent"]:
                    state[n] = ("permanent", origin)
        doubt = {n: o for n, (s, o) in state.items() if s == "doubt"}
        permanent = sorted(n for n, (s, _) in state.items() if s == "permanent")
        return doubt, permanent

    def main(self) -> None:
        chunk = self.schedule["chunk"]
        ids: list[int] = self.spec["ids"]
        chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
        self.journal.write({"ev": "start", "incarnation": self.incarnation, "t": self.time.now()})
        backend, self.close_stack = self.open_backend()
        try:
            self.open_url_senders()
            # 1. whatever an earlier incarnation left in flight
            for attempt, left in self.in_flight():
                self.log(f"resuming call {attempt['call']} ({len(left)} ids)")
                # "naive_resume" (the suite's own self-test) resends as if new: no deadline
                naive = self.schedule.get("naive_resume", False)
                self.send_call(
                    backend,
                    left,
                    kind="resume",
                    chunk=attempt["chunk"],
                    origin=None if naive else attempt["origin"],
                    resumes=attempt["call"],
                )
            # 2. the chunks not attempted yet (from the fork on, shared with forked children)
            started = {
                e["chunk"]
                for e in self.journal.events
                if e["ev"] in ("attempt", "expired") and e.get("chunk") is not None
            }
            todo = [k for k in range(len(chunks)) if k not in started]
            fork = self.spec.get("fork")
            forked = [k for k in todo if fork and k >= fork["at_chunk"]]
            for k in todo:
                if k in forked:
                    continue
                self.helper_handles(k)
                self.send_chunk(backend, k, chunks[k])
            if forked:
                backend = self.fork_children(backend, forked, chunks)
            # 3. the final passes
            for _ in range(2):
                doubt, permanent = self.unresolved()
                if self.schedule["redrive_in_doubt"] and doubt:
                    by_origin: dict[float, list[int]] = {}
                    for n, origin in doubt.items():
                        by_origin.setdefault(origin, []).append(n)
                    for origin, numbers in sorted(by_origin.items()):
                        self.send_call(
                            backend,
                            sorted(numbers),
                            kind="redrive_doubt",
                            chunk=None,
                            origin=origin,
                        )
                if self.schedule["permanent_policy"] == "redrive" and permanent:
                    self.send_call(
                        backend, permanent, kind="redrive_permanent", chunk=None, origin=None
                    )
        finally:
            self.close_stack()
            for sender in self.url_senders.values():
                sender.close()
            for helper in self.kept:
                helper.close()
        self.journal.write(
            {"ev": "finished", "incarnation": self.incarnation, "t": self.time.now()}
        )
        self.log("finished")

    def send_chunk(self, backend: Any, k: int, numbers: list[int]) -> None:
        self.send_call(backend, numbers, kind="chunk", chunk=k, origin=None)
        print(f"progress {k}", flush=True)

    # -- forked children ------------------------------------------------------------------

    def fork_children(self, backend: Any, chunks_left: list[int], chunks: list[list[int]]) -> Any:
        """Fork children (backend open) to send ``chunks_left``; close ours before they finish.

        Each child opens its own backend. The parent sends its share if it has
        one, closes its backend while the children still send, waits for them,
        and opens a new stack for the final passes (which read their journal lines).
        """
        fork = self.spec["fork"]
        n = fork["children"]
        slots = n + (1 if fork["parent_share"] else 0)
        shares = [chunks_left[s::slots] for s in range(slots)]
        context = multiprocessing.get_context("fork")
        children = []
        for c in range(n):
            closes = fork["close_inherited"] == c
            child = context.Process(target=self.child_main, args=(c, shares[c], chunks, closes))
            child.start()
            children.append(child)
        self.log(f"forked {n} children with the backend open")
        if fork["parent_share"]:
            for k in shares[n]:
                self.send_chunk(backend, k, chunks[k])
        self.close_stack()  # while the children still send
        self.close_stack = lambda: None
        self.log("parent closed its backend")
        for c, child in enumerate(children):
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"forked child {c} exited {child.exitcode}")
        self.journal.events = read_journal(self.journal.path)
        backend, self.close_stack = self.reopen_backend()
        return backend

    def child_main(self, c: int, share: list[int], chunks: list[list[int]], closes: bool) -> None:
        """A forked child: its own backend and journal handle, its calls named ``N.fC.seq``."""
        die_with_parent()
        self.tag += f"/f{c}"
        if closes:
            self.log("closing the backend inherited from the parent")
            self.close_stack()
        from sendonce.backends import LocalBackend

        self.journal = Journal(self.journal.path)  # appends beside the parent's lines
        self.call_prefix = f"{self.incarnation}.f{c}."
        self.seq = 0
        self.url_senders = {}  # the parent's: neither used nor closed here
        self.kept = []
        self._retry_seed += 100_000 * (c + 1)
        transport = LocalBackend(self.run["db"], clock=self.time.now_dt)
        try:
            backend = ScaledTimeouts(transport, self.time.speed)
            for k in share:
                self.send_chunk(backend, k, chunks[k])
        finally:
            transport.close()
        self.log("finished its share")
        self.journal.close()


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, _on_sigint)
    run = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    Producer(run, int(argv[2]), int(argv[3])).main()


if __name__ == "__main__":
    main(sys.argv)
