"""What the transactional outbox's relay costs, and how soon a commit reaches the broker.

1. Throughput: ``--messages`` messages over ``--keys`` partition keys, committed to the
   outbox (not timed), then published by one relay (``Relay.drain``), against sendonce's own
   ``send_many`` of the same messages from memory to the same backend: on the local broker,
   and through the emulator (real azure-servicebus client) at each ``--rtt-ms`` through
   ``bench/delay_proxy.py`` (transfers in flight: the backend's default). Rounds alternate;
   medians; target relay >= 0.8x send_many.
2. Commit-to-broker latency on the local broker at a moderate load (``--rate`` commits/s,
   one message each): a relay woken by NOTIFY, against one that only polls (``--poll``);
   p50 / p99 from the producer's commit to a consumer receiving it.
3. Several relay processes vs one on the same table (``sendonce relay --drain``); the
   broker is checked for duplicates.
4. Idle: transactions per second an idle relay costs the outbox database.

A throwaway PostgreSQL cluster is started (fsync off: the figures are CPU and round trips).
Throughput also reports CPU: the relay's process (both its threads) plus its PostgreSQL
backend, against ``send_many``'s process CPU; on a shared machine the wall-clock ratio
moves with the load, the CPU ratio much less.

    python bench/bench_outbox.py [--messages 10000] [--network-messages 2000] [--keys 1000]
        [--rtt-ms 0 5] [--repeats 3] [--rate 200] [--latency-messages 600] [--relays 3]
        [--smoke]

``--src DIR`` (repeatable) compares source trees (an older commit's ``src`` extracted
elsewhere, e.g. ``git archive OLD src | tar -x -C /tmp/old``): each round runs every tree
in its own process (its own ``--repeats``, medians), in alternating order, so a busy
machine slows each alike; then the medians over the rounds.

    python bench/bench_outbox.py --src /tmp/old/src --src src --rounds 5 --skip fleet idle
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _network import emulator_process, load, through_rtts
from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends import Backend
from sendonce.backends.local import LocalBackend
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.outbox import Relay, enqueue, install

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "functional" / "ledger"))
import psycopg
from pgserver import throwaway_cluster


def messages(n: int, keys: int, tag: str) -> list[Message]:
    return [
        Message(f'{{"order_id": {i}}}', message_id=f"{tag}-{i}", partition_key=f"k{i % keys}")
        for i in range(n)
    ]


def fresh_database(server: str, name: str) -> str:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = server.rsplit("/", 1)[0] + f"/{name}"
    install(url)
    return url


def fill(url: str, batch: list[Message], entity: str, per_commit: int = 1000) -> None:
    with psycopg.connect(url) as conn:
        for start in range(0, len(batch), per_commit):
            enqueue(conn, batch[start : start + per_commit], entity=entity, notify=False)
            conn.commit()


def backend_cpu(relay: Relay) -> Callable[[], float]:
    """CPU seconds used so far by the relay's PostgreSQL backend (0 where /proc is missing)."""
    pid = relay.store._conn.info.backend_pid if relay.store._conn is not None else None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def used() -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick

    return used


def throughput(
    label: str,
    n: int,
    args: argparse.Namespace,
    server: str,
    entity: Callable[[str], tuple[Backend, EntityProfile]],
) -> dict[str, float]:
    times: dict[str, list[float]] = {"send_many": [], "relay": []}
    cpu: dict[str, list[float]] = {"send_many": [], "relay": []}
    for r in range(args.repeats):
        order = ["send_many", "relay"] if r % 2 == 0 else ["relay", "send_many"]
        for kind in order:
            backend, profile = entity(f"{kind}{r}")
            batch = messages(n, args.keys, profile.name)
            if kind == "send_many":
                with IdempotentSender(backend, profile) as sender:
                    used, start = time.process_time(), time.perf_counter()
                    report = sender.send_many(batch)
                    times[kind].append(time.perf_counter() - start)
                    cpu[kind].append(time.process_time() - used)
                assert report.failed == 0, report.failures[:3]
                continue
            url = fresh_database(server, f"t{abs(hash(label)) % 10_000}_{r}")
            fill(url, batch, profile.name)
            with Relay(url, backend, [profile], batch_size=args.batch_size) as relay:
                postgres = backend_cpu(relay)
                before = postgres()
                used, start = time.process_time(), time.perf_counter()
                totals = relay.drain()
                times[kind].append(time.perf_counter() - start)
                cpu[kind].append(time.process_time() - used + postgres() - before)
            assert totals.published == n and totals.dead == 0, totals
    base = statistics.median(times["send_many"])
    taken = statistics.median(times["relay"])
    result = {
        "send_many_s": base,
        "relay_s": taken,
        "ratio": base / taken,
        "cpu_ratio": statistics.median(cpu["send_many"]) / statistics.median(cpu["relay"]),
        "load": float(load().split()[0]) if load() != "unknown" else -1.0,
    }
    if not args.json:
        print(f"{label}: {n} messages over {args.keys} keys (load {load()})")
        print(f"  send_many from memory {base:7.3f}s {n / base:9.0f} msg/s")
        print(
            f"  relay from the outbox {taken:7.3f}s {n / taken:9.0f} msg/s  {base / taken:5.2f}x"
            f"  (CPU {result['cpu_ratio']:.2f}x)"
        )
    return result


def latency(args: argparse.Namespace, server: str, root: Path) -> dict[str, float]:
    """p50/p99 commit-to-broker, NOTIFY vs polling only."""
    found: dict[str, float] = {}
    for mode in ("notify", "poll"):
        url = fresh_database(server, f"lat_{mode}")
        path = root / f"latency-{mode}.db"
        with LocalBackend(path) as broker:
            broker.create_entity(EntityProfile("orders"))
            committed: dict[str, float] = {}
            arrived: dict[str, float] = {}
            done = threading.Event()

            def consume(
                broker: LocalBackend = broker,
                done: threading.Event = done,
                arrived: dict[str, float] = arrived,
                committed: dict[str, float] = committed,
            ) -> None:
                while not done.is_set() or len(arrived) < len(committed):
                    got = broker.receive("orders", max_messages=100)
                    now = time.perf_counter()
                    for m in got:
                        arrived[m.message_id] = now
                    if not got:
                        time.sleep(0.001)
                    if done.is_set() and len(arrived) >= len(committed):
                        return

            poll = args.poll if mode == "poll" else 60.0
            relay = Relay(url, broker, [EntityProfile("orders")], poll_interval=poll)
            runner = threading.Thread(target=relay.run)
            consumer = threading.Thread(target=consume)
            runner.start()
            consumer.start()
            time.sleep(0.5)
            with psycopg.connect(url) as conn:
                gap = 1 / args.rate
                next_at = time.perf_counter()
                for i in range(args.latency_messages):
                    mid = f"{mode}-{i}"
                    enqueue(
                        conn,
                        [Message("x", message_id=mid, partition_key=f"k{i % 50}")],
                        entity="orders",
                        notify=mode == "notify",
                    )
                    conn.commit()
                    committed[mid] = time.perf_counter()
                    next_at += gap
                    time.sleep(max(0.0, next_at - time.perf_counter()))
            deadline = time.perf_counter() + poll + 30
            while len(arrived) < len(committed) and time.perf_counter() < deadline:
                time.sleep(0.01)
            done.set()
            relay.stop()
            runner.join()
            consumer.join()
            relay.close()
        delays = sorted((arrived[m] - committed[m]) * 1000 for m in committed if m in arrived)
        assert len(delays) == len(committed), "messages did not arrive"
        p50 = delays[len(delays) // 2]
        p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
        found[f"{mode}_p50_ms"], found[f"{mode}_p99_ms"] = p50, p99
        what = "NOTIFY" if mode == "notify" else f"polling every {poll:g}s"
        if not args.json:
            print(
                f"commit-to-broker, {what}, {args.rate:g} commits/s: p50 {p50:6.1f} ms, "
                f"p99 {p99:6.1f} ms ({len(delays)} messages, load {load()})"
            )
    return found


def relays_vs_one(args: argparse.Namespace, server: str, root: Path) -> None:
    n = args.messages
    results: dict[int, float] = {}
    for count in (1, args.relays):
        url = fresh_database(server, f"fleet{count}")
        path = root / f"fleet-{count}.db"
        with LocalBackend(path) as broker:
            broker.create_entity(EntityProfile("orders"))
        fill(url, messages(n, args.keys, "fleet"), "orders")
        command = [
            sys.executable, "-c", "from sendonce.cli import main; main()", "relay",
            "--outbox", url, "--to", f"local://{path}", "--entity", "orders", "--drain",
        ]  # fmt: skip
        start = time.perf_counter()
        procs = [subprocess.Popen(command, stdout=subprocess.DEVNULL) for _ in range(count)]
        for proc in procs:
            assert proc.wait() == 0
        results[count] = time.perf_counter() - start
        with LocalBackend(path) as broker:
            ids = broker.message_ids("orders")
        assert len(ids) == len(set(ids)) == n, "a row was published twice or lost"
    one, many = results[1], results[args.relays]
    print(
        f"relay processes on one table, {n} messages (process start included): 1 relay "
        f"{n / one:7.0f} msg/s, {args.relays} relays {n / many:7.0f} msg/s ({one / many:.2f}x)"
    )


def idle(server: str, root: Path) -> None:
    url = fresh_database(server, "idle")
    with LocalBackend(root / "idle.db") as broker:
        relay = Relay(url, broker, [EntityProfile("orders")], poll_interval=5.0)
        runner = threading.Thread(target=relay.run)
        runner.start()
        time.sleep(2)
        with psycopg.connect(server, autocommit=True) as conn:

            def xacts() -> int:
                conn.execute("SELECT pg_stat_clear_snapshot()")
                row = conn.execute(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                    "WHERE datname = 'idle'"
                ).fetchone()
                assert row is not None
                return int(row[0])

            before = xacts()
            time.sleep(20)
            spent = xacts() - before
        relay.stop()
        runner.join()
        relay.close()
    print(f"idle relay (poll 5 s): {spent / 20:.2f} transactions/s on the outbox database")


def compare(args: argparse.Namespace, argv: list[str]) -> None:
    """Each round, every ``--src`` tree in its own process (alternating order); medians."""
    sources: list[str] = args.src
    forwarded: list[str] = []
    skip_next = False
    for arg in argv:  # every option but --src/--rounds goes to the children
        if skip_next:
            skip_next = False
            continue
        if arg in ("--src", "--rounds"):
            skip_next = True
            continue
        if arg.startswith(("--src=", "--rounds=")):
            continue
        forwarded.append(arg)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {src: [] for src in sources}
    loads: list[str] = []
    for r in range(args.rounds):
        order = sources if r % 2 == 0 else list(reversed(sources))
        loads.append(load())
        for src in order:
            env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
            command = [sys.executable, __file__, *forwarded, "--json"]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            runs[src].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.rounds} alternating rounds, one process per tree and round; medians")
    print(f"load at each round's start: {'; '.join(loads)}")
    for label in runs[sources[0]][0]:
        print(label)
        for key in runs[sources[0]][0][label]:
            if key == "load":
                continue
            for src in sources:
                values = [run[label][key] for run in runs[src]]
                each = " ".join(f"{v:.3g}" for v in values)
                print(
                    f"  {key:14} {src[-24:]:>24}: median {statistics.median(values):8.3f}  ({each})"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000, help="local broker")
    parser.add_argument("--network-messages", type=int, default=2_000, help="emulator")
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, nargs="*", default=[0.0, 5.0])
    parser.add_argument("--rate", type=float, default=200.0, help="commits/s for latency")
    parser.add_argument("--latency-messages", type=int, default=600)
    parser.add_argument("--poll", type=float, default=0.5, help="the polling relay's interval")
    parser.add_argument("--relays", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], help="throughput latency fleet idle")
    parser.add_argument("--src", action="append", help="a source tree to compare (repeatable)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --src comparisons")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    add_smoke(parser)
    args = apply_smoke(
        parser.parse_args(),
        messages=200,
        network_messages=40,
        keys=20,
        repeats=1,
        rtt_ms=[0.0],
        latency_messages=20,
        relays=2,
        skip=["idle"],
        rounds=1,
    )
    if args.src:
        compare(args, sys.argv[1:])
        return
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, throwaway_cluster() as server:
        root = Path(tmp)
        if "throughput" not in args.skip:
            with LocalBackend(root / "broker.db") as broker:

                def local(name: str) -> tuple[Backend, EntityProfile]:
                    profile = EntityProfile(name)
                    broker.create_entity(profile)
                    return broker, profile

                results["local broker"] = throughput(
                    "local broker", args.messages, args, server, local
                )
            names = [
                f"e{str(rtt).replace('.', '_')}_{kind}{r}"
                for rtt in args.rtt_ms
                for kind in ("send_many", "relay")
                for r in range(args.repeats)
            ]
            profiles = {name: EntityProfile(name) for name in names}
            if names:
                with (
                    emulator_process(root / "emulator.db", list(profiles.values())) as conn,
                    through_rtts(conn, args.rtt_ms) as urls,
                ):
                    for rtt, url in urls.items():
                        with AzureServiceBusBackend.from_connection_string(
                            url, profiles=profiles
                        ) as sb:

                            def remote(
                                name: str, sb: Backend = sb, rtt: float = rtt
                            ) -> tuple[Backend, EntityProfile]:
                                return sb, profiles[f"e{str(rtt).replace('.', '_')}_{name}"]

                            label = f"emulator, RTT {rtt:g} ms"
                            results[label] = throughput(
                                label, args.network_messages, args, server, remote
                            )
        if "latency" not in args.skip:
            results["latency, local broker"] = latency(args, server, root)
        if "fleet" not in args.skip:
            relays_vs_one(args, server, root)
        if "idle" not in args.skip:
            idle(server, root)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
