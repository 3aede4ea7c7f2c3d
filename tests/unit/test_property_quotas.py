"""Service Bus's message property quotas, checked before anything is sent: 32 KB for one
property (name and value), 64 KB for all of them, whatever the entity's maximum size."""

from __future__ import annotations

import pytest

from sendonce import EntityProfile, Message, MessageSizeError
from sendonce._property_quotas import MAX_PROPERTIES_SIZE, MAX_PROPERTY_SIZE, property_size

PROFILE = EntityProfile("orders", max_message_size=1024 * 1024)


def with_property(name: str, value: object, **fields: object) -> Message:
    return Message(b"body", message_id="m-1", application_properties={name: value}, **fields)  # type: ignore[arg-type, dict-item]


def test_a_property_of_exactly_32_kb_is_accepted() -> None:
    PROFILE.check(with_property("big", "x" * (MAX_PROPERTY_SIZE - len("big"))))


def test_a_property_over_32_kb_is_refused_naming_it() -> None:
    with pytest.raises(MessageSizeError) as refused:
        PROFILE.check(with_property("big", "x" * (MAX_PROPERTY_SIZE - len("big") + 1)))
    assert refused.value.field == "application_properties"
    assert "'big'" in str(refused.value)
    assert f"{MAX_PROPERTY_SIZE + 1} bytes" in str(refused.value)


def test_text_is_measured_in_utf8_bytes_not_characters() -> None:
    euros = "€" * 11_000  # 11,000 characters, 33,000 bytes
    assert property_size("e", euros) == 33_001
    with pytest.raises(MessageSizeError, match="'e'"):
        PROFILE.check(with_property("e", euros))


def test_a_binary_property_is_measured_by_its_length() -> None:
    with pytest.raises(MessageSizeError, match="'blob'"):
        PROFILE.check(with_property("blob", b"\x00" * MAX_PROPERTY_SIZE))


@pytest.mark.parametrize("name", ["subject", "correlation_id", "content_type"])
def test_a_system_property_over_32_kb_is_refused_naming_its_field(name: str) -> None:
    message = Message(b"body", message_id="m-1", **{name: "s" * MAX_PROPERTY_SIZE})  # type: ignore[arg-type]
    with pytest.raises(MessageSizeError) as refused:
        PROFILE.check(message)
    assert refused.value.field == name


def test_properties_over_64_kb_together_are_refused() -> None:
    value = "v" * 30_000
    ok = {"a": value, "b": value}
    PROFILE.check(Message(b"", message_id="m", application_properties=ok))
    third = {**ok, "c": "v" * (MAX_PROPERTIES_SIZE - 60_000)}  # each fits, not all three
    with pytest.raises(MessageSizeError, match="together") as refused:
        PROFILE.check(Message(b"", message_id="m", application_properties=third))
    assert refused.value.field == "application_properties"


def test_numbers_count_their_encoded_width() -> None:
    assert property_size("n", 7) == 9
    assert property_size("f", 1.5) == 9
    assert property_size("b", True) == 2
    assert property_size("none", None) == 4


def test_an_artemis_style_entity_has_no_property_quota() -> None:
    artemis = EntityProfile("orders", max_message_size=1024 * 1024, id_cache_size=100)
    artemis.check(with_property("big", "x" * (2 * MAX_PROPERTY_SIZE)))


def test_a_large_body_is_not_a_large_property() -> None:
    PROFILE.check(Message(b"x" * 500_000, message_id="m", application_properties={"k": "v"}))
