"""Entity names compare ignoring case, as Service Bus compares them.

Service Bus resource names are case-insensitive: ``Orders`` and ``orders`` are one
queue. The local broker compares them with SQLite's ``NOCASE`` (which folds ASCII
letters only), so everything else that keys state by entity name (a backend's known
profiles and sender links, the ledger's keys) folds the same letters, and a name
means the same entity everywhere. Service Bus names are ASCII, so for them the two
folds agree.
"""

from __future__ import annotations

from collections import UserDict
from typing import TypeVar

__all__ = ["ByName", "name_key"]

V = TypeVar("V")

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def name_key(name: str) -> str:
    """The form of ``name`` two spellings of one entity share (ASCII letters folded)."""
    return name.translate(_ASCII_LOWER)


class ByName(UserDict[str, V]):
    """A dict keyed by entity name, where ``Orders`` and ``orders`` are one key."""

    def __getitem__(self, name: str) -> V:
        return self.data[name_key(name)]

    def __setitem__(self, name: str, value: V) -> None:
        self.data[name_key(name)] = value

    def __delitem__(self, name: str) -> None:
        del self.data[name_key(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name_key(name) in self.data
