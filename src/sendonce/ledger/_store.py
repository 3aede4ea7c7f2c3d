"""The store protocol: the few primitives a ledger needs from durable storage.

As in Powertools for AWS Lambda's persistence layer, the logic (what is in
doubt, what may be resent) lives above the store in :class:`~sendonce.ledger.Ledger`;
a store only writes and reads rows, each call one short transaction. Add your own
store by implementing :class:`LedgerStore`.

Intents are grouped in *transfers* (one per ``record_intents`` call, named by its
owner token) so that the common confirmation, "every intent of that transfer was
acknowledged", can be one row, not one per message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = ["Confirmation", "Entry", "Key", "LedgerStore"]


class _KeyFields(NamedTuple):
    message_id: str
    partition_key: str


class Key(_KeyFields):
    """The broker's uniqueness key: message id, and partition key where it counts ('' if not).

    ``None`` (or leaving it out) means no partition key, as everywhere else in sendonce:
    ``Key(id, None)``, ``Key(id)`` and ``Key(id, "")`` are one key (equal, one hash), so a
    key written by hand finds the row :meth:`~sendonce.ledger.Ledger.lookup` returned.
    """

    __slots__ = ()

    def __new__(cls, message_id: str, partition_key: str | None = None) -> Key:
        return tuple.__new__(cls, (message_id, partition_key or ""))

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> Key:  # type: ignore[override]
        """As ``Key(*iterable)`` (``_replace`` builds through it): None is '' here too."""
        message_id, partition_key = iterable
        return tuple.__new__(cls, (message_id, partition_key or ""))


class Entry(NamedTuple):
    """One ledger row: an intent, confirmed once the broker acknowledged it."""

    key: Key
    digest: bytes
    """A digest of the body: a different body under the same key is a conflict."""
    first_attempt: datetime
    """When the first attempt was about to start (wall time, UTC)."""
    owner: str
    """The token of the transfer that wrote the intent (a retried write recognises its own)."""
    confirmed_at: datetime | None = None
    outcome: str | None = None
    """``sent``, ``duplicate`` or ``scheduled`` once confirmed."""


class Confirmation(NamedTuple):
    """What the broker acknowledged since the last write, as cheaply as it can be recorded."""

    transfers: Sequence[str] = ()
    """Owners of transfers whose every remaining intent was acknowledged as ``sent``."""
    keys: Mapping[Key, str] = {}
    """Other acknowledged keys and their outcome (``sent`` or ``duplicate``): keys of
    earlier transfers resent by this one, of partly acknowledged transfers, and
    duplicates (which override their transfer's ``sent``)."""

    def __bool__(self) -> bool:
        return bool(self.transfers) or bool(self.keys)

    def merged(self, other: Confirmation | None) -> Confirmation:
        """This confirmation and ``other`` (a later one) as one write."""
        if not other:
            return self
        if not self:
            return other
        return Confirmation((*self.transfers, *other.transfers), {**self.keys, **other.keys})


@runtime_checkable
class LedgerStore(Protocol):
    """Durable rows per (entity, key). Every method is one short transaction."""

    url: str
    """A url another process can open this store with (secrets included; never logged)."""

    def record_intents(
        self,
        entity: str,
        keys: Sequence[Key],
        digests: Sequence[bytes],
        *,
        first_attempt: datetime,
        owner: str,
        confirm: Confirmation | None = None,
    ) -> dict[Key, Entry]:
        """Insert an intent per key that has no row yet; return the rows that already existed.

        The intents form one transfer named ``owner`` (unique per call). ``confirm``
        first records an earlier transfer's acknowledgements, in the same transaction
        and at ``first_attempt``, so a transfer costs one round-trip. A row written by
        an earlier try of this very call (same ``owner``) may be returned: the caller
        recognises it.
        """
        ...

    def confirm(self, entity: str, confirmation: Confirmation, at: datetime) -> None:
        """Mark keys (whole transfers, or single keys) as acknowledged by the broker."""
        ...

    def release(self, entity: str, keys: Sequence[Key], owner: str) -> None:
        """Delete unconfirmed intents of ``owner``: the broker refused them, nothing was stored."""
        ...

    def lookup(self, entity: str, keys: Sequence[Key]) -> dict[Key, Entry]:
        """The rows of ``keys`` that exist."""
        ...

    def prune(self, before: datetime, limit: int) -> int:
        """Delete at most ``limit`` keys whose first attempt is older than ``before``."""
        ...

    def close(self) -> None: ...
