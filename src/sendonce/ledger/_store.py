"""The store protocol: the few primitives a ledger needs from durable storage.

As in Powertools for AWS Lambda's persistence layer, the logic (what is in
doubt, what may be resent) lives above the store in :class:`~sendonce.ledger.Ledger`;
a store only writes and reads rows, each call one short transaction. Add your own
store by implementing :class:`LedgerStore`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import NamedTuple, Protocol, runtime_checkable

__all__ = ["Entry", "Key", "LedgerStore"]


class Key(NamedTuple):
    """The broker's uniqueness key: message id, and partition key where it counts ('' if not)."""

    message_id: str
    partition_key: str


class Entry(NamedTuple):
    """One ledger row: an intent, confirmed once the broker acknowledged it."""

    key: Key
    digest: bytes
    """A digest of the body: a different body under the same key is a conflict."""
    first_attempt: datetime
    """When the first attempt was about to start (wall time, UTC)."""
    owner: str
    """A token naming the send that wrote the intent (a retried write recognises its own)."""
    confirmed_at: datetime | None = None
    outcome: str | None = None
    """``sent``, ``duplicate`` or ``scheduled`` once confirmed."""


@runtime_checkable
class LedgerStore(Protocol):
    """Durable rows per (entity, key). Every method is one short transaction."""

    url: str
    """A url another process can open this store with (secrets included; never logged)."""

    def record_intents(
        self,
        entity: str,
        intents: Sequence[Entry],
        *,
        confirm: Mapping[Key, str] | None = None,
        confirmed_at: datetime | None = None,
    ) -> dict[Key, Entry]:
        """Insert the intents whose key has no row yet; return the rows that already existed.

        ``confirm`` (key -> outcome) first confirms keys of an earlier transfer, in the
        same transaction, so a transfer costs one round-trip. A row written by an earlier
        try of this very call (same ``owner``) may be returned: the caller recognises it.
        """
        ...

    def confirm(self, entity: str, outcomes: Mapping[Key, str], at: datetime) -> None:
        """Mark keys as acknowledged by the broker with their outcome."""
        ...

    def release(self, entity: str, keys: Sequence[Key], owner: str) -> None:
        """Delete unconfirmed intents of ``owner``: the broker refused them, nothing was stored."""
        ...

    def lookup(self, entity: str, keys: Sequence[Key]) -> dict[Key, Entry]:
        """The rows of ``keys`` that exist."""
        ...

    def prune(self, before: datetime, limit: int) -> int:
        """Delete at most ``limit`` rows whose first attempt is older than ``before``."""
        ...

    def close(self) -> None: ...
