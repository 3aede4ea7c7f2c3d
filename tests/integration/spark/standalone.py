"""A Spark standalone cluster on this machine: a master and two workers on two loopback hosts.

Spark never starts a speculative copy on a host that already runs an attempt of
the task, so ``local[...]`` and ``local-cluster`` cannot speculate. Two workers
bound to 127.0.0.1 and 127.0.0.2 are two hosts to the scheduler. The launch
classes ship in the pyspark package (``bin/spark-class``). Imported, not a test
module.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

WORKER_HOSTS = ("127.0.0.1", "127.0.0.2")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    """``with StandaloneCluster(workdir) as cluster:`` -- ``cluster.master_url`` once up."""

    def __init__(self, workdir: Path, *, cores_per_worker: int = 2) -> None:
        self.workdir = workdir
        self.cores = cores_per_worker
        self.port = free_port()
        self.webui = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen[bytes]] = []

    def _launch(self, name: str, host: str, args: list[str]) -> None:
        home = spark_home()
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - kept for the process
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": host,
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_WORKER_DIR": str(self.workdir / f"{name}-work"),
            "PYSPARK_PYTHON": sys.executable,
        }
        proc = subprocess.Popen(
            [str(home / "bin" / "spark-class"), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped with its executors
        )
        log.close()
        self._procs.append(proc)

    def start(self) -> StandaloneCluster:
        self._launch(
            "master",
            "127.0.0.1",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--webui-port", str(self.webui)),
            ],
        )
        for i, host in enumerate(WORKER_HOSTS):
            self._launch(
                f"worker{i + 1}",
                host,
                [
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", host, "--cores", str(self.cores), "--memory", "1g"),
                    *("--webui-port", str(free_port(host))),
                    self.master_url,
                ],
            )
        self._wait_for_workers(len(WORKER_HOSTS))
        return self

    def workers(self) -> list[str]:
        """Hosts of the workers the master sees alive."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui}/json/", timeout=5) as r:
            state = json.load(r)
        return sorted(w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def _wait_for_workers(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"a Spark daemon exited early; logs in {self.workdir}")
            try:
                if len(self.workers()) >= count:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the standalone cluster did not come up; logs in {self.workdir}")

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
