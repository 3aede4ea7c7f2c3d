"""The Artemis facts sendonce relies on, checked on the running broker with a hand-written
proton client (no sendonce code): docs/artemis.md's semantics table cites these tests."""

from __future__ import annotations

import pytest

from artemis.broker import ArtemisBroker
from artemis.raw import ACCEPTED, drain, manage, raw_send, raw_transaction


def test_the_broker_is_artemis_and_answers_amqp(artemis_broker: ArtemisBroker, artemis_address):
    assert raw_send(artemis_broker.url(), artemis_address, [("a", "hello")]) == [ACCEPTED]
    assert [m.body for m in drain(artemis_broker.url(), artemis_address)] == ["hello"]
    assert "AMQ221007" in artemis_broker.log()


def test_a_duplicate_outside_a_transaction_is_accepted_and_dropped(
    artemis_broker: ArtemisBroker, artemis_address
):
    outcomes = raw_send(artemis_broker.url(), artemis_address, [("a", "first"), ("a", "second")])
    assert outcomes == [ACCEPTED, ACCEPTED]  # the sender cannot tell the copy from a first send
    assert [m.body for m in drain(artemis_broker.url(), artemis_address)] == ["first"]


def test_a_string_id_and_the_same_text_as_binary_are_different_ids(
    artemis_broker: ArtemisBroker, artemis_address
):
    raw_send(artemis_broker.url(), artemis_address, [("a", "text"), (b"a", "binary")])
    assert sorted(m.body for m in drain(artemis_broker.url(), artemis_address)) == [
        "binary",
        "text",
    ]


def test_an_acceptor_without_duplicate_detection_stores_every_copy(
    artemis_broker: ArtemisBroker, artemis_address
):
    url = artemis_broker.url(port=artemis_broker.nodedup_port)
    raw_send(url, artemis_address, [("a", "first"), ("a", "second")])
    assert [m.body for m in drain(url, artemis_address)] == ["first", "second"]


def test_the_id_cache_is_a_ring_per_address(artemis_broker: ArtemisBroker, artemis_address):
    # "small-cache.#" has id-cache-size 3 (the session broker's address setting).
    small = f"small-cache.{artemis_address}"
    url = artemis_broker.url()
    raw_send(url, small, [("a", 1), ("b", 2), ("c", 3), ("a", "a within 3"), ("d", 4)])
    raw_send(url, small, [("a", "a 4 ids later")])
    # Another address's cache is its own: "a" there is a first send.
    raw_send(url, artemis_address, [("a", "elsewhere")])
    assert [m.body for m in drain(url, small)] == [1, 2, 3, 4, "a 4 ids later"]
    assert [m.body for m in drain(url, artemis_address)] == ["elsewhere"]


def test_a_binary_id_is_detected_as_a_binary_id(artemis_broker: ArtemisBroker, artemis_address):
    # Binary _AMQ_DUPL_ID values are accepted from Artemis 2.38 (a string is the usual form).
    raw_send(artemis_broker.url(), artemis_address, [(b"a", "first"), (b"a", "second")])
    assert [m.body for m in drain(artemis_broker.url(), artemis_address)] == ["first"]


def test_an_acceptor_detects_duplicates_unless_told_not_to(
    artemis_broker: ArtemisBroker, artemis_address
):
    # The "plain" acceptor does not mention amqpDuplicateDetection: it defaults to true.
    url = artemis_broker.url(port=artemis_broker.plain_port)
    raw_send(url, artemis_address, [("a", "first"), ("a", "second")])
    assert [m.body for m in drain(url, artemis_address)] == ["first"]


def test_a_duplicate_in_a_transaction_rolls_the_group_back(
    artemis_broker: ArtemisBroker, artemis_address
):
    url = artemis_broker.url()
    assert raw_transaction(url, artemis_address, [("a", "a"), ("b", "b")])[0] == "committed"
    outcome, condition, description = raw_transaction(
        url, artemis_address, [("c", "c"), ("a", "a again"), ("d", "d"), ("b", "b again")]
    )
    assert (outcome, condition) == ("rejected", "failed")
    assert "_AMQ_DUPL_ID=b}" in str(description)  # the last duplicate met is named
    # Nothing of the rolled-back group was stored, and its new ids were not remembered.
    assert raw_transaction(url, artemis_address, [("c", "c"), ("d", "d")])[0] == "committed"
    assert [m.body for m in drain(url, artemis_address)] == ["a", "b", "c", "d"]


def test_deleting_the_last_queue_of_an_address_clears_its_id_cache(
    artemis_broker: ArtemisBroker, artemis_address
):
    url = artemis_broker.url()
    raw_send(url, artemis_address, [("a", "first")])
    # destroyQueue(name, removeConsumers, autoDeleteAddress): the address goes with it.
    manage(url, "broker", "destroyQueue", artemis_address, True, True)
    with pytest.raises(RuntimeError, match="AMQ229203"):
        manage(url, "broker", "getAddressInfo", artemis_address)
    raw_send(url, artemis_address, [("a", "after the address was recreated")])
    assert [m.body for m in drain(url, artemis_address)] == ["after the address was recreated"]
