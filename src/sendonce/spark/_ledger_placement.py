"""Where a SQLite send ledger lives, checked on the driver and again by every task.

A ``sqlite:`` ledger is one file on the driver's machine. Executors elsewhere would
each open a ledger of their own (or share one over a network filesystem, where SQLite
locking is unsafe), and a re-run would resend what the driver's ledger holds. The
driver refuses it on a cluster master; when it cannot know the master, the first
thing a task does is to compare its machine and the file with what the driver saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigurationError
from ..ledger import Ledger
from ._placement import _file_id, check_driver_file, this_machine
from ._schema import is_local_master

__all__ = ["LedgerPlacement", "check_ledger_fits"]


def _sqlite_path(ledger: Ledger) -> str | None:
    from ..ledger._sqlite import SQLiteStore

    store = ledger.store
    return store.path if isinstance(store, SQLiteStore) else None


def check_ledger_fits(ledger: Ledger, master: str | None) -> None:
    """Refuse a one-machine SQLite ledger when executors run on other machines."""
    path = _sqlite_path(ledger)
    if path is None or master is None or is_local_master(master):
        return
    raise ConfigurationError(
        f"the ledger {path!r} is one SQLite file on this machine, but this session's master "
        f"is {master!r}: executors on other machines would each keep a ledger of their own, "
        "and a re-run would send rows again. Use a postgresql:// ledger on clusters; "
        "sqlite: is for local[...] sessions.",
        field="ledger",
    )


@dataclass(frozen=True, slots=True)
class LedgerPlacement:
    """Where the driver saw the SQLite ledger file. Picklable; checked by every task."""

    path: str
    machine: str
    file_id: tuple[int, int] | None

    @classmethod
    def of(cls, ledger: Ledger) -> LedgerPlacement | None:
        """The driver's view of ``ledger`` (None for a store other than SQLite)."""
        path = _sqlite_path(ledger)
        return None if path is None else cls(path, this_machine(), _file_id(path))

    def check(self) -> None:
        """Raise :class:`ConfigurationError` when this task cannot share the driver's ledger."""
        check_driver_file(
            self.path,
            self.machine,
            self.file_id,
            field="ledger",
            other_host=(
                "this Spark task runs on host {host!r}, not on the driver's machine "
                "({driver!r}), but the ledger {path!r} is one SQLite file there that this "
                "executor cannot share. Refusing to send anything. Use a postgresql:// ledger "
                "on clusters."
            ),
            other_file=(
                "the ledger {path!r}, as this Spark task sees it, {seen}: not the file the "
                "driver opened (it was moved or replaced, or this executor sees another "
                "filesystem). Refusing to send anything: a ledger the driver does not read "
                "cannot keep a re-run from sending rows again."
            ),
        )
