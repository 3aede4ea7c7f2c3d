"""EntityProfile: window bounds, dedup keys, and the per-message rules of DESIGN.md section 2."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import timedelta
from typing import Any

import pytest

from sendonce import (
    ConfigurationError,
    EntityProfile,
    KeyRuleError,
    Message,
    MessageSizeError,
)


def msg(mid: str = "m-1", **kwargs: Any) -> Message:
    body = kwargs.pop("body", b"x")
    return Message(body, message_id=mid, **kwargs)


# ---------------------------------------------------------------- construction


def test_defaults_follow_service_bus() -> None:
    p = EntityProfile("orders")
    assert p.kind == "queue"
    assert p.duplicate_detection is True
    assert p.duplicate_detection_window == timedelta(minutes=10)
    assert p.window == timedelta(minutes=10)
    assert p.partitioned is False
    assert p.sessions is False
    assert p.max_message_size == 256 * 1024
    assert p.id_cache_size is None
    assert p.persist_id_cache is True
    assert p.count_bounded is False


def test_options_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        EntityProfile("orders", "topic")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "window",
    [timedelta(seconds=20), timedelta(minutes=10), timedelta(days=7), timedelta(hours=1)],
)
def test_window_inside_the_range_is_accepted(window: timedelta) -> None:
    assert EntityProfile("q", duplicate_detection_window=window).window == window


@pytest.mark.parametrize(
    "window",
    [
        timedelta(seconds=19, microseconds=999_999),
        timedelta(0),
        timedelta(seconds=-30),
        timedelta(days=7, microseconds=1),
        timedelta(days=30),
    ],
)
def test_window_outside_20s_to_7d_is_refused(window: timedelta) -> None:
    with pytest.raises(ConfigurationError) as ei:
        EntityProfile("q", duplicate_detection_window=window)
    assert ei.value.field == "duplicate_detection_window"
    assert "duplicate_detection_window" in str(ei.value)
    assert "'q'" in str(ei.value)


@pytest.mark.parametrize("window", [600, 600.0, "PT10M", None])
def test_window_must_be_a_timedelta(window: Any) -> None:
    with pytest.raises(ConfigurationError) as ei:
        EntityProfile("q", duplicate_detection_window=window)
    assert ei.value.field == "duplicate_detection_window"


def test_count_bounded_entities_have_no_time_window() -> None:
    p = EntityProfile("jms.queue.orders", id_cache_size=20_000, persist_id_cache=False)
    assert p.count_bounded is True
    assert p.window is None
    assert p.persist_id_cache is False


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": 5}, "name"),
        ({"name": "a?b"}, "name"),
        ({"name": "x" * 261}, "name"),
        ({"kind": "exchange"}, "kind"),
        ({"duplicate_detection": 1}, "duplicate_detection"),
        ({"partitioned": "yes"}, "partitioned"),
        ({"sessions": None}, "sessions"),
        ({"persist_id_cache": 0}, "persist_id_cache"),
        ({"max_message_size": 1023}, "max_message_size"),
        ({"max_message_size": True}, "max_message_size"),
        ({"max_message_size": 1024.0}, "max_message_size"),
        ({"id_cache_size": 0}, "id_cache_size"),
        ({"id_cache_size": True}, "id_cache_size"),
        ({"id_cache_size": 10.5}, "id_cache_size"),
    ],
)
def test_bad_settings_name_the_setting(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"name": "orders", **kwargs}
    name = args.pop("name")
    with pytest.raises(ConfigurationError) as ei:
        EntityProfile(name, **args)
    assert ei.value.field == field
    assert field in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_profiles_are_frozen_values() -> None:
    p = EntityProfile("orders", partitioned=True, sessions=True, id_cache_size=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.partitioned = False  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(p)) == p
    assert p == EntityProfile("orders", partitioned=True, sessions=True, id_cache_size=10)
    assert hash(p) == hash(
        EntityProfile("orders", partitioned=True, sessions=True, id_cache_size=10)
    )


# ---------------------------------------------------------------- dedup key


def test_unpartitioned_key_is_the_message_id_alone() -> None:
    p = EntityProfile("q")
    assert p.dedup_key(msg("m")) == ("m", None)
    assert p.dedup_key(msg("m", partition_key="a")) == ("m", None)
    assert p.dedup_key(msg("m", partition_key="a")) == p.dedup_key(msg("m", partition_key="b"))
    sessions = EntityProfile("q", sessions=True)
    assert sessions.dedup_key(msg("m", session_id="s")) == ("m", None)


def test_partitioned_key_is_message_id_plus_partition_key() -> None:
    p = EntityProfile("q", partitioned=True)
    assert p.dedup_key(msg("m", partition_key="a")) == ("m", "a")
    assert p.dedup_key(msg("m", partition_key="a")) != p.dedup_key(msg("m", partition_key="b"))


def test_partitioned_session_id_stands_in_for_partition_key() -> None:
    p = EntityProfile("q", partitioned=True, sessions=True)
    assert p.dedup_key(msg("m", session_id="s")) == ("m", "s")
    assert p.dedup_key(msg("m", session_id="s", partition_key="s")) == ("m", "s")


def test_partitioned_with_dedup_message_id_stands_in_for_missing_key() -> None:
    p = EntityProfile("q", partitioned=True)
    assert p.dedup_key(msg("m")) == ("m", "m")
    # same id without a key twice: the same broker key, so the second is a duplicate
    assert p.dedup_key(msg("m")) == p.dedup_key(msg("m", body=b"other"))
    # an explicit key equal to the id is the same key as none at all
    assert p.dedup_key(msg("m")) == p.dedup_key(msg("m", partition_key="m"))


def test_dedup_key_ignores_body_and_properties() -> None:
    p = EntityProfile("q", partitioned=True)
    a = msg("m", partition_key="k", body=b"one", subject="a")
    b = msg("m", partition_key="k", body=b"two", application_properties={"x": 1})
    assert p.dedup_key(a) == p.dedup_key(b)


def test_effective_partition_key() -> None:
    p = EntityProfile("q", partitioned=True)
    assert p.effective_partition_key(msg("m")) is None
    assert p.effective_partition_key(msg("m", partition_key="k")) == "k"
    assert p.effective_partition_key(msg("m", session_id="s")) == "s"


# ---------------------------------------------------------------- check


def test_check_accepts_valid_messages() -> None:
    EntityProfile("q").check(msg("m"))
    EntityProfile("q", sessions=True).check(msg("m", session_id="s"))
    EntityProfile("q", sessions=True, partitioned=True).check(
        msg("m", session_id="s", partition_key="s")
    )
    EntityProfile("q", partitioned=True).check(msg("m", partition_key="k"))
    EntityProfile("q", partitioned=True).check(msg("m"))


def test_session_entity_requires_session_id() -> None:
    p = EntityProfile("orders", sessions=True)
    for m in (msg("m-7"), msg("m-7", partition_key="k")):
        with pytest.raises(KeyRuleError) as ei:
            p.check(m)
        assert ei.value.field == "session_id"
        assert "session_id" in str(ei.value)
        assert "'m-7'" in str(ei.value)
        assert "'orders'" in str(ei.value)


def test_check_refuses_mismatched_keys_even_if_built_around_validation() -> None:
    """Message refuses pk != sid; check() must too (e.g. a message unpickled from elsewhere)."""
    m = msg("m", partition_key="p")
    object.__setattr__(m, "session_id", "s")
    with pytest.raises(KeyRuleError) as ei:
        EntityProfile("q", sessions=True).check(m)
    assert ei.value.field == "partition_key"


def test_size_limit_is_inclusive() -> None:
    p = EntityProfile("q", max_message_size=1024)
    exact = msg("m", body=b"x" * (1024 - 1))
    assert exact.size == 1024
    p.check(exact)
    over = msg("m", body=b"x" * 1024)
    with pytest.raises(MessageSizeError) as ei:
        p.check(over)
    assert ei.value.field == "body"
    assert "1025" in str(ei.value) and "1024" in str(ei.value)
    assert "'m'" in str(ei.value)


def test_size_counts_utf8_and_keys() -> None:
    p = EntityProfile("q", max_message_size=1024)
    with pytest.raises(MessageSizeError):
        p.check(msg("m", body="é" * 512))  # 1024 bytes of UTF-8, 512 characters
    with pytest.raises(MessageSizeError):
        p.check(msg("m", body=b"x" * 1000, partition_key="k" * 24))
    p.check(msg("m", body=b"x" * 1000, partition_key="k" * 23))


def test_default_limit_is_256_kib() -> None:
    p = EntityProfile("q")
    p.check(msg("m", body=b"x" * (256 * 1024 - 1)))
    with pytest.raises(MessageSizeError):
        p.check(msg("m", body=b"x" * (256 * 1024)))


def test_rules_are_checked_in_a_useful_order() -> None:
    """Session rule first: a missing session id is the more fundamental error."""
    p = EntityProfile("q", sessions=True, max_message_size=1024)
    with pytest.raises(KeyRuleError):
        p.check(msg("m", body=b"x" * 5000))


# ---------------------------------------------------------------- duplicate detection


def test_require_duplicate_detection() -> None:
    EntityProfile("q").require_duplicate_detection()
    EntityProfile("q", id_cache_size=10).require_duplicate_detection()
    with pytest.raises(ConfigurationError) as ei:
        EntityProfile("basic", duplicate_detection=False).require_duplicate_detection()
    assert ei.value.field == "duplicate_detection"
    text = str(ei.value)
    assert "'basic'" in text
    assert "Basic tier" in text
    assert "require_duplicate_detection=False" in text
