"""Which id cache a resend would reach (``artemis._cache``): the rule, without a broker.

The real faults (a broker restart, a deleted address) are in tests/integration/artemis; a
two-node cluster is not started there, so the node rule is pinned here.
"""

from __future__ import annotations

from sendonce.backends.artemis._cache import (
    Incarnation,
    Reached,
    different_cache,
    queue_ids,
)


def test_a_resend_to_another_cluster_node_reaches_another_cache() -> None:
    first = Reached(Incarnation("node-a", 1, (10.0, 10.1)), 0)
    assert different_cache(first, Reached(Incarnation("node-a", 2, (10.0, 10.1)), 0)) is None
    why = different_cache(first, Reached(Incarnation("node-b", 2, (10.0, 10.1)), 0))
    assert why is not None and "node-a" in why and "node-b" in why


def test_a_restart_matters_only_where_the_cache_is_not_persisted() -> None:
    before = Incarnation("node-a", 1, (100.0, 100.02))
    after_restart = Incarnation("node-a", 2, (107.5, 107.6))
    same_run = Incarnation("node-a", 3, (100.01, 100.05))
    unknown = Incarnation("node-a", 4, None)
    assert different_cache(Reached(before, 0), Reached(after_restart, 0)) is None
    lost = Reached(before, 0, persisted=False)
    assert "restarted" in str(different_cache(lost, Reached(after_restart, 0, persisted=False)))
    assert different_cache(lost, Reached(same_run, 0, persisted=False)) is None
    assert "uptime could not be read" in str(
        different_cache(lost, Reached(unknown, 0, persisted=False))
    )
    # The same connection is the same run, uptime read or not.
    assert (
        different_cache(Reached(unknown, 0, persisted=False), Reached(unknown, 0, persisted=False))
        is None
    )


def test_a_new_generation_of_queues_is_another_cache() -> None:
    run = Incarnation("node-a", 1)
    assert "last queue" in str(different_cache(Reached(run, 0), Reached(run, 1)))


def test_queue_ids_reads_the_list_queues_answer_of_one_address() -> None:
    answer = '{"data": [{"id": "63", "address": "orders"}, {"id": "70", "address": "other"}]}'
    assert queue_ids(answer, "orders") == frozenset({"63"})
    assert queue_ids({"data": []}, "orders") == frozenset()
    assert queue_ids("not json", "orders") is None
