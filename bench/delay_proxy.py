"""A loopback TCP proxy that adds a fixed round trip: a network's latency without root.

There is no ``tc netem`` on every machine, so the benchmarks put this between the
client and the emulator. Each chunk read from one side is written to the other
``rtt / 2`` seconds after it arrived, in order, in both directions: a transfer
and its acknowledgement together cost one ``rtt``, as over a real network (the
bandwidth is loopback's). It binds 127.0.0.1 only and runs in its own process:
on a thread of the measured process it would wait for the GIL (up to the 5 ms
switch interval) and add jitter of the size being measured. It stops when
closed, when its parent goes away (its stdin closes), or after ``lifetime`` seconds.

    with DelayProxy("127.0.0.1", emulator_port, rtt=0.005) as proxy:
        conn = with_port(emulator.connection_string, proxy.port)

    python bench/delay_proxy.py --upstream 5672 --rtt-ms 5      # serve until Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import subprocess
import sys
import threading
from types import TracebackType

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
    """The proxy itself, run by the child process on its main thread."""

    def __init__(self, host: str, upstream_port: int, *, rtt: float, lifetime: float) -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.rtt = rtt
        self.lifetime = lifetime
        self.port = 0
        self._stop: asyncio.Event | None = None

    async def serve(self) -> None:
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await self._pair(reader, writer)
            except asyncio.CancelledError:
                pass  # stopping: the pair's sockets are closed by _pair
            finally:
                tasks.discard(task)

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        print(f"127.0.0.1:{self.port} -> {self.host}:{self.upstream_port}", flush=True)
        loop = asyncio.get_running_loop()
        stop = self._stop

        def watch_parent() -> None:
            sys.stdin.read()  # returns at EOF: the parent closed the pipe or went away
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=watch_parent, daemon=True).start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.lifetime):  # stops by itself
                await self._stop.wait()
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _pair(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(self._pump(client_r, up_w), self._pump(up_r, client_w))
        finally:
            for w in (client_w, up_w):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks as they come; write each one ``rtt / 2`` after it was read, in order."""
        loop = asyncio.get_running_loop()
        delay = self.rtt / 2
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    else:
                        writer.close()
                    return
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()

        delivering = asyncio.create_task(deliver())
        try:
            while True:
                chunk = await reader.read(_CHUNK)
                queue.put_nowait((loop.time() + delay, chunk))
                if not chunk:
                    break
            await delivering
        except (ConnectionError, OSError):
            pass
        finally:
            delivering.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await delivering


def with_port(conn_str: str, port: int) -> str:
    """``conn_str`` with the endpoint's port replaced: the client connects to the proxy."""
    return re.sub(r"(Endpoint=sb://[^:;/]+):\d+", rf"\g<1>:{port}", conn_str, count=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", type=int, required=True, help="the port to forward to")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--rtt-ms", type=float, default=5.0)
    parser.add_argument("--lifetime", type=float, default=3600.0, help="stop after this (s)")
    args = parser.parse_args()
    server = _Server(args.host, args.upstream, rtt=args.rtt_ms / 1000, lifetime=args.lifetime)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(server.serve())


if __name__ == "__main__":
    main()
