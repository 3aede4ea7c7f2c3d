"""A batch stores every column exactly, whatever mix of bodies and optional fields it holds."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendonce import Message


def fields(m):  # what must round-trip
    return (
        m.message_id,
        m.body,
        m.partition_key,
        m.session_id,
        m.subject,
        m.scheduled_enqueue_time,
        m.sequence_number,
    )


BODIES = [
    b'{"plain": "json"}',
    "unicode body: \u00e9\u4e2d\U0001f600",
    b"\xff\xfe not utf-8",
    b"nul \x00 inside",
    b"",
    '"quotes" and \\ backslashes\n',
]


@pytest.mark.parametrize("odd", range(len(BODIES)))
def test_batch_bodies_round_trip(broker, make_entity, odd):
    make_entity(partitioned=True)
    batch = [Message(BODIES[0], message_id=f"m{i}") for i in range(5)]
    batch[2] = Message(BODIES[odd], message_id="m2", partition_key="pk")
    acks = broker.send("orders", batch, timeout=5)
    got = broker.receive("orders", max_messages=10)
    expected = [m.body_bytes for m in batch]
    assert [m.body for m in got] == expected
    assert [m.partition_key for m in got] == [None, None, "pk", None, None]
    assert [m.sequence_number for m in got] == [a.sequence_number for a in acks]


def test_batch_with_mixed_optional_fields(broker, make_entity, clock):
    make_entity("events", kind="topic")
    for sub in ("a", "b"):
        broker.create_subscription("events", sub)
    later = clock.now + timedelta(minutes=5)
    batch = [
        Message("x", message_id="plain"),
        Message("y", message_id="keyed", partition_key="k", session_id="k"),
        Message("z", message_id="props", subject="s", application_properties={"n": 1}),
        Message("w", message_id="sched", scheduled_enqueue_time=later),
    ]
    broker.send("events", batch, timeout=5)
    # The scheduled one waits on the topic until its time, then reaches each subscription.
    (waiting,) = broker.peek("events", max_messages=10)
    assert waiting.message_id == "sched" and waiting.scheduled_enqueue_time == later
    sent_at = clock.now
    for sub in ("a", "b"):
        stored = broker.peek("events", subscription=sub, max_messages=10)
        assert [m.message_id for m in stored] == ["plain", "keyed", "props"]
        assert [m.session_id for m in stored] == [None, "k", None]
        assert stored[2].subject == "s" and dict(stored[2].application_properties or {}) == {"n": 1}
        assert stored[0].scheduled_enqueue_time is None
        assert [m.enqueued_time for m in stored] == [clock.now] * 3
    assert broker.count("events", subscription="a") == 3
    clock.advance(minutes=5)
    assert broker.count("events", subscription="a") == 4
    for sub in ("a", "b"):
        stored = broker.peek("events", subscription=sub, max_messages=10)
        assert [m.message_id for m in stored] == ["plain", "keyed", "props", "sched"]
        assert stored[3].scheduled_enqueue_time == stored[3].enqueued_time == later
        assert [m.enqueued_time for m in stored[:3]] == [sent_at] * 3


def test_batch_with_a_duplicate_stores_the_others(broker, make_entity):
    make_entity()
    broker.send("orders", [Message("old", message_id="b")], timeout=5)
    acks = broker.send(
        "orders", [Message(f"new {i}", message_id=k) for i, k in enumerate("abc")], timeout=5
    )
    assert [a.outcome for a in acks] == ["accepted", "duplicate", "accepted"]
    assert [(m.message_id, m.body) for m in broker.receive("orders", max_messages=5)] == [
        ("b", b"old"),
        ("a", b"new 0"),
        ("c", b"new 2"),
    ]


def test_large_batch_over_the_json_limit(broker, make_entity):
    make_entity(max_message_size=1024 * 1024)
    body = b"x" * 600_000
    batch = [Message(body, message_id=f"big{i}") for i in range(16)]  # ~9.6 MB
    broker.send("orders", batch, timeout=30)
    assert [len(m.body) for m in broker.receive("orders", max_messages=20)] == [600_000] * 16


def test_values_every_message_shares_are_stored_on_each(broker, make_entity, clock):
    # One value shared by a whole batch (a content type, a partition key, a schedule
    # time, one properties mapping) is bound once; each stored message still has it.
    make_entity(partitioned=True)
    props = {"source": "spark", "n": 7, "raw": b"\x01"}
    batch = [
        Message(
            f"body {i}",
            message_id=f"m{i}",
            partition_key="pk",
            session_id="pk",
            content_type="application/json",
            application_properties=props,
            time_to_live=timedelta(hours=1),
        )
        for i in range(4)
    ]
    at = clock.now + timedelta(minutes=1)
    acks = broker.schedule("orders", batch, at, timeout=5)
    assert [a.outcome for a in acks] == ["accepted"] * 4
    clock.advance(minutes=1)
    stored = broker.peek("orders", max_messages=10)
    assert [(m.message_id, m.body) for m in stored] == [
        (f"m{i}", f"body {i}".encode()) for i in range(4)
    ]
    for m in stored:
        assert (m.partition_key, m.session_id, m.content_type) == ("pk", "pk", "application/json")
        assert dict(m.application_properties or {}) == props
        assert m.time_to_live == timedelta(hours=1)
        assert m.scheduled_enqueue_time == at


def test_a_send_checks_the_entity_as_it_is_when_it_commits(db, clock):
    # A send checks and encodes its messages before taking the write lock, against
    # the profile it last saw; another handle changing the entity meanwhile must not
    # let a message through that the entity as it now is refuses.
    from sendonce import EntityProfile, PermanentSendError
    from sendonce.backends.local import LocalBackend

    with LocalBackend(db, clock=clock) as a, LocalBackend(db, clock=clock) as b:
        b.create_entity(EntityProfile("orders"))
        assert a.send("orders", [Message("x", message_id="1")], timeout=5)[0].outcome == "accepted"
        b.delete_entity("orders")
        b.create_entity(EntityProfile("orders", sessions=True))
        with pytest.raises(PermanentSendError, match="session"):
            a.send("orders", [Message("x", message_id="2")], timeout=5)
        b.delete_entity("orders")
        b.create_entity(EntityProfile("orders", max_message_size=1024))
        with pytest.raises(PermanentSendError) as refused:
            a.send("orders", [Message("x" * 2000, message_id="3")], timeout=5)
        assert refused.value.condition == "amqp:link:message-size-exceeded"
        b.delete_entity("orders")
        with pytest.raises(PermanentSendError) as missing:
            a.send("orders", [Message("x", message_id="4")], timeout=5)
        assert missing.value.condition == "amqp:not-found"
        b.create_entity(EntityProfile("orders", partitioned=True))
        # Now partitioned: the same id under two partition keys is two messages.
        acks = a.send(
            "orders",
            [
                Message("x", message_id="5", partition_key="p1"),
                Message("y", message_id="5", partition_key="p2"),
            ],
            timeout=5,
        )
        assert [ack.outcome for ack in acks] == ["accepted", "accepted"]
        assert b.count("orders") == 2
