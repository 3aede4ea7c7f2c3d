"""The executor-side check that a ``local://`` broker is the very file the driver opened.

The driver refuses a ``local://`` url on a cluster master, but it cannot always
know the master (a publisher created before the session exists, an unreadable
conf). So the first thing a task does with a ``local://`` url is to compare
where it runs with what the driver saw: the same machine (host name and kernel
boot id) and the same file (device and inode). On another host each executor
would write its own file, or share one over a network filesystem, where SQLite
locking is unsafe: the task refuses before sending anything.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ..backends._url import LOCAL_SCHEME, local_path
from ..errors import ConfigurationError

__all__ = ["Placement", "check_driver_file", "this_machine"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def this_machine() -> str:
    """Host name plus kernel boot id: equal only for processes on one (booted) machine."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the driver saw the broker file. Picklable; checked by every task."""

    path: str
    machine: str
    file_id: tuple[int, int] | None

    @classmethod
    def of(cls, url: str) -> Placement | None:
        """The driver's view of a ``local://`` url (None for any other backend)."""
        if not url.startswith(LOCAL_SCHEME):
            return None
        path, _ = local_path(url)
        return cls(path, this_machine(), _file_id(path))

    def check(self) -> None:
        """Raise :class:`ConfigurationError` when this task cannot share the driver's file."""
        check_driver_file(
            self.path,
            self.machine,
            self.file_id,
            field="url",
            other_host=(
                "this Spark task runs on host {host!r}, not on the driver's machine "
                "({driver!r}), but the url is a local:// broker: one SQLite file on the "
                "driver's machine that this executor cannot share. Refusing to send anything. "
                "Use an Azure Service Bus connection string (Endpoint=sb://...) on clusters; "
                "local:// is for local[...] sessions."
            ),
            other_file=(
                "the local:// broker {path!r}, as this Spark task sees it, {seen}: not the "
                "file the driver opened (it was moved or replaced, or this executor sees "
                "another filesystem). Refusing to send anything: rows would land in a broker "
                "the driver does not read."
            ),
        )


def check_driver_file(
    path: str,
    machine: str,
    file_id: tuple[int, int] | None,
    *,
    field: str,
    other_host: str,
    other_file: str,
) -> None:
    """Refuse unless this process runs on the driver's machine and sees the driver's file.

    The texts are formatted with ``path``, ``host`` and ``driver`` (host names), and
    ``seen`` ("does not exist" or "is another file").
    """
    here = this_machine()
    if here != machine:
        raise ConfigurationError(
            other_host.format(path=path, host=here.split("/")[0], driver=machine.split("/")[0]),
            field=field,
        )
    found = _file_id(path)
    if file_id is not None and found != file_id:
        seen = "does not exist" if found is None else "is another file"
        raise ConfigurationError(other_file.format(path=path, seen=seen), field=field)
