"""What counts towards an Artemis resend's reach (``artemis._reach``), without a broker.

Only distinct ids that went on the wire evict ids from the broker's ring, so only they count.
The same rules against the real broker (a restart mid-send, a connection that cannot be
opened, resends the broker drops): tests/integration/artemis.
"""

from __future__ import annotations

from sendonce.backends.artemis._reach import Attempt, ResendReach

CACHE = 10  # limit: int(10 * 0.5) - 1 = 4


def attempt(reach: ResendReach, ids: list[str], written: int | None = None) -> list[str]:
    """One transfer of ``ids``: admitted, then over having written ``written`` of them
    (all by default). The ids refused as beyond the reach (nothing admitted then)."""
    one = Attempt()
    beyond = reach.admit("orders", ids, CACHE, one)
    if beyond:
        return [b.message_id for b in beyond]
    reach.settle(one, len(ids) if written is None else written)
    return []


def test_a_resend_of_an_id_already_counted_counts_nothing() -> None:
    reach = ResendReach(0.5)
    assert attempt(reach, ["x"]) == []
    for _ in range(50):  # the broker drops each copy: none enters its cache
        assert attempt(reach, ["x"]) == []
    assert attempt(reach, ["a", "b", "c"]) == []  # x, a, b, c: distance 4, at the limit
    assert attempt(reach, ["x"]) == []
    assert attempt(reach, ["d"]) == []
    assert attempt(reach, ["x"]) == ["x"]  # five distinct ids since x's first attempt


def test_attempts_that_wrote_nothing_count_nothing() -> None:
    reach = ResendReach(0.5)
    assert attempt(reach, ["x", "y"]) == []
    for _ in range(50):  # the broker restarting: connection refused, nothing written
        assert attempt(reach, ["x", "y"], written=0) == []
        assert attempt(reach, [f"new-{n}" for n in range(3)], written=0) == []
    assert attempt(reach, ["x", "y"]) == []  # still two distinct ids written


def test_an_id_never_written_is_a_first_send_at_its_next_attempt() -> None:
    reach = ResendReach(0.5)
    assert attempt(reach, ["x", "y", "z"], written=1) == []  # only x went out
    assert attempt(reach, ["a", "b", "c"]) == []  # x is now 4 back
    assert reach.earlier("orders", ["x", "y", "z"]) == []  # none reached (no Reached set)
    assert attempt(reach, ["y", "z"]) == []  # first sends: positions from now
    assert attempt(reach, ["x"]) == ["x"]  # x, a, b, c, y, z: 6 > 4


def test_new_ids_in_flight_count_while_they_are_in_flight() -> None:
    reach = ResendReach(0.5)
    assert attempt(reach, ["x"]) == []
    flying = Attempt()
    assert reach.admit("orders", ["a", "b", "c", "d"], CACHE, flying) == []
    # x, then four ids that may be entering the cache now: a resend of x could come after them.
    assert [b.message_id for b in reach.admit("orders", ["x"], CACHE)] == ["x"]
    reach.settle(flying, 0)  # refused before any went out
    assert attempt(reach, ["x"]) == []


def test_a_refused_transfer_keeps_no_reservation_and_settling_twice_is_harmless() -> None:
    reach = ResendReach(0.5)
    one = Attempt()
    assert reach.admit("orders", ["x"], CACHE, one) == []
    reach.settle(one, 1)
    reach.settle(one, 1)
    assert attempt(reach, ["a", "b", "c"]) == []
    assert attempt(reach, ["x"]) == []  # x, a, b, c: 4, not 5
