"""Scheduled messages against a model of Service Bus's sequencing, whatever triggers activation.

The model: every message takes its place in the entity at its enqueue instant — a sent one
when sent, a scheduled one at its scheduled time (message sequencing: "as if it had been
enqueued at the current instant") — so receivers get messages in that order, each exactly
once, with increasing sequence numbers; a cancel removes a scheduled message only before its
time. The broker activates lazily, on whichever write comes first, and must not differ.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from _clock import Clock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from property_budget import examples
from sendonce import EntityProfile, Message
from sendonce.backends.local import LocalBackend, MessageNotFoundError

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.integers(0, 6)),
        st.tuples(st.just("send"), st.just(0)),
        st.tuples(st.just("wait"), st.integers(0, 5)),
        st.tuples(st.just("receive"), st.integers(1, 3)),
        st.tuples(st.just("peek"), st.just(0)),
        st.tuples(st.just("cancel"), st.integers(0, 20)),
    ),
    max_size=30,
)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS)
def test_receivers_get_messages_in_enqueue_instant_order_exactly_once(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]]
) -> None:
    db = str(tmp_path_factory.mktemp("activation") / "broker.db")
    clock = Clock()
    start = clock.now
    now = 0
    # id -> (enqueue instant, tie-break: a scheduled one activates before a send at its time,
    # then the order of the requests)
    instant: dict[str, tuple[int, int, int]] = {}
    scheduled: list[tuple[str, int, int]] = []  # (id, due, schedule sequence number)
    cancelled: set[str] = set()
    received: list[tuple[str, int]] = []
    with LocalBackend(db, clock=clock) as broker:
        broker.create_entity(EntityProfile("orders"))
        for n, (kind, value) in enumerate(steps):
            mid = f"m{n}"
            if kind == "schedule":
                at = start + timedelta(seconds=now + value)
                (ack,) = broker.schedule("orders", [Message(mid, message_id=mid)], at, timeout=5)
                assert ack.outcome == "accepted" and ack.sequence_number is not None
                scheduled.append((mid, now + value, ack.sequence_number))
                instant[mid] = (now + value, 0 if value else 1, n)
            elif kind == "send":
                broker.send("orders", [Message(mid, message_id=mid)], timeout=5)
                instant[mid] = (now, 1, n)
            elif kind == "wait":
                clock.advance(seconds=value)
                now += value
            elif kind == "receive":
                got = broker.receive("orders", max_messages=value)
                received += [(m.message_id, m.sequence_number) for m in got]
            elif kind == "peek":
                due_ids = {s[0] for s in scheduled if s[1] <= now} - cancelled
                taken = {mid for mid, _ in received}
                peeked = broker.peek("orders", max_messages=100)
                numbers = [m.sequence_number for m in peeked]
                assert numbers == sorted(numbers)
                assert due_ids - taken <= {m.message_id for m in peeked}
            elif scheduled:
                mid, due, seq = scheduled[value % len(scheduled)]
                if due > now and mid not in cancelled:
                    broker.cancel_scheduled("orders", [seq], missing_ok=False)
                    cancelled.add(mid)
                else:
                    with pytest.raises(MessageNotFoundError):
                        broker.cancel_scheduled("orders", [seq], missing_ok=False)
        clock.advance(seconds=10)
        received += [
            (m.message_id, m.sequence_number) for m in broker.receive("orders", max_messages=1000)
        ]
    expected = sorted((i for i in instant if i not in cancelled), key=instant.__getitem__)
    assert [mid for mid, _ in received] == expected
    numbers = [seq for _, seq in received]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    schedule_numbers = {seq for _, _, seq in scheduled}
    # A message scheduled for the current instant is enqueued at once, under its number.
    later = {mid for mid, _, _ in scheduled if instant[mid][1] == 0}
    activated = {seq for mid, seq in received if mid in later}
    assert not activated & schedule_numbers
