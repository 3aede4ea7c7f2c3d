"""sendonce on Artemis against a hand-written proton sender: the same messages, the same
``_AMQ_DUPL_ID`` (a string), durable, to the same real broker, in interleaved rounds.

Loopback (the broker started here, persistence on):

- ``single``: N messages one at a time, each waiting for its disposition (raw: one
  delivery, then the next; sendonce: ``sender.send`` in a loop);
- ``batch``: N messages in transfers of ``--batch``, each transfer's deliveries pipelined
  and settled before the next (raw: the same with proton; sendonce: ``send_many`` of each
  batch, one transfer per call);
- ``broker``: the raw sender with 1,000 unsettled deliveries (the broker's credit): the
  broker's own rate on this machine, so a reader knows which side is the limit.

Through ``bench/delay_proxy.py`` at ``--rtt-ms`` (5): the raw sender with 16 unsettled
deliveries (one message each) vs sendonce ``send_many`` with 16 partition keys (16
transfers in flight, one message each), 16 threads calling ``sender.send()`` on one sender,
and ``ArtemisBackend.submit`` kept 16 outstanding from one thread (the transfer seam an
engine drives: no thread per transfer), beside the one-at-a-time line (raw single sends).
Targets (issue 37): sendonce <= 1.1x the raw time on loopback, single and batches; at 5 ms,
>= 0.8x the raw 16-unsettled rate and >= 10x the one-at-a-time line, client CPU a message
<= 1.5x raw.

The broker is the tests' (NIO journal, ``journal-datasync=false``, persistence on, durable
messages) with a larger heap and its ``journal-buffer-timeout`` autotuned by ``artemis
perf-journal``, as ``artemis create`` does for a production broker. The tests keep NIO's
default, 3.33 ms: every durable send then waits for that timer, which caps one message at a
time near 300/s and hides the clients' own cost; ``--journal-buffer-timeout default``
measures against that broker, or give nanoseconds. Both sides always use the same broker;
the script prints its configuration. Every figure comes with each client's CPU per message
(this process, over the timed window only): on a loaded machine wall-clock ratios move with
the load, the CPU each client spends much less.

    python bench/bench_artemis.py [--messages 2000] [--rounds 5] [--rtt-ms 5]
        [--journal-buffer-timeout auto|default|NS] [--smoke]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _network import load
from _smoke import add_smoke, apply_smoke
from delay_proxy import DelayProxy
from proton import Message as ProtonMessage
from proton import symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from artemis.broker import ARTEMIS_VERSION, ArtemisBroker
from sendonce import EntityProfile, IdempotentSender, Message
from sendonce.backends import ArtemisBackend

JAVA_ARGS = (
    "-XX:+UseG1GC -Xms256M -Xmx1G -Dlog4j2.disableJmx=true "
    "--add-opens java.base/jdk.internal.misc=ALL-UNNAMED"
)


class _Queue(LinkOption):
    def apply(self, link: Any) -> None:
        link.target.capabilities.put_object(symbol("queue"))


class RawSender(MessagingHandler):  # type: ignore[misc]
    """N durable messages with ``_AMQ_DUPL_ID``, at most ``window`` unsettled; with
    ``barrier`` the next ``window`` go only once the previous ones are all settled."""

    def __init__(self, url: str, address: str, ids: list[str], window: int, barrier: bool):
        super().__init__(auto_settle=True)
        self.url, self.address, self.ids = url, address, ids
        self.window, self.barrier = window, barrier
        self.sent = self.settled = 0
        self.started = self.ended = 0.0
        self.cpu = 0.0  # this process's CPU seconds from the first credit to the last settle

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, reconnect=False)
        self.link = event.container.create_sender(self.conn, self.address, options=_Queue())

    def on_sendable(self, event: Any) -> None:
        if not self.started:
            self.started = time.perf_counter()
            self.cpu = -time.process_time()
        self._pump()

    def _pump(self) -> None:
        limit = self.window
        if self.barrier:
            limit = self.window if self.sent == self.settled else 0
        while self.sent < len(self.ids) and self.sent - self.settled < limit and self.link.credit:
            mid = self.ids[self.sent]
            self.link.send(
                ProtonMessage(
                    body=f"body {mid}",
                    id=mid,
                    durable=True,
                    properties={"_AMQ_DUPL_ID": mid},
                )
            )
            self.sent += 1

    def on_settled(self, event: Any) -> None:
        self.settled += 1
        if self.settled == len(self.ids):
            self.ended = time.perf_counter()
            self.cpu += time.process_time()
            self.conn.close()
        else:
            self._pump()


def raw(url: str, address: str, ids: list[str], window: int, barrier: bool = False) -> float:
    return raw_run(url, address, ids, window, barrier)[0]


def raw_run(
    url: str, address: str, ids: list[str], window: int, barrier: bool = False
) -> tuple[float, float]:
    """Wall-clock and CPU seconds of a raw run, from its first credit (no setup)."""
    handler = RawSender(url, address, ids, window, barrier)
    Container(handler).run()
    return handler.ended - handler.started, handler.cpu


class Figures:
    """Wall-clock and CPU seconds of each measurement, by name; medians."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def add(self, name: str, wall_cpu: tuple[float, float]) -> None:
        self.wall.setdefault(name, []).append(wall_cpu[0])
        self.cpu.setdefault(name, []).append(wall_cpu[1])

    def timed(self, name: str, work: Any, *args: Any) -> Any:
        cpu, began = time.process_time(), time.perf_counter()
        result = work(*args)
        self.add(name, (time.perf_counter() - began, time.process_time() - cpu))
        return result

    def seconds(self, name: str) -> float:
        return statistics.median(self.wall[name])

    def cpu_us(self, name: str, n: int) -> float:
        """Median CPU microseconds per message."""
        return statistics.median(self.cpu[name]) / n * 1e6


def submitted(backend: ArtemisBackend, messages: list[Message], window: int) -> None:
    """Every message its own transfer through ``submit``, ``window`` outstanding, one thread,
    driven as docs/engine.md has an engine drive it: a done-callback records the outcome and
    frees a slot (no ``concurrent.futures.wait`` over every future per completion)."""
    slots = threading.Semaphore(window)
    failed: list[BaseException] = []

    def done(future: concurrent.futures.Future[Any]) -> None:
        error = future.exception()
        if error is not None:
            failed.append(error)
        slots.release()

    for m in messages:
        slots.acquire()
        backend.submit("bench", [m], timeout=30).add_done_callback(done)
    for _ in range(window):
        slots.acquire()
    if failed:
        raise failed[0]


def threads_sending(pool: concurrent.futures.ThreadPoolExecutor, sender: Any, msgs: Any) -> None:
    """``sender.send`` of every message from the pool's threads at once."""
    for result in pool.map(sender.send, msgs):
        assert result.outcome == "sent"


def ids_for(tag: str, n: int) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"{tag}-{run}-{i}" for i in range(n)]


def broker_for(journal_buffer_timeout: str) -> tuple[ArtemisBroker, str]:
    """The broker (not started) and a line saying how its journal is configured."""
    broker = ArtemisBroker(java_args=JAVA_ARGS)
    try:
        if journal_buffer_timeout == "auto":
            value = broker.autotune_journal()
            how = f"{value:,} ns, autotuned by artemis perf-journal"
        elif journal_buffer_timeout == "default":
            how = "NIO's default 3,333,333 ns, as in the tests"
        else:
            broker.set_journal_buffer_timeout(int(journal_buffer_timeout))
            how = f"{int(journal_buffer_timeout):,} ns, as given"
    except BaseException:
        broker.remove()
        raise
    return broker, (
        f"broker: Artemis {ARTEMIS_VERSION}, persistence on, NIO journal, journal-datasync="
        f"false, journal-buffer-timeout {how}; durable messages; JVM {JAVA_ARGS.split(' -D')[0]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--single", type=int, default=500, help="messages sent one at a time")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rtt-ms", type=float, default=5.0)
    parser.add_argument(
        "--journal-buffer-timeout",
        default="auto",
        help="the broker's: auto (artemis perf-journal), default (NIO's, as in the tests), "
        "or nanoseconds",
    )
    add_smoke(parser)
    args = apply_smoke(
        parser.parse_args(),
        messages=40,
        single=10,
        batch=10,
        rounds=1,
        journal_buffer_timeout="default",
    )
    n, single, batch = args.messages, args.single, args.batch
    print(f"load before: {load()}")
    broker, configuration = broker_for(args.journal_buffer_timeout)
    print(configuration)
    with broker:
        url = broker.url()
        profile = EntityProfile("bench", id_cache_size=20_000)
        loop = Figures()

        def one_by_one(sender: IdempotentSender, messages: list[Message]) -> None:
            for m in messages:
                sender.send(m)

        def in_batches(sender: IdempotentSender, messages: list[Message]) -> None:
            for k in range(0, len(messages), batch):
                sender.send_many(messages[k : k + batch])

        def backend_one_by_one(backend: ArtemisBackend, messages: list[Message]) -> None:
            for m in messages:
                backend.send("bench", [m], timeout=30)

        with (
            IdempotentSender(url, profile, max_batch_messages=batch) as sender,
            ArtemisBackend.from_url(url, profiles={"bench": profile}) as near,
        ):
            # Warm both paths (link attach, JIT) before timing.
            raw(url, "bench", ids_for("warm", 200), 16)
            sender.send_many([Message("w", message_id=i) for i in ids_for("warm", 200)])
            for _ in range(args.rounds):
                loop.add("raw single", raw_run(url, "bench", ids_for("rs", single), 1))
                msgs = [Message(f"body {i}", message_id=i) for i in ids_for("ss", single)]
                loop.timed("sendonce single", one_by_one, sender, msgs)
                msgs = [Message(f"body {i}", message_id=i) for i in ids_for("bs", single)]
                loop.timed("backend single", backend_one_by_one, near, msgs)
                loop.add("raw batch", raw_run(url, "bench", ids_for("rb", n), batch, True))
                msgs = [Message(f"body {i}", message_id=i) for i in ids_for("sb", n)]
                loop.timed("sendonce batch", in_batches, sender, msgs)
                loop.add("broker", raw_run(url, "bench", ids_for("rw", n), 1000))
        print(f"\nloopback, {args.rounds} interleaved rounds, medians:")
        for kind, count in (("single", single), ("batch", n)):
            r, s = loop.seconds(f"raw {kind}"), loop.seconds(f"sendonce {kind}")
            print(
                f"  {kind:6}: raw {count / r:8,.0f} msg/s, sendonce {count / s:8,.0f} msg/s, "
                f"sendonce time {s / r:.2f}x raw; client CPU per message: raw "
                f"{loop.cpu_us(f'raw {kind}', count):,.0f} us, sendonce "
                f"{loop.cpu_us(f'sendonce {kind}', count):,.0f} us"
            )
        r, b = loop.seconds("raw single"), loop.seconds("backend single")
        print(
            f"  single, the backend alone (ArtemisBackend.send, no sender): {single / b:,.0f} "
            f"msg/s, {b / r:.2f}x raw; client CPU {loop.cpu_us('backend single', single):,.0f} "
            "us per message"
        )
        print(
            f"  broker's own rate: {n / loop.seconds('broker'):,.0f} msg/s (raw sender, 1,000 "
            "unsettled)"
        )

        rtt = args.rtt_ms / 1000
        keyed = [
            Message(f"body {i}", message_id=i, partition_key=f"k{j % 16}")
            for j, i in enumerate(ids_for("warm2", 64))
        ]
        wan = Figures()
        count = min(n, 800)
        few = max(count // 8, 10)
        with DelayProxy("127.0.0.1", broker.port, rtt=rtt) as proxy:
            far = broker.url(port=proxy.port)
            with (
                IdempotentSender(far, profile, max_batch_messages=1) as sender,
                ArtemisBackend.from_url(far, profiles={"bench": profile}) as backend,
                concurrent.futures.ThreadPoolExecutor(16) as pool,
            ):
                sender.send_many(keyed)
                submitted(backend, [Message("w", message_id=i) for i in ids_for("warm3", 32)], 16)
                raw(far, "bench", ids_for("warm", 32), 16)
                for _ in range(args.rounds):
                    msgs = [Message(f"body {i}", message_id=i) for i in ids_for("wt", count)]
                    wan.timed("sendonce 16 threads", threads_sending, pool, sender, msgs)
                    msgs = [Message(f"body {i}", message_id=i) for i in ids_for("wb", count)]
                    wan.timed("backend submit 16", submitted, backend, msgs, 16)
                    wan.add("raw 1 at a time", raw_run(far, "bench", ids_for("w1", few), 1))
                    wan.add("raw 16 unsettled", raw_run(far, "bench", ids_for("w16", count), 16))
                    msgs = [
                        Message(f"body {i}", message_id=i, partition_key=f"k{j % 16}")
                        for j, i in enumerate(ids_for("wk", count))
                    ]
                    report = wan.timed("sendonce 16 keys", sender.send_many, msgs)
                    assert report.sent == count
        one = few / wan.seconds("raw 1 at a time")
        r16 = count / wan.seconds("raw 16 unsettled")
        k16 = count / wan.seconds("sendonce 16 keys")
        t16 = count / wan.seconds("sendonce 16 threads")
        b16 = count / wan.seconds("backend submit 16")
        print(f"\n{args.rtt_ms:g} ms RTT (delay proxy), medians:")
        print(
            f"  raw one at a time:        {one:8,.0f} msg/s; client CPU "
            f"{wan.cpu_us('raw 1 at a time', few):,.0f} us per message"
        )
        print(
            f"  raw 16 unsettled:         {r16:8,.0f} msg/s = {r16 / one:.1f}x one at a time; "
            f"client CPU {wan.cpu_us('raw 16 unsettled', count):,.0f} us per message"
        )
        print(
            f"  sendonce 16 keys:         {k16:8,.0f} msg/s = {k16 / r16:.2f}x raw 16 unsettled, "
            f"{k16 / one:.1f}x one at a time; client CPU "
            f"{wan.cpu_us('sendonce 16 keys', count):,.0f} us per message"
        )
        print(
            f"  sendonce 16 threads:      {t16:8,.0f} msg/s = {t16 / r16:.2f}x raw 16 unsettled, "
            f"{t16 / one:.1f}x one at a time; client CPU "
            f"{wan.cpu_us('sendonce 16 threads', count):,.0f} us per message"
        )
        print(
            f"  backend submit, 16 out:   {b16:8,.0f} msg/s = {b16 / r16:.2f}x raw 16 unsettled, "
            f"{b16 / one:.1f}x one at a time; client CPU "
            f"{wan.cpu_us('backend submit 16', count):,.0f} us per message"
        )
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
