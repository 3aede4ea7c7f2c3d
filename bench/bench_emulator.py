"""Benchmark: IdempotentSender over AzureServiceBusBackend vs raw ServiceBusSender calls.

Both run in one process against one emulator (started as ``sendonce emulator``
in a subprocess, so the broker does not share the client's GIL), with the same
messages, in alternating rounds with fresh ids, at each ``--rtt-ms`` (through
``bench/delay_proxy.py`` for a round trip above 0). Prints messages per second
for single sends and batches, and the ratio sendonce / raw (target: <= 1.05).

    python bench/bench_emulator.py [--rtt-ms 0 5] [--singles 150] [--batched 2000] [--rounds 7]
        [--smoke]

``--links 8 16`` measures the emulator instead (the server's own cost): the raw aio
client works each count of sender links with one task per link, one message per
transfer, and the emulator process's CPU (utime + stime from /proc) is divided by
the messages it stored, at loopback unless ``--rtt-ms`` says otherwise (over a
round trip the links' transfers reach the emulator spread out, as from a
network). ``--emulator-src DIR`` (repeatable) serves from another
source tree (an older commit checked out elsewhere): every tree gets its own
emulator process and broker file, and the rounds interleave them, so a busy
machine slows each alike.

    python bench/bench_emulator.py --links 8 16 --emulator-src OLD/src --emulator-src src
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path

from _network import emulator_process, load, through_rtts
from _smoke import add_smoke, apply_smoke
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSender
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import MessageSizeExceededError

from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends import Ack, AzureServiceBusBackend
from sendonce.backends.local import LocalBackend

PROFILE = EntityProfile("orders")


def bodies(n: int, prefix: str) -> list[tuple[str, bytes]]:
    return [(f"{prefix}-{i}", b'{"order": %d, "amount": "12.50"}' % i) for i in range(n)]


def raw_singles(sender: ServiceBusSender, items: list[tuple[str, bytes]]) -> None:
    for message_id, body in items:
        sender.send_messages(ServiceBusMessage(body, message_id=message_id), timeout=30)


def raw_batches(sender: ServiceBusSender, items: list[tuple[str, bytes]]) -> None:
    batch = sender.create_message_batch()
    for message_id, body in items:
        message = ServiceBusMessage(body, message_id=message_id)
        try:
            batch.add_message(message)
        except MessageSizeExceededError:  # full: send it and start the next one
            sender.send_messages(batch, timeout=30)
            batch = sender.create_message_batch()
            batch.add_message(message)
    if len(batch):
        sender.send_messages(batch, timeout=30)


def sendonce_singles(sender: IdempotentSender, items: list[tuple[str, bytes]]) -> None:
    for message_id, body in items:
        sender.send(Message(body, message_id=message_id))


def backend_singles(backend: AzureServiceBusBackend, items: list[tuple[str, bytes]]) -> None:
    for message_id, body in items:
        backend.send("orders", [Message(body, message_id=message_id)], timeout=30)


def sendonce_batches(sender: IdempotentSender, items: list[tuple[str, bytes]]) -> None:
    sender.send_many([Message(body, message_id=message_id) for message_id, body in items])


class _NullBackend:
    """Accepts everything at once: isolates the sender's own cost per call."""

    def describe(self, entity: str) -> EntityProfile:
        return EntityProfile(entity)

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        return [Ack("accepted") for _ in messages]

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        return [Ack("accepted") for _ in messages]

    def close(self) -> None:
        pass

    def __enter__(self) -> _NullBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sender_overhead(n: int = 20000) -> tuple[float, float]:
    """Microseconds per call: IdempotentSender.send over a null backend, RetryPolicy.call."""
    with IdempotentSender(_NullBackend(), "orders") as sender:
        items = bodies(n, "null")
        start = time.process_time()
        sendonce_singles(sender, items)
        per_send = (time.process_time() - start) / n
    policy = RetryPolicy()
    window = PROFILE.window
    start = time.process_time()
    for _ in range(n):
        policy.call(lambda timeout: None, window=window, message_id="x")
    per_call = (time.process_time() - start) / n
    return per_send * 1e6, per_call * 1e6


def timed(fn: Callable[[], None]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds (the client side only)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(conn_str: str, args: argparse.Namespace, tag: str) -> dict[str, tuple[float, float]]:
    """Median (wall, client CPU) seconds per variant, interleaved rounds on warmed links."""
    client = ServiceBusClient.from_connection_string(conn_str, retry_total=0)
    raw = client.get_queue_sender("orders")
    raw.__enter__()
    backend = AzureServiceBusBackend.from_connection_string(conn_str, profiles={"orders": PROFILE})
    sender = IdempotentSender(backend, "orders", retry=RetryPolicy(attempt_timeout=30.0))
    # warm both links (connection setup is not what is measured)
    raw_singles(raw, bodies(5, f"{tag}warm-raw"))
    sendonce_singles(sender, bodies(5, f"{tag}warm-so"))
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in ("rs", "ss", "bs", "rb", "sb")}
    for r in range(args.rounds):
        # alternate which side goes first, so drift hits both equally
        t = f"{tag}{r}"
        pairs = [
            ("rs", lambda t=t: raw_singles(raw, bodies(args.singles, f"rs{t}"))),
            ("ss", lambda t=t: sendonce_singles(sender, bodies(args.singles, f"ss{t}"))),
            ("bs", lambda t=t: backend_singles(backend, bodies(args.singles, f"bs{t}"))),
            ("rb", lambda t=t: raw_batches(raw, bodies(args.batched, f"rb{t}"))),
            ("sb", lambda t=t: sendonce_batches(sender, bodies(args.batched, f"sb{t}"))),
        ]
        if r % 2:
            pairs = [pairs[2], pairs[1], pairs[0], pairs[4], pairs[3]]
        for key, fn in pairs:
            results[key].append(timed(fn))
    sender.close()
    backend.close()
    raw.close()
    client.close()
    return {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for k, v in results.items()
    }


# -- the emulator's own cost ---------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


_CREATE = (
    "import sys\n"
    "from sendonce import EntityProfile\n"
    "from sendonce.backends.local import LocalBackend\n"
    "with LocalBackend(sys.argv[1]) as store:\n"
    "    store.create_entity(EntityProfile(sys.argv[2]))\n"
)
_COUNT = (
    "import sys\n"
    "from sendonce.backends.local import LocalBackend\n"
    "with LocalBackend(sys.argv[1]) as store:\n"
    "    print(len(store.message_ids(sys.argv[2])))\n"
)


@contextlib.contextmanager
def emulator_from(source: str, db: Path) -> Iterator[tuple[str, int]]:
    """``sendonce emulator`` run from the source tree ``source``: (connection string, pid).

    The broker file is made by that tree too (an older tree reads only its own schema).
    """
    env = dict(os.environ, PYTHONPATH=str(Path(source).resolve()))
    subprocess.run([sys.executable, "-c", _CREATE, str(db), PROFILE.name], env=env, check=True)
    code = "from sendonce.cli import main; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "emulator", "--db", str(db), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        yield proc.stdout.readline().strip(), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def links_round(conn_str: str, links: int, n: int, tag: str) -> float:
    """Send ``n`` single-message transfers over ``links`` sender links, one task per link."""
    async with AsyncServiceBusClient.from_connection_string(conn_str, retry_total=0) as client:
        senders = [client.get_queue_sender("orders") for _ in range(links)]
        # warm: attach (about a second for the client, whoever serves) and a first transfer
        await asyncio.gather(*(sender.__aenter__() for sender in senders))
        for i, sender in enumerate(senders):
            await sender.send_messages(ServiceBusMessage(b"warm", message_id=f"{tag}w{i}"))

        async def work(k: int) -> None:
            sender = senders[k]
            for i in range(k, n, links):
                body = b'{"order": %d, "amount": "12.50"}' % i
                await sender.send_messages(ServiceBusMessage(body, message_id=f"{tag}-{i}"))

        start = time.perf_counter()
        await asyncio.gather(*(work(k) for k in range(links)))
        wall = time.perf_counter() - start
        await asyncio.gather(*(sender.close() for sender in senders))
        return wall


def server_bench(args: argparse.Namespace) -> None:
    sources = args.emulator_src or [str(Path(__file__).resolve().parents[1] / "src")]
    # (source, rtt, links) -> [(msg/s, emulator CPU us per message)]
    results: dict[tuple[str, float, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(emulator_from(src, Path(tmp) / f"bench{i}.db"))
            for i, src in enumerate(sources)
        ]
        # Behind a delay proxy the links' transfers reach the emulator spread out (each
        # alone in its turn of the network loop), as from clients over a network.
        urls = [stack.enter_context(through_rtts(conn, args.rtt_ms)) for conn, _ in servers]
        for r in range(args.rounds):
            order = list(range(len(sources)))
            if r % 2:
                order.reverse()
            for rtt in args.rtt_ms:
                for links in args.links:
                    for i in order:
                        pid = servers[i][1]
                        before = process_cpu(pid)
                        # the warm-up transfers are counted with the rest: links + n messages
                        tag = f"r{r}t{rtt:g}l{links}"
                        wall = asyncio.run(links_round(urls[i][rtt], links, args.messages, tag))
                        cpu = process_cpu(pid) - before
                        sent = args.messages + links
                        results.setdefault((sources[i], rtt, links), []).append(
                            (args.messages / wall, 1e6 * cpu / sent)
                        )
        stack.close()  # the emulators stop: their files are whole
        stored = []
        for i, src in enumerate(sources):
            env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
            db = str(Path(tmp) / f"bench{i}.db")
            count = [sys.executable, "-c", _COUNT, db, PROFILE.name]
            stored.append(int(subprocess.run(count, env=env, capture_output=True).stdout))
    expected = args.rounds * len(args.rtt_ms) * sum(args.messages + n for n in args.links)
    print(
        f"emulator server benchmark: {args.rounds} interleaved rounds of {args.messages} "
        f"single-message transfers, medians (min-max); load {load()}"
    )
    print(f"  stored messages per emulator: {stored} (expected {expected} each)")
    for rtt, links in itertools.product(args.rtt_ms, args.links):
        print(f" RTT {rtt:g} ms, {links} sender links, one task each")
        for src in sources:
            rows = results[(src, rtt, links)]
            rates = [rate for rate, _ in rows]
            cpus = [cpu for _, cpu in rows]
            print(
                f"  {src}: {statistics.median(rates):7.0f} msg/s ({min(rates):.0f}-"
                f"{max(rates):.0f})  emulator CPU {statistics.median(cpus):5.0f} us/msg "
                f"({min(cpus):.0f}-{max(cpus):.0f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--singles", type=int, default=150, help="single sends per round")
    parser.add_argument("--batched", type=int, default=2000, help="batched messages per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--rtt-ms", type=float, nargs="+", help="round trips to measure at (0 5; --links: 0)"
    )
    parser.add_argument(
        "--links", type=int, nargs="+", help="measure the emulator with these many sender links"
    )
    parser.add_argument("--messages", type=int, default=3000, help="messages per --links round")
    parser.add_argument(
        "--emulator-src",
        action="append",
        help="serve from this source tree (repeat to compare trees, interleaved)",
    )
    add_smoke(parser)
    args = parser.parse_args()
    if args.links:
        apply_smoke(args, links=[2], messages=40, rounds=1, rtt_ms=[0.0])
    else:
        apply_smoke(args, singles=4, batched=40, rounds=1, rtt_ms=[0.0])
    if args.links:
        args.rtt_ms = args.rtt_ms or [0.0]
        server_bench(args)
        return
    args.rtt_ms = args.rtt_ms or [0.0, 5.0]

    measured: dict[float, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        with (
            emulator_process(db, [PROFILE]) as conn_str,
            through_rtts(conn_str, args.rtt_ms) as urls,
        ):
            for rtt, url in urls.items():
                measured[rtt] = measure(url, args, f"{rtt:g}ms-")
        with LocalBackend(db) as store:
            stored = len(store.message_ids("orders"))

    expected = len(args.rtt_ms) * (10 + args.rounds * (3 * args.singles + 2 * args.batched))
    print(f"emulator benchmark: {args.rounds} interleaved rounds, medians; load {load()}")
    print(f"  stored messages: {stored} (expected {expected})")
    for rtt, medians in measured.items():
        wall = {k: w for k, (w, _) in medians.items()}
        cpu = {k: c for k, (_, c) in medians.items()}
        print(f" RTT {rtt:g} ms")
        for label, n, raw_key, so_key in (
            ("single sends", args.singles, "rs", "ss"),
            ("batches     ", args.batched, "rb", "sb"),
        ):
            print(
                f"  {label}  raw {n / wall[raw_key]:7.0f} msg/s  sendonce "
                f"{n / wall[so_key]:7.0f} msg/s  wall ratio {wall[so_key] / wall[raw_key]:.3f}"
                f"  client-CPU ratio {cpu[so_key] / cpu[raw_key]:.3f}"
                f"  (client CPU {1e6 * cpu[raw_key] / n:.0f} vs {1e6 * cpu[so_key] / n:.0f} us/msg)"
            )
        n = args.singles
        print(
            f"  AzureServiceBusBackend.send alone: {n / wall['bs']:7.0f} msg/s"
            f"  wall ratio {wall['bs'] / wall['rs']:.3f}"
            f"  client-CPU ratio {cpu['bs'] / cpu['rs']:.3f} ({1e6 * cpu['bs'] / n:.0f} us/msg)"
        )
    per_send, per_call = sender_overhead()
    print(
        f"  IdempotentSender.send over a null backend: {per_send:.0f} us/call "
        f"(RetryPolicy.call alone: {per_call:.0f} us)"
    )


if __name__ == "__main__":
    main()
