"""Sending: checking and encoding a batch, duplicate detection with its sweep, storing.

A send is one write transaction: its dedup keys are remembered (an upsert that
tells which were new), expired ids are swept a little per send, and the new
messages are inserted into every subqueue (a topic's subscriptions). The Python
work is done before the transaction, so processes sharing the file serialise on
SQL only.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from itertools import compress, repeat
from typing import Any

from ..._entity import EntityProfile
from ..._message import Message
from ..._message_columns import MessageColumns
from ...errors import MessageSizeError, PermanentSendError, ValidationError
from .._base import Ack
from ._activation import PENDING, activate, note_waiting, targets
from ._entities import (
    IdState,
    create_pending,
    dead_letter_sessionless,
    entity_row,
    lookup,
    profile_of,
)
from ._errors import MessageNotFoundError
from ._received import encode_extra
from ._store import US, Store, positive_seconds, to_us

# Expired ids forgotten per send, at least: more than a send can add, so the id
# table stays bounded by the window without a stop-the-world sweep.
_HOUSEKEEPING_MIN = 256
_MAX_JSON_BATCH = 50_000


_DUPLICATE = Ack("duplicate")
_IGNORED = Ack("ignored")


def _ack_maker() -> Callable[[int], Ack]:
    """A fast ``Ack("accepted", seq)``: a batch of 1000 acks is a visible share of a send.

    Sets the slots of the frozen dataclass directly; falls back to the constructor
    should ``Ack`` ever stop being a slotted dataclass.
    """
    try:
        set_outcome = Ack.__dict__["outcome"].__set__
        set_seq = Ack.__dict__["sequence_number"].__set__
    except (KeyError, AttributeError):  # pragma: no cover - depends on Ack's layout
        return lambda seq: Ack("accepted", seq)
    new = object.__new__

    def accepted(seq: int) -> Ack:
        ack = new(Ack)
        set_outcome(ack, "accepted")
        set_seq(ack, seq)
        return ack

    if accepted(1) != Ack("accepted", 1):  # pragma: no cover
        return lambda seq: Ack("accepted", seq)
    return accepted


_accepted = _ack_maker()


class _GroupRejected(Exception):
    """Internal: a transactional group met a duplicate and is rolled back whole."""

    def __init__(self, accepted: list[bool]) -> None:
        super().__init__("group rejected")
        self.accepted = accepted


def send(
    store: Store,
    entity: str,
    messages: Sequence[Message],
    *,
    timeout: float,
    atomic: bool = False,
    raw: Sequence[bytes | None] | None = None,
) -> list[Ack]:
    """Store ``messages`` in one transaction (see ``LocalBackend.send``)."""
    return _store(store, entity, messages, None, timeout=timeout, atomic=atomic, raw=raw)


def schedule(
    store: Store,
    entity: str,
    messages: Sequence[Message],
    at: datetime,
    *,
    timeout: float,
    raw: Sequence[bytes | None] | None = None,
) -> list[Ack]:
    """Store ``messages`` for delivery from ``at`` (see ``LocalBackend.schedule``)."""
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise ValidationError("at must be a timezone-aware datetime", field="at")
    return _store(store, entity, messages, to_us(at), timeout=timeout, atomic=False, raw=raw)


def _store(
    store: Store,
    entity: str,
    messages: Sequence[Message],
    at: int | None,
    *,
    timeout: float,
    atomic: bool,
    raw: Sequence[bytes | None] | None,
) -> list[Ack]:
    work, count = _plan(store, entity, messages, at, atomic=atomic, raw=raw)
    seconds = positive_seconds(timeout, "timeout")
    try:
        base, accepted = store.write(work, timeout=seconds)
    except _GroupRejected as rejected:
        # Only the members the broker already holds are duplicates; the others were
        # dropped with the group and are stored nowhere: they must not look delivered.
        return [_DUPLICATE if not new else _IGNORED for new in rejected.accepted]
    return _acks(base, accepted, count, scheduled=at is not None)


def send_together(
    store: Store,
    sends: Sequence[tuple[str, Sequence[Message], Sequence[bytes | None] | None]],
    *,
    timeout: float,
) -> list[list[Ack]]:
    """Several sends, each ``(entity, messages, raw)``, in one transaction (a group commit).

    Each keeps its own acks, as if sent alone in this order; one that fails fails
    them all, and nothing of any is stored.
    """
    plans = [
        _plan(store, entity, messages, None, atomic=False, raw=raw)
        for entity, messages, raw in sends
    ]
    seconds = positive_seconds(timeout, "timeout")
    results = store.write(lambda conn: [work(conn) for work, _ in plans], timeout=seconds)
    return [
        _acks(base, accepted, count)
        for (base, accepted), (_, count) in zip(results, plans, strict=True)
    ]


_Work = Callable[[sqlite3.Connection], tuple[int, "list[bool] | None"]]


def _plan(
    store: Store,
    entity: str,
    messages: Sequence[Message],
    at: int | None,
    *,
    atomic: bool,
    raw: Sequence[bytes | None] | None,
) -> tuple[_Work, int]:
    """A send's SQL as work for a write transaction, and its message count (inputs checked)."""
    if not isinstance(messages, MessageColumns):  # columns hold only plain messages
        messages = list(messages)
        for message in messages:
            if not isinstance(message, Message):
                raise ValidationError(
                    f"messages must be Message objects, got {type(message).__name__}",
                    field="messages",
                )
    raws: list[bytes | None] = [None] * len(messages) if raw is None else list(raw)
    if len(raws) != len(messages):
        raise ValidationError("raw must hold one entry per message", field="raw")
    # The Python work (rule checks, stored columns, the dedup keys' JSON) is done
    # before the write transaction, against the entity's profile as last read,
    # so that processes sharing the file serialise on SQL only. The transaction
    # re-reads the profile and redoes the work if the entity changed meanwhile.
    known = store.profiles.get(entity) if isinstance(entity, str) else None
    early = None
    if known is not None and messages:
        early = _Batch.of(entity, known[0], known[1], messages, at, raws)

    def work(conn: sqlite3.Connection) -> tuple[int, list[bool] | None]:
        if store.pending:
            create_pending(conn, store, entity)
        eid, text, base, ids = entity_row(conn, entity)
        if not messages:
            return base, None
        batch = early
        if batch is None or batch.text != text:
            profile = profile_of(store, entity, text)
            batch = _Batch.of(entity, text, profile, messages, at, raws)
        if batch.error is not None:
            raise batch.error
        now = store.now()
        # Messages that came due take their numbers before this batch does.
        base += activate(conn, eid, now)
        return base, _store_in(conn, eid, batch, base, ids, atomic, now)

    return work, len(messages)


def _acks(
    base: int, accepted: list[bool] | None, count: int, *, scheduled: bool = False
) -> list[Ack]:
    if accepted is None:
        return list(map(_accepted, range(base, base + count)))
    if scheduled:
        # Service Bus still returns a sequence number for a scheduled copy it drops as a
        # duplicate (Azure/azure-service-bus#265): the one the copy took, naming no message.
        return [
            _accepted(base + i) if ok else Ack("duplicate", base + i)
            for i, ok in enumerate(accepted)
        ]
    return [_accepted(base + i) if ok else _DUPLICATE for i, ok in enumerate(accepted)]


def _store_in(
    conn: sqlite3.Connection,
    eid: int,
    batch: _Batch,
    base: int,
    ids: IdState,
    atomic: bool,
    now: int,
) -> list[bool] | None:
    """The SQL of a send, in its transaction; None when every message was new."""
    profile = batch.profile
    n = batch.size
    conn.execute("UPDATE entities SET next_seq = next_seq + ? WHERE eid = ?", (n, eid))
    if profile.duplicate_detection:
        accepted = _remember(conn, eid, profile, batch, base, now, ids)
    else:
        accepted = [True] * n
    all_new = all(accepted)
    if atomic and not all_new:
        raise _GroupRejected(accepted)
    subs = targets(conn, eid, profile)
    _insert_messages(conn, eid, subs, base, now, batch.fields, None if all_new else accepted)
    if profile.kind == "topic" and not profile.sessions:
        dead_letter_sessionless(conn, eid, base, base + n - 1)
    return None if all_new else accepted


def cancel_scheduled(
    store: Store,
    entity: str,
    sequence_numbers: Sequence[int],
    *,
    timeout: float | None = None,
    missing_ok: bool = True,
) -> None:
    """Remove scheduled messages not yet activated. Their ids stay remembered.

    A number that names no waiting message (unknown, cancelled, or activated
    already: Service Bus cannot cancel a message once it is enqueued) is
    skipped, or with ``missing_ok=False`` refused with
    :class:`MessageNotFoundError`, nothing cancelled.
    """
    seqs = list(sequence_numbers)
    for seq in seqs:
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ValidationError("sequence numbers must be ints", field="sequence_numbers")

    def work(conn: sqlite3.Connection) -> None:
        eid, profile, _, _ = lookup(conn, entity, sending=True)
        now = store.now()
        activate(conn, eid, now)  # a due message is enqueued: too late to cancel
        missing = []
        for seq in dict.fromkeys(seqs):
            deleted = conn.execute(
                f"DELETE FROM messages WHERE eid = ? AND sub = '{PENDING}' AND seq = ?",
                (eid, seq),
            ).rowcount
            if not deleted:
                # Files written before scheduled messages waited apart keep them in the
                # queue (or each subscription), invisible until due.
                for sub in targets(conn, eid, profile):
                    deleted += conn.execute(
                        "DELETE FROM messages WHERE eid = ? AND sub = ? AND seq = ? "
                        "AND scheduled IS NOT NULL AND visible > ?",
                        (eid, sub, seq, now),
                    ).rowcount
            if not deleted:
                missing.append(seq)
        if missing and not missing_ok:
            raise MessageNotFoundError(
                f"{entity!r} has no scheduled message waiting with sequence number "
                f"{', '.join(map(str, missing))} (unknown, cancelled, or enqueued already); "
                "nothing was cancelled"
            )

    store.write(work, timeout=timeout)


# Stored fields (see _Batch.fields) that a whole batch may lack: (index, column name).
_OPTIONAL = ((1, "partition_key"), (2, "session_id"), (4, "extra"), (5, "scheduled"), (6, "raw"))
_UNSET = object()


@dataclasses.dataclass(frozen=True, slots=True)
class _Batch:
    """A send's messages, checked and turned into what its SQL binds, outside any lock.

    Built against one version of the entity's profile (``text``); the transaction
    uses it only if the profile it reads is still that one.
    """

    text: str
    profile: EntityProfile
    fields: Sequence[Sequence[Any]]
    """The stored fields, column by column: id, partition key, session id, body (bytes or
    str), extra, scheduled, raw; one entry per message in each."""
    keys: list[Any]
    """The dedup keys (duplicate detection on): ids, or [id, partition key] pairs."""
    key_chunks: list[str]
    """``keys`` as JSON arrays of at most ``_MAX_JSON_BATCH``."""
    error: PermanentSendError | None

    @property
    def size(self) -> int:
        return len(self.fields[0]) if self.fields else 0

    @classmethod
    def of(
        cls,
        entity: str,
        text: str,
        profile: EntityProfile,
        messages: list[Message] | MessageColumns,
        at: int | None,
        raws: list[bytes | None],
    ) -> _Batch:
        fields: Sequence[Sequence[Any]]
        if isinstance(messages, MessageColumns) and _plain(messages, profile):
            fields = _fields_of_columns(messages, at, raws)
        else:
            if isinstance(messages, MessageColumns):
                messages = messages.messages()  # the per-message checks name the culprit
            try:
                rows = _prepare(entity, profile, messages, at, raws)
            except PermanentSendError as exc:
                return cls(text, profile, [], [], [], exc)
            fields = list(zip(*rows, strict=True))
        keys: list[Any] = []
        chunks: list[str] = []
        if profile.duplicate_detection:
            if profile.partitioned:
                for message in messages:
                    mid, pkey = profile.dedup_key(message)
                    keys.append([mid, pkey or ""])
            else:
                keys = list(fields[0]) if fields else []
            chunks = [
                json.dumps(keys[start : start + _MAX_JSON_BATCH], ensure_ascii=False)
                for start in range(0, len(keys), _MAX_JSON_BATCH)
            ]
        return cls(text, profile, fields, keys, chunks, None)


def _prepare(
    entity: str,
    profile: EntityProfile,
    messages: list[Message],
    at: int | None,
    raws: list[bytes | None],
) -> list[tuple[Any, ...]]:
    """Check every message against the entity's rules and build its stored columns.

    Message itself guarantees partition key == session id, so only the size and,
    for a session entity, a missing session id can break a rule; the full check
    runs (and raises) for those. The optional properties of messages that share
    them (Spark rows with one content type) are encoded once per batch.
    """
    check_above = profile._check_above
    sessions = profile.sessions
    extras: dict[tuple[Any, ...], str | None] = {}
    prepared = []
    for i, message in enumerate(messages):
        if message.size > check_above or (sessions and message.session_id is None):
            try:
                profile.check(message)
            except ValidationError as exc:
                raise _refused(entity, message, exc) from None
        props = message.application_properties
        # id(props) is stable for this call: ``messages`` keeps every mapping alive.
        shape = (
            message.subject,
            message.content_type,
            message.correlation_id,
            message.time_to_live,
            None if props is None else id(props),
        )
        extra = extras.get(shape, _UNSET)
        if extra is _UNSET:
            extra = extras[shape] = encode_extra(message)
        when = at
        if when is None and message.scheduled_enqueue_time is not None:
            when = to_us(message.scheduled_enqueue_time)
        prepared.append(
            (
                message.message_id,
                message.partition_key,
                message.session_id,
                message.body,
                extra,
                when,
                raws[i],
            )
        )
    return prepared


def _plain(columns: MessageColumns, profile: EntityProfile) -> bool:
    """Columns no rule of the entity can refuse (what ``_prepare`` would check per message)."""
    return max(columns.sizes) <= profile._check_above and not (
        profile.sessions and columns.session_ids is None
    )


def _fields_of_columns(
    columns: MessageColumns, at: int | None, raws: list[bytes | None]
) -> list[Sequence[Any]]:
    """The stored fields of ``_prepare``'s rows, column by column, for plain columns.

    They share their optional properties (one factory) and have no schedule time
    of their own, so one ``extra`` and one ``when`` serve them all.
    """
    n = len(columns)
    nothing: list[Any] = [None] * n
    return [
        columns.message_ids,
        nothing if columns.partition_keys is None else columns.partition_keys,
        nothing if columns.session_ids is None else columns.session_ids,
        columns.bodies,
        [encode_extra(columns[0])] * n,
        [at] * n,
        raws,
    ]


def _insert_messages(
    conn: sqlite3.Connection,
    eid: int,
    subs: list[str],
    base: int,
    now: int,
    stored: Sequence[Sequence[Any]],
    accepted: list[bool] | None,
) -> None:
    """Store a batch's messages (those ``accepted`` marks, or all) in every ``subs`` subqueue.

    ``stored`` holds the seven stored fields (see ``_Batch.fields``) as columns. One
    ``executemany`` per subqueue, which binds per row only what the rows carry: an
    optional field no message has (a partition key, a schedule time, raw AMQP bytes)
    is a literal NULL in the statement. Message ``i`` gets sequence number ``base + i``.
    A message scheduled for later is stored once, under ``PENDING``, until activated.
    """
    seqs: Sequence[int] = range(base, base + len(stored[0]))
    fields: Sequence[Sequence[Any]] = stored
    if accepted is not None:
        seqs = list(compress(seqs, accepted))
        fields = [list(compress(values, accepted)) for values in stored]
    if not seqs:
        return
    bodies = fields[3]
    if set(map(type, bodies)) != {bytes}:  # str bodies are stored as their UTF-8 bytes
        bodies = [b.encode("utf-8") if isinstance(b, str) else b for b in bodies]
    columns = ["eid", "sub", "seq", "enqueued", "message_id", "body"]
    bound: list[Iterable[Any]] = [fields[0], bodies]
    for index, name in _OPTIONAL:
        values = fields[index]
        if values.count(None) != len(values):
            columns.append(name)
            bound.append(values)
    placeholders = [f"?{i}" for i in range(1, len(columns) + 1)]
    visible = "?4"  # due now, unless scheduled
    if "scheduled" in columns:
        visible = f"coalesce(?{columns.index('scheduled') + 1}, ?4)"
    sql = (
        f"INSERT INTO messages ({', '.join(columns)}, visible) "
        f"VALUES ({', '.join(placeholders)}, {visible})"
    )
    if "scheduled" in columns:
        at = columns.index("scheduled") - 4
        later = [when is not None and when > now for when in bound[at]]
        if any(later):
            pending = [list(compress(values, later)) for values in (seqs, *bound)]
            conn.executemany(
                sql, zip(repeat(eid), repeat(PENDING), *pending[:1], repeat(now), *pending[1:])
            )
            note_waiting(conn, eid, min(pending[1 + at]))
            ready = [not flag for flag in later]
            seqs = list(compress(seqs, ready))
            bound = [list(compress(values, ready)) for values in bound]
    for sub in subs:
        conn.executemany(sql, zip(repeat(eid), repeat(sub), seqs, repeat(now), *bound))


def _remember(
    conn: sqlite3.Connection,
    eid: int,
    profile: EntityProfile,
    batch: _Batch,
    base: int,
    now: int,
    ids: IdState,
) -> list[bool]:
    """Record the dedup keys; True for each message seen for the first time.

    One statement per chunk: an upsert over ``json_each`` that writes exactly
    the keys that are new (or whose window had expired); ``RETURNING`` names
    them when some were not.
    """
    partitioned = profile.partitioned
    select = "j.value ->> 0, j.value ->> 1" if partitioned else "j.value, ''"
    keys = batch.keys
    counted = profile.id_cache_size is not None
    window = profile.window
    cutoff = -1 if window is None else now - window // US
    accepted = [False] * len(keys)
    first: dict[Any, int] | None = None
    new = 0
    sql = (
        f"INSERT INTO ids (eid, mid, pkey, stamp, ordinal) SELECT ?1, {select}, ?4, "
        "CASE WHEN ?2 THEN ?3 + j.key END FROM json_each(?5) AS j WHERE true "
        "ON CONFLICT (eid, mid, pkey) DO UPDATE SET stamp = excluded.stamp "
        "WHERE ids.stamp <= ?6"
    )
    for number, chunk in enumerate(batch.key_chunks):
        start = number * _MAX_JSON_BATCH
        size = min(_MAX_JSON_BATCH, len(keys) - start)
        params = (eid, counted, base + start, now, chunk, cutoff)
        # The usual case, every key new, needs only the count of rows written; when
        # some were duplicates, redo the chunk listing the keys that were new.
        conn.execute("SAVEPOINT remember")
        if conn.execute(sql, params).rowcount == size:
            conn.execute("RELEASE remember")
            accepted[start : start + size] = [True] * size
            new += size
            continue
        conn.execute("ROLLBACK TO remember")
        conn.execute("RELEASE remember")
        returned = conn.execute(sql + " RETURNING mid, pkey", params).fetchall()
        new += len(returned)
        if first is None:
            first = {}
            for i, key in enumerate(keys):
                first.setdefault(tuple(key) if partitioned else key, i)
        for mid, pkey in returned:
            accepted[first[(mid, pkey) if partitioned else mid]] = True
    id_count = ids.id_count
    if ids.first_stamp is None or now < ids.first_stamp:  # the first ids, or the clock went back
        conn.execute("UPDATE entities SET first_stamp = ? WHERE eid = ?", (now, eid))
    if counted:
        # Artemis: a fixed-size cache; the oldest ids make room for the new ones.
        assert profile.id_cache_size is not None
        id_count += new
        excess = id_count - profile.id_cache_size
        if excess > 0:
            conn.execute(
                "DELETE FROM ids WHERE eid = ?1 AND ordinal <= (SELECT ordinal FROM ids "
                "WHERE eid = ?1 AND ordinal IS NOT NULL ORDER BY ordinal LIMIT 1 OFFSET ?2)",
                (eid, excess - 1),
            )
            id_count = profile.id_cache_size
        conn.execute("UPDATE entities SET id_count = ? WHERE eid = ?", (id_count, eid))
    elif ids.first_stamp is not None and cutoff >= ids.first_stamp:  # some may have expired
        _sweep(conn, eid, ids.cursor, cutoff, max(_HOUSEKEEPING_MIN, 2 * len(keys)))
    return accepted


def _sweep(
    conn: sqlite3.Connection, eid: int, cursor: tuple[str, str], cutoff: int, span: int
) -> None:
    """Forget the expired ids among the ``span`` keys after ``cursor``, and move it on.

    The walk follows the table's own key order, so no index by age is kept up
    on every send. A send sweeps twice the keys it can add: the table stays
    within about twice the ids of one window. The cursor wraps to ``('', '')``
    (before every key: message ids are never empty) at the end of the keys.
    """
    mid, pkey = cursor
    bound = conn.execute(
        "SELECT mid, pkey FROM ids WHERE eid = ?1 AND (mid, pkey) > (?2, ?3) "
        "ORDER BY mid, pkey LIMIT 1 OFFSET ?4",
        (eid, mid, pkey, span - 1),
    ).fetchone()
    if bound is None:  # fewer than span keys left: sweep to the end, then start over
        conn.execute(
            "DELETE FROM ids WHERE eid = ?1 AND (mid, pkey) > (?2, ?3) AND stamp <= ?4",
            (eid, mid, pkey, cutoff),
        )
        bound = ("", "")
    else:
        conn.execute(
            "DELETE FROM ids WHERE eid = ?1 AND (mid, pkey) > (?2, ?3) "
            "AND (mid, pkey) <= (?4, ?5) AND stamp <= ?6",
            (eid, mid, pkey, *bound, cutoff),
        )
    if tuple(bound) != cursor:
        conn.execute(
            "UPDATE entities SET sweep_mid = ?, sweep_pkey = ? WHERE eid = ?", (*bound, eid)
        )


def _refused(entity: str, message: Message, exc: ValidationError) -> PermanentSendError:
    return PermanentSendError(
        f"entity {entity!r} refused message {message.message_id!r}: {exc}",
        message_id=message.message_id,
        partition_key=message.partition_key,
        condition="amqp:link:message-size-exceeded"
        if isinstance(exc, MessageSizeError)
        else "amqp:invalid-field",
    )
