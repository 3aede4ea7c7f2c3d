"""Messages held as columns (the Spark tasks' bulk path) are sent and stored exactly as objects.

Two real broker files, one fed ``MessageColumns`` through an ``IdempotentSender``, one fed
the equal list of ``Message`` objects: every stored field, sequence number and result
must match, and every rule must be enforced the same way (nothing sent on a refusal).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sendonce import EntityProfile, IdempotentSender, Message, MessageSizeError
from sendonce._message import MessageFactory
from sendonce._message_columns import MessageColumns
from sendonce.backends.local import LocalBackend

SHARED = {
    "subject": "orders",
    "content_type": "application/json",
    "application_properties": {"source": "spark", "n": 3},
}


def stored(backend: LocalBackend, entity: str, subscription: str | None = None) -> list[tuple]:
    got = backend.peek(entity, max_messages=10_000, subscription=subscription)
    return [
        (
            m.message_id,
            m.body,
            m.partition_key,
            m.session_id,
            m.sequence_number,
            m.subject,
            m.content_type,
            dict(m.application_properties or {}),
            m.scheduled_enqueue_time,
        )
        for m in got
    ]


def columns_of(
    n: int, *, start: int = 0, keys: bool = False, body_size: int = 40
) -> MessageColumns:
    ids = [f"order-{i}.2026/created" for i in range(start, start + n)]
    bodies = [(b'{"order_id":%d,"pad":"' % i) + b"x" * body_size + b'"}' for i in range(n)]
    keys_ = [f"customer-{i % 7}" for i in range(n)] if keys else None
    columns = MessageColumns.of(MessageFactory(**SHARED), bodies, ids, keys_)  # type: ignore[arg-type]
    assert columns is not None
    return columns


@pytest.fixture
def pair(tmp_path: Path):
    a = LocalBackend(str(tmp_path / "columns.db"))
    b = LocalBackend(str(tmp_path / "objects.db"))
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize(
    "profile",
    [
        EntityProfile("orders"),
        EntityProfile("orders", max_message_size=4096),  # many transfers
        EntityProfile("orders", kind="topic"),
        EntityProfile("orders", partitioned=True),  # keyed: the per-message path
        EntityProfile("orders", duplicate_detection=False),
    ],
    ids=["queue", "small-transfers", "topic", "partitioned", "no-dedup"],
)
def test_columns_store_what_objects_store(pair, profile: EntityProfile) -> None:
    a, b = pair
    for backend in pair:
        backend.create_entity(profile)
        if profile.kind == "topic":
            backend.create_subscription("orders", "all")
    keyed = profile.partitioned
    columns = columns_of(600, keys=keyed)
    dedup = profile.duplicate_detection
    with IdempotentSender(a, profile, require_duplicate_detection=dedup) as sender:
        by_columns = sender.send_many(columns)
    with IdempotentSender(b, profile, require_duplicate_detection=dedup) as sender:
        by_objects = sender.send_many(list(columns))
    sub = "all" if profile.kind == "topic" else None
    assert stored(a, "orders", sub) == stored(b, "orders", sub)
    with IdempotentSender(a, profile, require_duplicate_detection=dedup) as sender:
        again = sender.send_many(columns)  # every id a duplicate now
    assert by_columns.results == by_objects.results
    assert (by_columns.sent, by_columns.duplicates, by_columns.failed) == (600, 0, 0)
    if dedup:
        assert len(stored(a, "orders", sub)) == 600
        assert (again.sent, again.duplicates) == (0, 600)
    else:
        assert len(stored(a, "orders", sub)) == 600 + 600  # at-least-once: no memory


def test_a_scheduled_send_of_columns_keeps_the_time(pair) -> None:
    a, b = pair
    at = datetime(2030, 1, 1, tzinfo=UTC)
    for backend in pair:
        backend.create_entity(EntityProfile("orders"))
    columns = columns_of(50)
    acks = a.schedule("orders", columns, at, timeout=5)
    assert acks == b.schedule("orders", list(columns), at, timeout=5)
    assert stored(a, "orders") == stored(b, "orders")
    assert {row[-1] for row in stored(a, "orders")} == {at}


def test_an_oversized_message_among_columns_is_named_and_nothing_is_sent(pair) -> None:
    a, _ = pair
    a.create_entity(EntityProfile("orders", max_message_size=1024))
    columns = columns_of(30)
    big = MessageColumns.of(
        columns.factory,
        [*columns.bodies[:10], b"y" * 2000, *columns.bodies[11:]],
        columns.message_ids,
    )
    assert big is not None
    with IdempotentSender(a, "orders") as sender, pytest.raises(MessageSizeError) as caught:
        sender.send_many(big)
    assert "order-10.2026/created" in str(caught.value)
    assert "messages[10]" in str(caught.value)
    assert a.count("orders") == 0


def test_the_broker_checks_columns_it_receives_directly(pair) -> None:
    """A backend caller that skips the sender still gets the broker's rules."""
    a, _ = pair
    a.create_entity(EntityProfile("orders", max_message_size=1024, sessions=True))
    columns = columns_of(3)
    acks = None
    with pytest.raises(Exception) as caught:
        acks = a.send("orders", columns, timeout=5)
    assert acks is None
    assert "session" in str(caught.value).lower()
    assert a.count("orders") == 0


def test_repeats_and_payload_conflicts_inside_columns_are_handled_like_objects(pair) -> None:
    a, b = pair
    for backend in pair:
        backend.create_entity(EntityProfile("orders"))
    base = columns_of(10)
    ids = [*base.message_ids, base.message_ids[3]]  # the same message twice in one call
    bodies = [*base.bodies, base.bodies[3]]
    repeated = MessageColumns.of(base.factory, bodies, ids)
    assert repeated is not None
    with IdempotentSender(a, "orders") as sender:
        by_columns = sender.send_many(repeated)
    with IdempotentSender(b, "orders") as sender:
        by_objects = sender.send_many(list(repeated))
    assert by_columns.results == by_objects.results
    assert (by_columns.sent, by_columns.duplicates) == (10, 1)
    assert stored(a, "orders") == stored(b, "orders")


def test_a_message_built_from_columns_is_an_ordinary_message() -> None:
    columns = columns_of(2)
    first = columns[0]
    assert isinstance(first, Message)
    assert first == Message(
        columns.bodies[0],
        message_id=columns.message_ids[0],
        **SHARED,  # type: ignore[arg-type]
    )
    assert first.time_to_live is None and first.scheduled_enqueue_time is None
