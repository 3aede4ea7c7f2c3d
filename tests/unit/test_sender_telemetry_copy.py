"""The copy a traced transfer sends in place of each message (``with_shared``) is that
message with the transfer's trace properties and nothing else changed: every field of
``Message`` is carried over, so a field added to ``Message`` and forgotten in the copy
fails here rather than on the wire."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from sendonce import Message
from sendonce._message import _FIELDS, with_properties
from sendonce._propagation import PAIR_SIZE, with_shared

HEADERS = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "Diagnostic-Id": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
}


def full_message() -> Message:
    """A message with every optional field set to something other than its default."""
    return Message(
        "body ü",
        message_id="order-1",
        partition_key="pk",
        session_id="pk",
        scheduled_enqueue_time=datetime(2030, 1, 1, tzinfo=UTC),
        subject="subject",
        content_type="application/json",
        correlation_id="corr",
        time_to_live=timedelta(minutes=5),
    )


def test_the_copy_is_a_message_with_every_field_and_the_shared_properties() -> None:
    original = full_message()
    shared = MappingProxyType(HEADERS)
    copy = with_shared(original, shared, PAIR_SIZE)
    assert type(copy) is Message
    for name in _FIELDS:
        if name in ("application_properties", "_size"):
            continue
        assert getattr(copy, name) == getattr(original, name), name
    assert copy.application_properties is shared  # one mapping for the whole transfer
    # The same message the general path (a dict per message) builds, size included.
    general = with_properties(original, HEADERS)
    assert copy == general and copy.size == general.size == original.size + PAIR_SIZE
    assert original.application_properties is None  # the caller's message is untouched


def test_the_copy_is_still_frozen_hashable_and_picklable() -> None:
    copy = with_shared(full_message(), MappingProxyType(HEADERS), PAIR_SIZE)
    try:
        copy.subject = "changed"  # type: ignore[misc]
    except AttributeError:
        pass
    else:  # pragma: no cover - the failure this test exists for
        raise AssertionError("a traced copy must stay immutable")
    assert hash(copy) == hash(full_message())
    back = pickle.loads(pickle.dumps(copy))
    assert back == copy and dict(back.application_properties or {}) == HEADERS
