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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import select
import selectors
import socket
import subprocess
import sys
import threading
from collections import deque
from types import TracebackType

__all__ = ["DelayProxy", "with_port"]


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
    """The proxy itself, run by the child process on its main thread.

    Two choices keep the instrument from distorting what it measures. Its event loop
    sleeps with microsecond timeouts (:class:`_PreciseEpoll`): asyncio's default epoll
    selector rounds each wait up to a whole millisecond, which delivered chunks up to
    1 ms late per direction. And each direction is a protocol with a FIFO of chunks and at most one
    timer, not a stream reader, a queue and a task: a fraction of the CPU per chunk.
    """

    def __init__(self, host: str, upstream_port: int, *, rtt: float, lifetime: float) -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.rtt = rtt
        self.lifetime = lifetime
        self.port = 0
        self._stop: asyncio.Event | None = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop = stop = asyncio.Event()
        pairs: set[_Side] = set()
        connecting: set[asyncio.Task[None]] = set()

        def accepted() -> _Side:
            side = _Side(self.rtt / 2, pairs)
            task = loop.create_task(side.connect(self.host, self.upstream_port))
            connecting.add(task)
            task.add_done_callback(connecting.discard)
            return side

        server = await loop.create_server(accepted, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        print(f"127.0.0.1:{self.port} -> {self.host}:{self.upstream_port}", flush=True)

        def watch_parent() -> None:
            sys.stdin.read()  # returns at EOF: the parent closed the pipe or went away
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=watch_parent, daemon=True).start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.lifetime):  # stops by itself
                await stop.wait()
        server.close()
        for side in list(pairs):
            side.abort()


class _Side(asyncio.Protocol):
    """One end of a proxied connection: what it reads goes to its peer ``delay`` later.

    Chunks wait in arrival order (the delay is the same for all, so that is due order)
    and one timer, for the oldest, is armed at a time.
    """

    def __init__(self, delay: float, pairs: set[_Side]) -> None:
        self.delay = delay
        self.pairs = pairs
        self.peer: _Side | None = None
        self.transport: asyncio.Transport | None = None
        self.due: deque[tuple[float, bytes | None]] = deque()  # chunks for the peer
        self.early: list[bytes | None] = []  # read before the upstream connection was made
        self.timer: asyncio.TimerHandle | None = None
        self.eof_read = False  # this end sent EOF
        self.eof_written = False  # EOF was passed on to this end
        self.loop = asyncio.get_running_loop()

    async def connect(self, host: str, port: int) -> None:
        """The client side: open the upstream connection and pair the two."""
        try:
            _, upstream = await self.loop.create_connection(
                lambda: _Side(self.delay, self.pairs), host, port
            )
        except OSError:
            self.abort()
            return
        self.peer, upstream.peer = upstream, self
        self.pairs.add(self)
        for chunk in self.early:
            self._arrived(chunk)
        self.early.clear()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._arrived(data)

    def eof_received(self) -> bool:
        self.eof_read = True
        self._arrived(None)
        return not self.eof_written  # half-closed until both directions ended

    def connection_lost(self, exc: Exception | None) -> None:
        self.pairs.discard(self)
        if exc is not None and self.peer is not None:
            self.peer.abort()

    def _arrived(self, chunk: bytes | None) -> None:
        if self.peer is None:
            self.early.append(chunk)
            return
        self.due.append((self.loop.time() + self.delay, chunk))
        if self.timer is None:
            self.timer = self.loop.call_at(self.due[0][0], self._deliver)

    def _deliver(self) -> None:
        """Write every chunk that is due, in order; arm the timer for the next one."""
        self.timer = None
        peer, due, now = self.peer, self.due, self.loop.time()
        assert peer is not None and peer.transport is not None
        while due and due[0][0] <= now:
            _, chunk = due.popleft()
            if peer.transport.is_closing():
                due.clear()
                return
            if chunk is None:
                peer.eof_written = True
                if peer.eof_read or not peer.transport.can_write_eof():
                    peer.transport.close()  # both directions ended
                else:
                    peer.transport.write_eof()
            else:
                peer.transport.write(chunk)
        if due:
            self.timer = self.loop.call_at(due[0][0], self._deliver)

    def abort(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for side in (self, self.peer):
            if side is not None and side.transport is not None:
                side.transport.abort()


def with_port(conn_str: str, port: int) -> str:
    """``conn_str`` with the endpoint's port replaced: the client connects to the proxy."""
    return re.sub(r"(Endpoint=sb://[^:;/]+):\d+", rf"\g<1>:{port}", conn_str, count=1)


def check(rtt: float, *, connections: int = 16, exchanges: int = 300) -> str:
    """What the proxy adds beyond ``rtt``, and its CPU per chunk: ``connections`` clients
    each send a small message to an echo server through it and wait for the answer,
    ``exchanges`` times; the same without the proxy is the baseline."""
    import statistics
    import time

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
    args = parser.parse_args()
    if args.check:
        for connections in (1, 16):
            print(check(args.rtt_ms / 1000, connections=connections))
        return
    if args.upstream is None:
        parser.error("--upstream is required")
    server = _Server(args.host, args.upstream, rtt=args.rtt_ms / 1000, lifetime=args.lifetime)
    with contextlib.suppress(KeyboardInterrupt):
        # select() waits with microsecond timeouts (epoll rounds up to whole milliseconds)
        with asyncio.Runner(loop_factory=_precise_loop) as runner:
            runner.run(server.serve())


def _precise_loop() -> asyncio.AbstractEventLoop:
    """An event loop whose waits end on time (see :class:`_PreciseEpoll`)."""
    return asyncio.SelectorEventLoop(_PreciseEpoll())


class _PreciseEpoll(selectors.EpollSelector):
    """epoll, but a wait with a timeout sleeps in ``select`` on the epoll descriptor: epoll
    rounds every timeout up to a whole millisecond, ``select`` takes microseconds."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            ready, _, _ = select.select([self.fileno()], [], [], timeout)
            if not ready:
                return []
            timeout = 0
        return super().select(timeout)


if __name__ == "__main__":
    main()
