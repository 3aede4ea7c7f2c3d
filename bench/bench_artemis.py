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
transfers in flight, one message each), and the one-at-a-time line (raw single sends).
Targets: sendonce <= 1.1x the raw time on loopback; >= 0.7x the raw 16-unsettled rate and
>= 8x the one-at-a-time line at 5 ms.

    python bench/bench_artemis.py [--messages 2000] [--rounds 5] [--rtt-ms 5] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
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
from artemis.broker import ArtemisBroker
from sendonce import EntityProfile, IdempotentSender, Message

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

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, reconnect=False)
        self.link = event.container.create_sender(self.conn, self.address, options=_Queue())

    def on_sendable(self, event: Any) -> None:
        if not self.started:
            self.started = time.perf_counter()
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
            self.conn.close()
        else:
            self._pump()


def raw(url: str, address: str, ids: list[str], window: int, barrier: bool = False) -> float:
    handler = RawSender(url, address, ids, window, barrier)
    Container(handler).run()
    return handler.ended - handler.started


def ids_for(tag: str, n: int) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"{tag}-{run}-{i}" for i in range(n)]


def median_rate(times: list[float], n: int) -> float:
    return n / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--single", type=int, default=500, help="messages sent one at a time")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rtt-ms", type=float, default=5.0)
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(), messages=40, single=10, batch=10, rounds=1)
    n, single, batch = args.messages, args.single, args.batch
    print(f"load before: {load()}")
    with ArtemisBroker(java_args=JAVA_ARGS) as broker:
        url = broker.url()
        profile = EntityProfile("bench", id_cache_size=20_000)
        times: dict[str, list[float]] = {}

        def timed(name: str, seconds: float) -> None:
            times.setdefault(name, []).append(seconds)

        with IdempotentSender(url, profile, max_batch_messages=batch) as sender:
            # Warm both paths (link attach, JIT) before timing.
            raw(url, "bench", ids_for("warm", 200), 16)
            sender.send_many([Message("w", message_id=i) for i in ids_for("warm", 200)])
            for _ in range(args.rounds):
                timed("raw single", raw(url, "bench", ids_for("rs", single), 1))
                msgs = [Message(f"body {i}", message_id=i) for i in ids_for("ss", single)]
                began = time.perf_counter()
                for m in msgs:
                    sender.send(m)
                timed("sendonce single", time.perf_counter() - began)
                timed("raw batch", raw(url, "bench", ids_for("rb", n), batch, barrier=True))
                msgs = [Message(f"body {i}", message_id=i) for i in ids_for("sb", n)]
                began = time.perf_counter()
                for k in range(0, n, batch):
                    sender.send_many(msgs[k : k + batch])
                timed("sendonce batch", time.perf_counter() - began)
                timed("broker (raw, 1000 unsettled)", raw(url, "bench", ids_for("rw", n), 1000))
        print(f"\nloopback, {args.rounds} interleaved rounds, medians:")
        for kind, count in (("single", single), ("batch", n)):
            r = statistics.median(times[f"raw {kind}"])
            s = statistics.median(times[f"sendonce {kind}"])
            print(
                f"  {kind:6}: raw {count / r:8,.0f} msg/s, sendonce {count / s:8,.0f} msg/s, "
                f"sendonce time {s / r:.2f}x raw"
            )
        print(
            f"  broker's own rate: {median_rate(times['broker (raw, 1000 unsettled)'], n):,.0f}"
            " msg/s (raw sender, 1,000 unsettled)"
        )

        rtt = args.rtt_ms / 1000
        keyed = [
            Message(f"body {i}", message_id=i, partition_key=f"k{j % 16}")
            for j, i in enumerate(ids_for("warm2", 64))
        ]
        wan: dict[str, list[float]] = {}
        with DelayProxy("127.0.0.1", broker.port, rtt=rtt) as proxy:
            far = broker.url(port=proxy.port)
            with IdempotentSender(far, profile, max_batch_messages=1) as sender:
                sender.send_many(keyed)
                raw(far, "bench", ids_for("warm", 32), 16)
                for _ in range(args.rounds):
                    count = min(n, 800)
                    wan.setdefault("raw 1 at a time", []).append(
                        raw(far, "bench", ids_for("w1", max(count // 8, 10)), 1)
                    )
                    wan.setdefault("raw 16 unsettled", []).append(
                        raw(far, "bench", ids_for("w16", count), 16)
                    )
                    msgs = [
                        Message(f"body {i}", message_id=i, partition_key=f"k{j % 16}")
                        for j, i in enumerate(ids_for("wk", count))
                    ]
                    began = time.perf_counter()
                    report = sender.send_many(msgs)
                    wan.setdefault("sendonce 16 keys", []).append(time.perf_counter() - began)
                    assert report.sent == count
        one = max(min(n, 800) // 8, 10) / statistics.median(wan["raw 1 at a time"])
        r16 = min(n, 800) / statistics.median(wan["raw 16 unsettled"])
        k16 = min(n, 800) / statistics.median(wan["sendonce 16 keys"])
        print(f"\n{args.rtt_ms:g} ms RTT (delay proxy), medians:")
        print(f"  raw one at a time:        {one:8,.0f} msg/s")
        print(f"  raw 16 unsettled:         {r16:8,.0f} msg/s")
        print(
            f"  sendonce 16 keys:         {k16:8,.0f} msg/s = {k16 / r16:.2f}x raw 16 unsettled, "
            f"{k16 / one:.1f}x one at a time"
        )
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
