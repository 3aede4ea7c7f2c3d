"""A throwaway PostgreSQL cluster for tests: initdb + pg_ctl as a non-root user on 127.0.0.1.

Debian's ``postgresql`` package provides the binaries (``.ci/run`` installs it);
``initdb`` and ``pg_ctl`` refuse to run as root, so as root they run as ``postgres``.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

__all__ = ["pg_bin", "throwaway_cluster"]


def pg_bin() -> str | None:
    """The directory of initdb/pg_ctl, or None if PostgreSQL is not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it after it was chosen."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def throwaway_cluster() -> Iterator[str]:
    """Start a cluster; yield its url (``postgresql://postgres@127.0.0.1:PORT/postgres``)."""
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    root = tempfile.mkdtemp(prefix="sendonce-pg-")
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(root, "data")
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    subprocess.run(
        [*as_user, f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
        check=True,
        capture_output=True,
        env=env,
    )
    log = os.path.join(root, "log")

    def start() -> int:
        """Start the server on a port free a moment ago: another test process (an xdist
        worker) may have taken it since, then it cannot bind (``PortTaken``: try another)."""
        port = _free_port()
        seen = os.path.getsize(log) if os.path.exists(log) else 0  # earlier attempts' lines
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        started = subprocess.run(
            [*as_user, f"{bindir}/pg_ctl", "-D", data, "-o", options, "-l", log, "-w", "start"],
            capture_output=True,
            env=env,
        )
        if started.returncode != 0:
            with open(log, errors="replace") as text:
                text.seek(seen)
                if "already in use" in text.read():
                    raise PortTaken(port)
            started.check_returncode()
        return port

    try:
        port = Retrying(
            retry=retry_if_exception_type(PortTaken), stop=stop_after_attempt(5), reraise=True
        )(start)
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(
                [*as_user, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
                capture_output=True,
                env=env,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
