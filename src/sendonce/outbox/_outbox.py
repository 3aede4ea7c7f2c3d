"""The outbox as an object, as the ledger is: ``Outbox(url)`` and what an operator does to it.

``enqueue`` stays a function of the caller's connection (the write must ride on the
caller's transaction, not on a connection of ours), and :class:`~sendonce.outbox.Relay`
publishes; an :class:`Outbox` creates the schema and reads or repairs what the table
holds. It opens its connection on first use and keeps it (reconnecting when lost), so
polling :meth:`Outbox.stats` for a gauge costs one query, not one connection.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._extras import requires_extra
from .._names import name_key
from ..errors import redact
from ._store import DeadRow, EntityStats, RelayStore, check_url

if TYPE_CHECKING:
    from .._entity import EntityProfile
    from ..backends import Backend
    from ._relay import Relay

__all__ = ["Outbox"]


class Outbox:
    """A transactional outbox in PostgreSQL, named by its url (``postgresql://...``).

    ``Outbox(url).install()`` creates or migrates the schema; :meth:`stats`,
    :meth:`dead_rows` and :meth:`requeue` read and repair it; :meth:`relay` starts a
    :class:`~sendonce.outbox.Relay` on it. A context manager: leaving it (or :meth:`close`)
    closes its connection. A url that is not PostgreSQL's is a ``ConfigurationError``
    naming ``outbox``, before anything connects.
    """

    def __init__(self, url: str) -> None:
        self.url = check_url(url)
        self._store: RelayStore | None = None

    def __repr__(self) -> str:
        return f"Outbox({redact(self.url)!r})"

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection, if one is open (the object can still be used: it reopens)."""
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def _opened(self) -> RelayStore:
        if self._store is None:
            with requires_extra("the transactional outbox", "outbox"):
                self._store = RelayStore(self.url, install=False)
        return self._store

    def install(self) -> int:
        """Create or migrate the outbox schema; returns the version found before (0: none).

        Safe to run at every deploy and from many processes at once. To install inside
        your own migration's transaction, pass its connection to
        :func:`sendonce.outbox.install` instead.
        """
        with requires_extra("the transactional outbox", "outbox"):
            store = RelayStore(self.url, install=True)
        store.close()
        return store.found_version

    def stats(self) -> list[EntityStats]:
        """Per entity: rows pending, leased, published (kept for the retention), dead, and
        the age of the oldest pending row (the relays' lag)."""
        return self._opened().stats()

    def dead_rows(self, *, entity: str | None = None, limit: int = 100) -> list[DeadRow]:
        """Rows moved aside because they can never be sent, oldest first, with their reason."""
        return self._opened().dead_rows(None if entity is None else name_key(entity), limit)

    def requeue(self, entity: str, message_ids: Sequence[str] | None = None) -> list[str]:
        """Move dead rows of ``entity`` (those ids, or all with None) back into the outbox, at
        the end of their keys' queues; returns the ids requeued."""
        return self._opened().requeue(name_key(entity), message_ids)

    def relay(
        self, backend: Backend | str, entities: Iterable[EntityProfile | str], **options: Any
    ) -> Relay:
        """A :class:`~sendonce.outbox.Relay` publishing this outbox's rows for ``entities``
        (the same keyword options as ``Relay``)."""
        from ._relay import Relay

        return Relay(self.url, backend, entities, **options)
