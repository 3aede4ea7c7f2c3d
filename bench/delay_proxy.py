"""A loopback TCP proxy that adds a fixed round trip: a network's latency without root.

There is no ``tc netem`` on every machine, so the benchmarks put this between the
client and the emulator. Each chunk read from one side is written to the other
``rtt / 2`` seconds after it arrived, in order, in both directions: a transfer
and its acknowledgement together cost one ``rtt``, as over a real network (the
bandwidth is loopback's). It binds 127.0.0.1 only and runs in its own process: on a
thread of the measured process it would wait for the GIL (up to the 5 ms switch
interval) and add jitter of the size being measured. It stops when closed, when its
parent goes away (its stdin closes), or after ``lifetime`` seconds.
``python bench/delay_proxy.py --check`` measures how long a round trip through it
really takes and the CPU it uses per chunk.

    with DelayProxy("127.0.0.1", emulator_port, rtt=0.005) as proxy:
        conn = with_port(emulator.connection_string, proxy.port)

    python bench/delay_proxy.py --upstream 5672 --rtt-ms 5      # serve until Ctrl-C
    python bench/delay_proxy.py --check --smoke                 # a few exchanges only
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from types import TracebackType

from _smoke import add_smoke

__all__ = ["DelayProxy", "with_port"]

_CHUNK = 256 * 1024


class DelayProxy:
    """Forward 127.0.0.1:``port`` to ``host``:``upstream_port`` with ``rtt`` seconds added,
    from a child process."""

    def __init__(
        self, host: str, upstream_port: int, *, rtt: float, lifetime: float = 3600.0
    ) -> None:
        if rtt < 0:
            raise ValueError("rtt must be >= 0")
        self.host = host
        self.upstream_port = upstream_port
        self.rtt = rtt
        self.lifetime = lifetime
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> DelayProxy:
        self._proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--host",
                self.host,
                "--upstream",
                str(self.upstream_port),
                "--rtt-ms",
                repr(self.rtt * 1000),
                "--lifetime",
                repr(self.lifetime),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("127.0.0.1:"):
            self.close()
            raise RuntimeError(f"the delay proxy did not start: {line!r}")
        self.port = int(line.split()[0].split(":")[1])
        return self

    @property
    def pid(self) -> int | None:
        """The proxy process's id while it runs (to read its CPU time)."""
        return None if self._proc is None else self._proc.pid

    def close(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the child's signal to stop
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Server:
    """The proxy itself, run by the child process on its main thread: one epoll loop.

    Every chunk waits the same ``rtt / 2``, so one FIFO of all connections' chunks is in
    due order, and the loop sleeps until the oldest is due. Two choices keep the instrument
    from distorting what it measures: it sleeps in ``select`` on the epoll descriptor
    (microsecond timeouts: epoll, asyncio's default, rounds each wait up to a whole
    millisecond, which delivered chunks up to 1 ms late per direction), and it is a plain
    loop over sockets, with no event-loop handles, transports or timers per chunk.
    """

    def __init__(self, host: str, upstream_port: int, *, rtt: float, lifetime: float) -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.rtt = rtt
        self.lifetime = lifetime
        self.port = 0

    def serve(self) -> None:
        delay = self.rtt / 2
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        stop_r, stop_w = os.pipe()

        def watch_parent() -> None:
            sys.stdin.read()  # returns at EOF: the parent closed the pipe or went away
            os.write(stop_w, b"x")

        threading.Thread(target=watch_parent, daemon=True).start()
        poller = select.epoll()
        poller.register(listener.fileno(), select.EPOLLIN)
        poller.register(stop_r, select.EPOLLIN)
        links: dict[int, _Link] = {}  # by descriptor: each end of each proxied connection
        due: deque[tuple[float, _Link, bytes]] = deque()  # chunks for a link's socket
        end = time.monotonic() + self.lifetime
        print(f"127.0.0.1:{self.port} -> {self.host}:{self.upstream_port}", flush=True)
        wait_on = [poller.fileno()]
        try:
            while True:
                now = time.monotonic()
                if now >= end:
                    return
                timeout = min(due[0][0] - now if due else 1.0, end - now)
                if timeout > 0 and not select.select(wait_on, [], [], timeout)[0]:
                    events = []
                else:
                    events = poller.poll(0)
                now = time.monotonic()
                for fd, _ in events:
                    link = links.get(fd)
                    if link is not None:
                        try:
                            chunk = link.sock.recv(_CHUNK)
                        except BlockingIOError:
                            continue
                        except OSError:
                            chunk = b""
                        due.append((now + delay, link.peer, chunk))
                        if not chunk:  # this end is done sending: stop reading it
                            poller.unregister(fd)
                    elif fd == stop_r:
                        return
                    else:
                        self._accept(listener, poller, links)
                while due and due[0][0] <= now:
                    _, link, chunk = due.popleft()
                    link.deliver(chunk, links)
        finally:
            for link in list(links.values()):
                link.close(links)
            listener.close()
            poller.close()

    def _accept(
        self, listener: socket.socket, poller: select.epoll, links: dict[int, _Link]
    ) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except BlockingIOError:
                return
            try:
                upstream = socket.create_connection((self.host, self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            a, b = _Link(client), _Link(upstream)
            a.peer, b.peer = b, a
            for link in (a, b):
                link.sock.setblocking(False)
                link.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                links[link.fd] = link
                poller.register(link.fd, select.EPOLLIN)


class _Link:
    """One end of a proxied connection; ``peer`` is the other end."""

    __slots__ = ("closed", "fd", "peer", "sock", "write_ended")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer: _Link = self
        self.closed = False
        self.write_ended = False

    def deliver(self, chunk: bytes, links: dict[int, _Link]) -> None:
        """Write ``chunk`` to this end (empty: the other end finished sending)."""
        if self.closed:
            return
        try:
            if not chunk:
                self.sock.shutdown(socket.SHUT_WR)
                self.write_ended = True
                if self.peer.write_ended:  # both directions are over
                    self.close(links)
                return
            sent = self.sock.send(chunk)
            if sent < len(chunk):  # the kernel's buffer is full: rare on loopback
                self.sock.settimeout(5.0)
                try:
                    self.sock.sendall(chunk[sent:])
                finally:
                    self.sock.setblocking(False)
        except OSError:
            self.close(links)

    def close(self, links: dict[int, _Link]) -> None:
        for link in (self, self.peer):
            if not link.closed:
                link.closed = True
                links.pop(link.fd, None)
                link.sock.close()  # closing also removes it from epoll


def with_port(conn_str: str, port: int) -> str:
    """``conn_str`` with the endpoint's port replaced: the client connects to the proxy."""
    return re.sub(r"(Endpoint=sb://[^:;/]+):\d+", rf"\g<1>:{port}", conn_str, count=1)


def check(rtt: float, *, connections: int = 16, exchanges: int = 300) -> str:
    """What the proxy adds beyond ``rtt``, and its CPU per chunk: ``connections`` clients
    each send a small message to an echo server through it and wait for the answer,
    ``exchanges`` times; the same without the proxy is the baseline."""
    import statistics

    from _network import process_cpu

    echo = socket.create_server(("127.0.0.1", 0))
    echo.listen(connections)

    def serve_one(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        for _ in range(2 * connections):
            conn, _ = echo.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    port = echo.getsockname()[1]

    def exchange(to: int) -> list[float]:
        times: list[list[float]] = [[] for _ in range(connections)]

        def client(i: int) -> None:
            with socket.create_connection(("127.0.0.1", to)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for _ in range(exchanges):
                    start = time.perf_counter()
                    sock.sendall(b"x" * 200)
                    got = 0
                    while got < 200:
                        got += len(sock.recv(65536))
                    times[i].append(time.perf_counter() - start)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [x for row in times for x in row]

    direct = statistics.median(exchange(port))
    with DelayProxy("127.0.0.1", port, rtt=rtt) as proxy:
        assert proxy.pid is not None
        cpu = process_cpu(proxy.pid)
        through = sorted(exchange(proxy.port))
        cpu = process_cpu(proxy.pid) - cpu
    echo.close()
    median, p90 = statistics.median(through), through[int(len(through) * 0.9)]
    chunks = 2 * connections * exchanges
    return (
        f"rtt {rtt * 1000:g} ms, {connections} connection(s): a round trip through the proxy "
        f"takes {median * 1000:.2f} ms (p90 {p90 * 1000:.2f}), without it {direct * 1000:.2f}; "
        f"{cpu / chunks * 1e6:.0f} µs of the proxy's CPU per chunk forwarded"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", type=int, help="the port to forward to")
    parser.add_argument("--check", action="store_true", help="measure the proxy, then exit")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--rtt-ms", type=float, default=5.0)
    parser.add_argument("--lifetime", type=float, default=3600.0, help="stop after this (s)")
    add_smoke(parser)  # with --check: 2 connections, 10 exchanges
    args = parser.parse_args()
    if args.check:
        exchanges = 10 if args.smoke else 300
        for connections in (1, 2) if args.smoke else (1, 16):
            print(check(args.rtt_ms / 1000, connections=connections, exchanges=exchanges))
        return
    if args.upstream is None:
        parser.error("--upstream is required")
    server = _Server(args.host, args.upstream, rtt=args.rtt_ms / 1000, lifetime=args.lifetime)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve()


if __name__ == "__main__":
    main()
