"""The PostgreSQL ledger's packed key (schema 3): injective, reversible, one range per entity."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sendonce.ledger import Key
from sendonce.ledger._pgkeys import entity_range, packed_key, packed_keys, unpack_key

names = st.text(min_size=1, max_size=12)
parts = st.text(max_size=12)
keys = st.tuples(names, st.builds(Key, st.text(min_size=1, max_size=12), parts))


@given(keys, keys)
def test_two_keys_pack_alike_only_when_they_are_one_key(
    a: tuple[str, Key], b: tuple[str, Key]
) -> None:
    assert (packed_key(*a) == packed_key(*b)) == (a == b)


@given(keys)
def test_a_packed_key_gives_back_its_key(a: tuple[str, Key]) -> None:
    assert unpack_key(packed_key(*a)) == a[1]


@given(keys, names)
def test_an_entity_range_holds_exactly_that_entitys_keys(a: tuple[str, Key], other: str) -> None:
    entity, key = a
    inside = entity_range(entity)
    assert inside["lo"] <= packed_key(entity, key) < inside["hi"]
    elsewhere = entity_range(other)
    assert (elsewhere["lo"] <= packed_key(entity, key) < elsewhere["hi"]) == (other == entity)


def test_the_batch_packing_is_the_single_one() -> None:
    batch = [Key("a"), Key("b", "p"), Key("é", "ü")]
    assert packed_keys("orders", batch) == [packed_key("orders", k) for k in batch]
    plain = [Key("a"), Key("b")]
    assert packed_keys("orders", plain) == [packed_key("orders", k) for k in plain]
    assert packed_key("ab", Key("c")) != packed_key("a", Key("bc"))  # the length says where
