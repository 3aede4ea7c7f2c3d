"""The transactional outbox: a business write and its messages, exactly once together.

``enqueue(conn, messages, entity=...)`` writes messages into the outbox table **on the
caller's open transaction** (psycopg 3, or a SQLAlchemy session/connection on PostgreSQL):
they exist if and only if the business write commits. A :class:`Relay` (or ``sendonce
relay``) publishes them through the idempotent sender, exactly once and, per session id
or partition key, in the order their transactions committed. ``install(url)`` creates or
migrates the schema. Needs ``pip install 'sendonce[outbox]'``. See docs/outbox.md.
"""

from __future__ import annotations

from typing import Any

from .._extras import requires_extra
from .._names import name_key
from ._enqueue import CHANNEL, aenqueue, enqueue
from ._relay import DEFAULT_RELAY_RETRY, Relay, RelayTotals
from ._schema import SCHEMA_VERSION
from ._store import DeadRow, EntityStats, RelayStore, check_url

__all__ = [
    "CHANNEL",
    "DEFAULT_RELAY_RETRY",
    "SCHEMA_VERSION",
    "DeadRow",
    "EntityStats",
    "Relay",
    "RelayTotals",
    "aenqueue",
    "dead_rows",
    "enqueue",
    "install",
    "requeue",
    "stats",
]


def install(target: Any) -> int:
    """Create or migrate the outbox schema; returns the version found before (0: none).

    ``target`` is the outbox url (committed here), or a psycopg connection / SQLAlchemy
    connection whose transaction the caller commits (e.g. in a migration script).
    """
    from ._enqueue import dbapi_connection
    from ._schema import ensure_schema

    if isinstance(target, str):
        store = RelayStore(check_url(target), install=True)
        store.close()
        return store.found_version
    raw = dbapi_connection(target)
    with raw.cursor() as cursor:
        return ensure_schema(cursor, "this database")


def _store(url: str) -> RelayStore:
    with requires_extra("the transactional outbox", "outbox"):
        return RelayStore(check_url(url), install=False)


def stats(url: str) -> list[EntityStats]:
    """Per entity: rows pending, leased, published (kept for the retention), dead, and the
    age of the oldest pending row (the relays' lag)."""
    store = _store(url)
    try:
        return store.stats()
    finally:
        store.close()


def dead_rows(url: str, *, entity: str | None = None, limit: int = 100) -> list[DeadRow]:
    """Rows moved aside because they can never be sent, oldest first, with their reason."""
    store = _store(url)
    try:
        return store.dead_rows(None if entity is None else name_key(entity), limit)
    finally:
        store.close()


def requeue(url: str, entity: str, message_ids: list[str] | None = None) -> list[str]:
    """Move dead rows of ``entity`` (those ids, or all with None) back into the outbox, at
    the end of their keys' queues; returns the ids requeued."""
    store = _store(url)
    try:
        return store.requeue(name_key(entity), message_ids)
    finally:
        store.close()
