"""What a refusal or a failure means for an outbox row: send it later, or move it aside.

A row the relay can never send (invalid for its entity, refused by the broker, a second body
under a published id, in doubt past what the broker can still detect) is moved aside with
its reason, so it holds its key back no longer; anything else is released and tried again in
a later round, its first attempt kept.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from .._entity import EntityProfile
from .._retry import RetryPolicy
from ..errors import (
    InDoubtError,
    LedgerError,
    NotStoredError,
    PayloadConflictError,
    PermanentSendError,
    SendError,
    TransientSendError,
    ValidationError,
    redact,
)
from ..ledger import Ledger
from ._store import ClaimedRow

__all__ = ["conflicts", "named", "storage", "text", "verdict"]

_INDEX = re.compile(r"\bmessages\[(\d+)\]")


def conflicts(profile: EntityProfile, rows: Sequence[ClaimedRow]) -> dict[int, str]:
    """The rows to move aside as payload conflicts, with the error to record.

    A row whose id (its entity's duplicate-detection key) was published with another body,
    while that row is kept (``retention``), conflicts with it: the broker holds the other
    body and would drop this one (or the ledger would skip it), so it is never published.
    Among the rows of one round sharing a key, the first enqueued (lowest row id) is sent
    and each later one with another body conflicts with it.
    """
    found: dict[int, str] = {}
    first: dict[Any, ClaimedRow] = {}
    for row in sorted(rows, key=lambda r: r.id):
        m = row.message
        if row.conflict_at is not None:
            found[row.id] = (
                f"PayloadConflictError: payload conflict with the row published at "
                f"{row.conflict_at.isoformat()} under message id {m.message_id!r}: the broker "
                "holds that body and would drop this one; nothing was sent"
            )
            continue
        key = profile.dedup_key(m)
        earlier = first.get(key)
        if earlier is None:
            first[key] = row
        elif earlier.message.body_bytes != m.body_bytes:
            found[row.id] = (
                f"PayloadConflictError: payload conflict with outbox row {earlier.id} (enqueued "
                f"before it under message id {m.message_id!r}, sent in the same round with "
                "another body); nothing was sent"
            )
    return found


def named(exc: ValidationError | SendError, rows: list[ClaimedRow]) -> list[ClaimedRow]:
    """The rows a refusal of the whole call names (by message id, else by its index)."""
    mid = getattr(exc, "message_id", None)
    if mid is not None:
        return [r for r in rows if r.message.message_id == mid]
    found = _INDEX.search(str(exc))
    if found is not None and int(found.group(1)) < len(rows):
        return [rows[int(found.group(1))]]
    return []


def storage(error: SendError) -> bool:
    """The local broker's disk-full error: nothing of the call was stored; try later."""
    return type(error).__name__ == "BrokerStorageError"


def verdict(
    error: SendError,
    profile: EntityProfile,
    retry: RetryPolicy,
    first_attempt: datetime,
    ledger: Ledger | None,
) -> str | None:
    """Why a failed row can never be sent (it is moved aside), or None: try again later."""
    if isinstance(error, PayloadConflictError):
        return "conflict"
    if isinstance(error, NotStoredError | LedgerError) or storage(error):
        return None
    if isinstance(error, InDoubtError):
        if not profile.duplicate_detection:
            return "in-doubt"  # nothing remembers the id: a resend could duplicate it
        window = profile.window
        if window is None:  # a count-bounded id cache (Artemis): no time limit to pass
            if ledger is not None or not isinstance(error.last_error, TransientSendError):
                # The ledger decides an unconfirmed key in doubt at once on such an entity,
                # and the backend refuses a resend beyond its cache's reach: neither changes
                # in a later round, so trying again would hold the key back for ever.
                return "in-doubt"
            return None  # retries ran out: a later round resends within the cache's reach
        deadline = first_attempt + window - retry.safety_margin
        return "in-doubt" if datetime.now(UTC) >= deadline else None
    if isinstance(error, PermanentSendError):
        return "refused"
    return None


def text(error: BaseException) -> str:
    return redact(f"{type(error).__name__}: {error}")
