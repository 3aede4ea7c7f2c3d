"""What a durable send ledger costs: send_many with a ledger vs without, same broker.

Messages over ``--keys`` partition keys in one ``send_many`` to a fresh
**partitioned** entity with duplicate detection (one message per transfer, the
case where the ledger's per-transfer work shows most), without a ledger, with a
SQLite ledger, and (when PostgreSQL is installed) with a PostgreSQL ledger on a
throwaway loopback cluster; then a re-run of the same messages on the same ledger,
every key already confirmed (it sends nothing), timed against the first send
without a ledger.

Brokers: the local broker file in process, then the emulator (real azure-servicebus
client) at each ``--rtt-ms`` through ``bench/delay_proxy.py``. Rounds alternate;
medians, and the ratios to the run without a ledger, measured in this run; beside them the
CPU seconds of the call (this process's threads, plus a PostgreSQL ledger's server
process), the ratio the wall time tends to on a machine with no free core (there the
ledger's writes cannot overlap the broker's).
Targets: SQLite <= 1.3x, PostgreSQL <= 1.5x, a confirmed re-run <= 1.0x.

    python bench/bench_ledger.py [--messages 20000] [--network-messages 2000]
        [--rtt-ms 0 5] [--repeats 3] [--no-postgres] [--no-local] [--plain] [--no-dedup]
        [--smoke]

``--plain`` sends to an unpartitioned entity instead (the sender batches); ``--no-dedup``
to an entity without duplicate detection (where the ledger writes no intent ahead of the
transfers in flight: see docs/ledger.md); ``--rtt-ms`` with no value skips the emulator.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _network import emulator_process, load, through_rtts
from _smoke import add_smoke, apply_smoke

from sendonce import EntityProfile, IdempotentSender, Ledger, Message
from sendonce.backends import Backend
from sendonce.backends.local import LocalBackend
from sendonce.backends.servicebus import AzureServiceBusBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "functional" / "ledger"))


def messages(n: int, keys: int, tag: str) -> list[Message]:
    return [
        Message(f'{{"order_id": {i}}}', message_id=f"{tag}-{i}", partition_key=f"k{i % keys}")
        for i in range(n)
    ]


def server_cpu(ledger: Ledger | None) -> float:
    """CPU seconds of the PostgreSQL backend serving ``ledger``'s connection (0: none)."""
    conn = getattr(getattr(ledger, "store", None), "_conn", None)
    if conn is None:
        return 0.0
    fields = Path(f"/proc/{conn.info.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(
    backend: Backend, profile: EntityProfile, batch: list[Message], url: str | None
) -> tuple[float, float, float]:
    """The call's wall seconds, its CPU seconds (this process's threads plus a
    PostgreSQL ledger's backend: what it costs whatever the machine's load), and of
    those the PostgreSQL backend's."""
    ledger = Ledger(url) if url else None
    try:
        with IdempotentSender(
            backend, profile, ledger=ledger, require_duplicate_detection=False
        ) as sender:
            served = server_cpu(ledger)
            start, cpu = time.perf_counter(), time.process_time()
            report = sender.send_many(batch)
            elapsed = time.perf_counter() - start
            served = server_cpu(ledger) - served
            cpu = time.process_time() - cpu + served
        assert report.failed == 0, report.failures[:3]
        return elapsed, cpu, served
    finally:
        if ledger is not None:
            ledger.close()


@contextlib.contextmanager
def postgres(enabled: bool) -> Iterator[str | None]:
    if not enabled:
        yield None
        return
    try:
        from pgserver import pg_bin, throwaway_cluster
    except ImportError:
        yield None
        return
    if pg_bin() is None:
        yield None
        return
    with throwaway_cluster() as url:
        yield url


def measure(
    label: str,
    n: int,
    args: argparse.Namespace,
    root: Path,
    pg_url: str | None,
    entity: Callable[[str, int], tuple[Backend, EntityProfile]],
) -> None:
    """Alternating rounds of every variant on ``entity(name)``; print medians and ratios."""
    times: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    servers: dict[str, list[float]] = {}
    for r in range(args.repeats):
        stores: list[tuple[str, str | None]] = [
            ("none", None),
            ("sqlite", f"sqlite://{root / f'{label}-ledger{r}.db'}"),
        ]
        if pg_url is not None:
            stores.append(("postgres", pg_url))
        if r % 2:
            stores.reverse()
        for name, url in stores:
            backend, profile = entity(name, r)
            batch = messages(n, args.keys, profile.name)
            elapsed, cpu, served = one_run(backend, profile, batch, url)
            times.setdefault(name, []).append(elapsed)
            cpus.setdefault(name, []).append(cpu)
            servers.setdefault(name, []).append(served)
            if url is not None:  # the same messages again: every key is confirmed
                rerun, cpu, served = one_run(backend, profile, batch, url)
                times.setdefault(f"{name} re-run", []).append(rerun)
                cpus.setdefault(f"{name} re-run", []).append(cpu)
                servers.setdefault(f"{name} re-run", []).append(served)
    base = statistics.median(times["none"])
    base_cpu = statistics.median(cpus["none"])
    kind = "unpartitioned" if args.plain else "partitioned"
    dedup = "without" if args.no_dedup else "with"
    print(
        f"{label}: {n} messages, {args.keys} keys, {kind} entity {dedup} duplicate "
        f"detection (load {load()})"
    )
    for name, values in times.items():
        med, cpu = statistics.median(values), statistics.median(cpus[name])
        served = statistics.median(servers[name])
        per_key = f"  server {served / n * 1e6:4.1f} us/msg" if served else ""
        print(
            f"  {name:16s} {med:7.3f}s  {n / med:9.0f} msg/s  {med / base:5.2f}x no ledger"
            f"   CPU {cpu:6.3f}s {cpu / base_cpu:5.2f}x  {(cpu - served) / n * 1e6:4.1f} us/msg"
            f" here{per_key}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="local broker")
    parser.add_argument("--network-messages", type=int, default=2_000, help="emulator")
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--rtt-ms", type=float, nargs="*", default=[0.0, 5.0], help="none: no emulator runs"
    )
    parser.add_argument("--plain", action="store_true", help="an unpartitioned entity")
    parser.add_argument(
        "--no-dedup", action="store_true", help="an entity without duplicate detection"
    )
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-local", action="store_true")
    add_smoke(parser)
    args = apply_smoke(
        parser.parse_args(), messages=200, network_messages=40, keys=4, repeats=1, rtt_ms=[0.0]
    )
    with tempfile.TemporaryDirectory() as tmp, postgres(not args.no_postgres) as pg_url:
        root = Path(tmp)
        if not args.no_local:
            with LocalBackend(root / "broker.db") as broker:

                def local(name: str, r: int) -> tuple[Backend, EntityProfile]:
                    profile = EntityProfile(
                        f"{name}{r}",
                        partitioned=not args.plain,
                        duplicate_detection=not args.no_dedup,
                    )
                    broker.create_entity(profile)
                    return broker, profile

                measure("local broker", args.messages, args, root, pg_url, local)

        def entity_name(rtt: float, kind: str, r: int) -> str:
            return f"e{rtt:g}-{kind}{r}".replace(".", "_")

        names = [
            entity_name(rtt, kind, r)
            for rtt in args.rtt_ms
            for kind in ("none", "sqlite", "postgres")
            for r in range(args.repeats)
        ]
        profiles = {
            name: EntityProfile(
                name, partitioned=not args.plain, duplicate_detection=not args.no_dedup
            )
            for name in names
        }
        if not names:
            return
        with (
            emulator_process(root / "emulator.db", list(profiles.values())) as conn,
            through_rtts(conn, args.rtt_ms) as urls,
        ):
            for rtt, url in urls.items():
                with AzureServiceBusBackend.from_connection_string(url, profiles=profiles) as sb:

                    def remote(
                        kind: str, r: int, sb: Backend = sb, rtt: float = rtt
                    ) -> tuple[Backend, EntityProfile]:
                        return sb, profiles[entity_name(rtt, kind, r)]

                    label = f"emulator, RTT {rtt:g} ms"
                    measure(label, args.network_messages, args, root, pg_url, remote)


if __name__ == "__main__":
    main()
