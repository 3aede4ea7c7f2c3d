"""The transactional outbox: a business write and its messages, exactly once together.

``enqueue(conn, messages, entity=...)`` writes messages into the outbox table **on the
caller's open transaction** (psycopg 3, or a SQLAlchemy session/connection on PostgreSQL):
they exist if and only if the business write commits. A :class:`Relay` (or ``sendonce
relay``) publishes them through the idempotent sender, exactly once and, per session id
or partition key, in the order their transactions committed. ``Outbox(url)`` is the outbox
itself, as ``Ledger(url)`` is the ledger: ``install()`` creates or migrates the schema,
``stats()``, ``dead_rows()`` and ``requeue()`` read and repair it; the functions of the same
names take the url and do the same. Needs ``pip install 'sendonce[outbox]'``. See
docs/outbox.md.
"""

from __future__ import annotations

from typing import Any

from ._enqueue import CHANNEL, aenqueue, enqueue
from ._outbox import Outbox
from ._relay import DEFAULT_RELAY_RETRY, Relay, RelayTotals
from ._schema import SCHEMA_VERSION
from ._store import DeadRow, EntityStats

__all__ = [
    "CHANNEL",
    "DEFAULT_RELAY_RETRY",
    "SCHEMA_VERSION",
    "DeadRow",
    "EntityStats",
    "Outbox",
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

    ``target`` is the outbox url (committed here: ``Outbox(url).install()``), or a psycopg
    connection / SQLAlchemy connection whose transaction the caller commits (e.g. in a
    migration script).
    """
    if isinstance(target, str):
        return Outbox(target).install()
    from ._enqueue import dbapi_connection
    from ._schema import ensure_schema

    raw = dbapi_connection(target)
    with raw.cursor() as cursor:
        return ensure_schema(cursor, "this database")


def stats(url: str) -> list[EntityStats]:
    """``Outbox(url).stats()``, on a connection of its own, closed after."""
    with Outbox(url) as outbox:
        return outbox.stats()


def dead_rows(url: str, *, entity: str | None = None, limit: int = 100) -> list[DeadRow]:
    """``Outbox(url).dead_rows(...)``, on a connection of its own, closed after."""
    with Outbox(url) as outbox:
        return outbox.dead_rows(entity=entity, limit=limit)


def requeue(url: str, entity: str, message_ids: list[str] | None = None) -> list[str]:
    """``Outbox(url).requeue(...)``, on a connection of its own, closed after."""
    with Outbox(url) as outbox:
        return outbox.requeue(entity, message_ids)
