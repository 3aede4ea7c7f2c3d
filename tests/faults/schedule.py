"""Random fault schedules, each a pure function of its seed.

A schedule says everything a run does: the entity's settings, the clock speed,
the retry policy, each producer's business ids (overlapping ranges), and per
producer incarnation the ``FaultyBackend`` faults by call index, the emulator
faults in transfer order, where the process SIGKILLs itself, and how long the
runner waits before restarting it. Only the real-time interleaving of several
processes is left to chance; the checker's invariant holds for all of them.
"""

from __future__ import annotations

import json
import random
from typing import Any

BASE_TIME = 1_900_000_000.0  # schedule clock origin (2030-03-17), in epoch seconds

LOCAL_FAULTS = ("before_commit", "after_commit", "slow_ack", "permanent")
EMULATOR_FAULTS = (
    "drop_after_commit",
    "drop_before_commit",
    "detach_after_commit",
    "withhold",
    "server_busy",
    "unauthorized",
)


def generate(seed: int, *, emulator: bool = True) -> dict[str, Any]:
    """The schedule of ``seed``. ``emulator=False`` never picks the emulator transport."""
    rng = random.Random(seed)
    use_emulator = rng.random() < 0.2 and emulator  # the same draws either way
    short_window = not use_emulator and rng.random() < 0.45

    partitioned = rng.random() < 0.35
    sessions = rng.random() < 0.3
    entity: dict[str, Any] = {
        "name": "orders",
        "kind": "topic" if rng.random() < 0.15 else "queue",
        "partitioned": partitioned,
        "sessions": sessions,
        "explicit_pk": partitioned and rng.random() < 0.6,
        "window_s": rng.choice([20, 25, 30, 40]) if short_window else 600,
    }
    if not short_window and not use_emulator and rng.random() < 0.1:
        entity["id_cache_size"] = 5000  # Artemis-style cache, larger than any schedule

    if use_emulator:
        speed = 1.0
    elif short_window:
        speed = round(entity["window_s"] / rng.uniform(1.5, 2.5), 1)  # window = 1.5-2.5 s real
    else:
        speed = rng.choice([1.0, 5.0])
    retry = {
        "max_attempts": rng.choice([2, 3, 4, 6]),
        "initial_backoff": 0.2 if short_window else 0.05,
        "max_backoff": 2.0 if short_window else 0.2,
        "attempt_timeout": (
            rng.choice([2.0, 4.0]) if short_window else (1.0 if use_emulator else 0.5 * speed)
        ),
        # at least 0.4 s of real time: the margin must cover a descheduled process too
        "safety_margin_s": max(rng.choice([5, 6, 8]), round(0.4 * speed, 1)) if short_window else 5,
    }

    # transactional groups (all or nothing, Artemis): local broker, unpartitioned
    transactions = not use_emulator and not partitioned and rng.random() < 0.25
    api = (
        "transaction"
        if transactions
        else rng.choice(["send_many", "send_many", "send", "aio_send_many", "aio_send"])
    )
    # groups of overlapping producers either coincide, or not (then a group holding an
    # id another group already sent is ignored whole by the broker)
    aligned = not transactions or rng.random() < 0.5
    if use_emulator or short_window:
        # a short window expires between independent producers' copies anyway: its
        # schedules test crashes and resends against the window, mostly one producer
        n_producers = rng.choice([1, 1, 2])
    else:
        n_producers = rng.choice([1, 2, 2, 3])
    if use_emulator:
        total = rng.randint(30, 60)
    elif entity["partitioned"]:
        total = rng.randint(60, 120)
    else:
        total = rng.randint(100, 300)
    chunk = rng.choice([5, 10, 20]) if entity["partitioned"] else rng.choice([5, 10, 25, 50])
    producers: list[dict[str, Any]] = []
    for _p in range(n_producers):
        # overlapping id ranges: each producer takes a random window of the id space
        if n_producers == 1:
            ids = list(range(total))
        else:
            length = rng.randint(total // 2, total)
            start = rng.randint(0, total - length)
            if transactions and aligned:
                start -= start % chunk
                length -= length % chunk
            ids = list(range(start, start + length))
            if rng.random() < 0.3 and not short_window and not transactions:
                rng.shuffle(ids)
        calls = len(ids) if entity["partitioned"] else -(-len(ids) // chunk)
        n_incarnations = rng.choice([1, 2]) if use_emulator else rng.choice([1, 2, 2, 3])
        fault_rate = (
            rng.choice([0.0, 0.05, 0.1]) if use_emulator else rng.choice([0.0, 0.1, 0.2, 0.35])
        )
        weights = [4, 4, 2, 1]
        incarnations = []
        for inc in range(n_incarnations):
            horizon = calls * 3 + 10
            faults = {}
            if not use_emulator or rng.random() < 0.5:
                call = 0
                while call < horizon:
                    if rng.random() < fault_rate:
                        # a burst strikes consecutive calls: the retries of one send
                        for _ in range(rng.choice([1, 1, 1, 2, 3, 4])):
                            faults[str(call)] = rng.choices(LOCAL_FAULTS, weights)[0]
                            call += 1
                    call += 1
            emulator_faults: list[str] = []
            if use_emulator:
                # each one costs the client about a second of reconnecting or timing out
                for _ in range(rng.randint(1, 3)):
                    emulator_faults.extend(["none"] * rng.randint(0, 6))
                    emulator_faults.append(rng.choices(EMULATOR_FAULTS, [4, 3, 3, 2, 2, 1])[0])
            kill = None
            if inc < n_incarnations - 1:
                kill = {
                    "at_call": rng.randint(0, max(calls - 1, 0)),
                    "phase": rng.choice(["before", "after_commit", "after_commit"]),
                }
            restart_delay = 0.0
            if inc > 0:
                restart_delay = (
                    rng.uniform(0, 1.4 * entity["window_s"])
                    if short_window
                    else rng.uniform(0, 0.3)
                )
            incarnations.append(
                {
                    "faults": faults,
                    "emulator_faults": emulator_faults,
                    "kill": kill,
                    "restart_delay_s": round(restart_delay, 3),
                }
            )
        producers.append({"ids": ids, "incarnations": incarnations})

    external_kill = None
    if rng.random() < 0.25:
        # the runner SIGKILLs incarnation 0 of the victim from outside, after its
        # n-th committed chunk (if it gets that far); one more incarnation restarts it
        victim = rng.randrange(n_producers)
        external_kill = {"producer": victim, "after_progress": rng.randint(0, 4)}
        producers[victim]["incarnations"].append(
            {
                "faults": {},
                "emulator_faults": [],
                "kill": None,
                "restart_delay_s": round(rng.uniform(0, 0.3), 3),
            }
        )
    emulator_shared = use_emulator and rng.random() < 0.5
    nemesis: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        # a nemesis SIGKILLs one producer at random moments (real time after each of its
        # first k incarnations starts): mid-transaction, mid-journal write, anywhere
        victim = rng.randrange(n_producers)
        for index in range(rng.randint(1, 3)):
            nemesis.append(
                {
                    "producer": victim,
                    "incarnation": index,
                    "after_s": round(rng.uniform(0.05, 0.8), 3),
                }
            )
            producers[victim]["incarnations"].append(
                {"faults": {}, "emulator_faults": [], "kill": None, "restart_delay_s": 0.0}
            )
    schedule = {
        "seed": seed,
        "transport": "emulator" if use_emulator else "local",
        "emulator_shared": emulator_shared,
        "entity": entity,
        "clock": {"base": BASE_TIME, "speed": speed},
        "retry": retry,
        "slow_ack_delay": rng.choice([0.05, 0.3, 1e9]) * (1 if speed == 1 else speed / 5),
        "chunk": chunk,
        "producers": producers,
        "external_kill": external_kill,
        "nemesis": nemesis,
        "permanent_policy": rng.choice(["abandon", "abandon", "redrive"]),
        # which sender calls carry the messages, and every k-th id is scheduled instead
        "api": api,
        "groups_aligned": aligned,
        "scheduled_every": 0 if api == "transaction" else rng.choice([0, 0, 0, 4, 7]),
        "redrive_in_doubt": rng.random() < 0.6,
    }
    add_sharing(schedule)
    add_in_flight(schedule)
    add_cancellation(schedule)
    return schedule


# Real seconds after a call starts at which its task is cancelled (when not at a transfer).
CANCEL_DELAYS = (0.0, 0.001, 0.005, 0.02)


def add_cancellation(schedule: dict[str, Any]) -> None:
    """Where an ``aio`` producer cancels the task running a send call, from its own rng.

    Drawn last and apart, so each seed's other choices stay what they were.
    ``cancels`` (per incarnation plan): at these send calls (one per chunk, the
    incarnation's own, counted from 0) the producer calls ``task.cancel()`` on the task
    running the call, as an application timeout or a shutdown would: as the call's
    k-th transport call starts (``{"transfer": k, "phase": "before"}``: the transfer is
    in flight) or right after the broker answered it (``"after"``: stored, the sender
    not yet told), or ``{"after_s": x}`` real seconds after the call started.
    ``after_cancel`` says what the producer does then: resume the call at once with
    its original first attempt (``resume``), or exit (130) and leave it to the
    restarted incarnation, which finds it in flight in its journal (``exit``).
    """
    rng = random.Random(f"cancel:{schedule['seed']}")
    chunk = schedule["chunk"]
    for spec in schedule["producers"]:
        spec["after_cancel"] = "resume"
        for plan in spec["incarnations"]:
            plan["cancels"] = {}
    if not schedule["api"].startswith("aio"):
        return
    for spec in schedule["producers"]:
        if rng.random() >= 0.5:
            continue
        n_chunks = -(-len(spec["ids"]) // chunk)  # one send call per chunk
        plan = spec["incarnations"][0]
        # a self-kill strikes at a transport call somewhere in the run: cancel early then
        limit = max(1, n_chunks // 3) if plan["kill"] else n_chunks
        for _ in range(rng.choice([1, 1, 2, 3])):
            call = rng.randint(0, max(limit - 1, 0))
            if rng.random() < 0.7:  # at a transport call: in flight, or stored and not yet told
                transfer = rng.choice([0, 0, 0, 1, 2])
                point = {"transfer": transfer, "phase": rng.choice(["before", "after"])}
            else:
                point = {"after_s": rng.choice(CANCEL_DELAYS)}
            plan["cancels"][str(call)] = point
        if rng.random() < 0.3:
            spec["after_cancel"] = "exit"
            spec["incarnations"].append(
                {
                    "faults": {},
                    "emulator_faults": [],
                    "kill": None,
                    "restart_delay_s": round(rng.uniform(0, 0.3), 3),
                    "interrupts": {},
                    "cancels": {},
                }
            )


def cancels(schedule: dict[str, Any]) -> int:
    """How many task cancellations a schedule plans."""
    return sum(
        len(plan.get("cancels", {})) for p in schedule["producers"] for plan in p["incarnations"]
    )


def add_in_flight(schedule: dict[str, Any]) -> None:
    """How many transfers a producer's sender keeps in flight, drawn from its own rng.

    Drawn last and apart, so each seed's other choices stay what they were. With more
    than one: faults (ack lost, drops, detach) strike one transfer while others are in
    flight, and a self-kill or the nemesis kills the process with transfers in flight.
    Schedules that SIGINT a producer waiting for the write lock keep one at a time.
    """
    rng = random.Random(f"in-flight:{schedule['seed']}")
    interrupts = any(
        plan.get("interrupts") for p in schedule["producers"] for plan in p["incarnations"]
    )
    choice = rng.choice([1, 1, 4, 8])
    schedule["max_in_flight"] = 1 if interrupts else choice


def add_sharing(schedule: dict[str, Any]) -> None:
    """Add the ways a broker file is shared (local transport only), drawn from their own rng.

    Drawn after, and apart from, everything else, so each seed's other choices
    stay what they were before these dimensions existed:

    - ``handles`` (per producer): before chunk ``k``, open a helper ``LocalBackend``
      on the same file and keep it (``open``), close the oldest kept one
      (``close``), or open one to read ``stats``/``describe`` and close it (``probe``),
      while the sending backend stays open;
    - ``url_senders``: two long-lived ``IdempotentSender("local:///...")`` per
      process, used alternately with the stack for chunks; the second one on the
      same entity (by name) or on another entity. Url senders stamp with the wall
      clock, so only wall-clock-speed schedules get them (``wall_clock``);
    - ``fork``: before chunk ``at_chunk``, the producer (backend open) forks
      children (multiprocessing, fork context) that open their own backends and
      send a share of the remaining chunks; the parent closes its backend before
      they finish (right away, or after its own share); ``close_inherited``
      names a child that first closes the backend it inherited;
    - ``interrupts`` (per incarnation plan): at these transport calls a helper
      process holds the write lock (``BEGIN IMMEDIATE``) for ``hold_s`` and the
      producer gets SIGINT while waiting for it; ``after_interrupt`` says whether it
      resumes the call and goes on, or exits (130) and is restarted;
    - ``observer``: a process running ``sendonce broker`` commands beside the producers.
    """
    rng = random.Random(f"sharing:{schedule['seed']}")
    local = schedule["transport"] == "local"
    api = schedule["api"]
    sync_api = not api.startswith("aio")
    wall_speed = schedule["clock"]["speed"] == 1.0 and schedule["entity"]["window_s"] >= 600
    schedule["wall_clock"] = False
    schedule["observer"] = None
    if local and rng.random() < 0.3:
        schedule["observer"] = {
            "commands": rng.choice([["stats"], ["stats", "peek"], ["peek", "stats"]]),
            "pause_s": rng.choice([0.05, 0.15, 0.3]),
        }
    chunk = schedule["chunk"]
    partitioned = schedule["entity"]["partitioned"]
    for spec in schedule["producers"]:
        n_calls = len(spec["ids"]) if partitioned else -(-len(spec["ids"]) // chunk)
        n_chunks = -(-len(spec["ids"]) // chunk)
        spec["handles"] = []
        spec["url_senders"] = None
        spec["fork"] = None
        spec["after_interrupt"] = "continue"
        for plan in spec["incarnations"]:
            plan["interrupts"] = {}
        if not local:
            continue
        if rng.random() < 0.35:
            rate = rng.choice([0.3, 0.6, 1.0])
            for k in range(n_chunks):
                if rng.random() < rate:
                    action = rng.choices(["probe", "open", "close"], [3, 2, 2])[0]
                    spec["handles"].append([k, action])
        if wall_speed and api in ("send_many", "send") and rng.random() < 0.5:
            pattern = rng.choice([["a", "b"], ["stack", "a", "b"], ["a", "stack", "b", "b"]])
            spec["url_senders"] = {"second": rng.choice(["same", "other"]), "pattern": pattern}
            schedule["wall_clock"] = True
        if sync_api and n_chunks >= 2 and rng.random() < 0.25:
            children = rng.randint(1, 3)
            spec["fork"] = {
                "at_chunk": rng.randint(0, n_chunks // 2),
                "children": children,
                "parent_share": rng.random() < 0.5,
                "close_inherited": rng.randrange(children) if rng.random() < 0.4 else None,
            }
        if sync_api and rng.random() < 0.25:
            plan = spec["incarnations"][0]  # before its kill, so that it happens
            limit = plan["kill"]["at_call"] if plan["kill"] else n_calls // 2 + 1
            for _ in range(rng.choice([1, 1, 2])):
                call = rng.randint(0, max(limit - 1, 0))
                plan["interrupts"][str(call)] = rng.choice([0.3, 0.5, 0.8])
            if rng.random() < 0.4:
                spec["after_interrupt"] = "exit"
                spec["incarnations"].append(
                    {
                        "faults": {},
                        "emulator_faults": [],
                        "kill": None,
                        "restart_delay_s": round(rng.uniform(0, 0.3), 3),
                        "interrupts": {},
                    }
                )


def sharing_traits(schedule: dict[str, Any]) -> list[str]:
    """The file-sharing dimensions a schedule exercises, for its summary."""
    traits = []
    producers = schedule["producers"]
    handles = sum(len(p.get("handles", [])) for p in producers)
    if handles:
        traits.append(f"helper-handles={handles}")
    urls = [p["url_senders"]["second"] for p in producers if p.get("url_senders")]
    if urls:
        traits.append("url-senders(" + ",".join(urls) + ")")
    forks = [p["fork"] for p in producers if p.get("fork")]
    for fork in forks:
        trait = f"fork({fork['children']} children"
        trait += ", parent shares" if fork["parent_share"] else ", parent closes first"
        if fork["close_inherited"] is not None:
            trait += ", child closes inherited"
        traits.append(trait + ")")
    interrupts = sum(len(i.get("interrupts", {})) for p in producers for i in p["incarnations"])
    if interrupts:
        exits = any(p.get("after_interrupt") == "exit" for p in producers)
        traits.append(f"sigint-in-lock-wait<={interrupts}" + ("(exit)" if exits else ""))
    if schedule.get("observer"):
        traits.append("observer(" + "+".join(schedule["observer"]["commands"]) + ")")
    if cancels(schedule):
        exits = any(p.get("after_cancel") == "exit" for p in producers)
        traits.append(f"task-cancel<={cancels(schedule)}" + ("(exit)" if exits else ""))
    return traits


def summary(schedule: dict[str, Any]) -> str:
    """One line saying what a schedule exercises."""
    e = schedule["entity"]
    transport = schedule["transport"]
    if transport == "emulator":
        transport += "(shared)" if schedule.get("emulator_shared") else "(per-producer)"
    traits = [transport, e["kind"], f"window={e['window_s']}s"]
    if e.get("id_cache_size"):
        traits.append("artemis-cache")
    if e["partitioned"]:
        traits.append("partitioned" + ("+pk" if e["explicit_pk"] else ""))
    if e["sessions"]:
        traits.append("sessions")
    traits.append(f"speed={schedule['clock']['speed']}")
    producers = schedule["producers"]
    kills = sum(1 for p in producers for i in p["incarnations"] if i["kill"])
    faults = sum(len(i["faults"]) for p in producers for i in p["incarnations"])
    emu = sum(
        sum(1 for a in i["emulator_faults"] if a != "none")
        for p in producers
        for i in p["incarnations"]
    )
    traits.append(f"producers={len(producers)}")
    traits.append(f"ids={len({n for p in producers for n in p['ids']})}")
    traits.append(f"self-kills={kills}")
    if schedule["external_kill"]:
        traits.append("external-kill")
    if schedule.get("nemesis"):
        traits.append(f"nemesis-kills<={len(schedule['nemesis'])}")
    traits.append(f"faults<={faults}")
    if emu:
        traits.append(f"emulator-faults={emu}")
    traits.append(f"api={schedule['api']}")
    if schedule["api"] == "transaction" and len(producers) > 1:
        traits.append("groups-aligned" if schedule["groups_aligned"] else "groups-overlap")
    if schedule["scheduled_every"]:
        traits.append(f"scheduled=1/{schedule['scheduled_every']}")
    traits.append(f"permanent={schedule['permanent_policy']}")
    if schedule["redrive_in_doubt"]:
        traits.append("redrive-in-doubt")
    traits.extend(sharing_traits(schedule))
    if schedule.get("max_in_flight", 1) > 1:
        traits.append(f"in-flight={schedule['max_in_flight']}")
    return " ".join(traits)


def dumps(schedule: dict[str, Any]) -> str:
    return json.dumps(schedule, indent=1, sort_keys=True)
