"""The checker itself: it must fail on every kind of broken outcome, and only on those."""

from __future__ import annotations

from typing import Any

import pytest

from .checker import check
from .producer import body, message_id

W = 20.0


def schedule(*id_lists: list[int], window: float = W) -> dict[str, Any]:
    return {
        "entity": {"window_s": window},
        "producers": [{"ids": ids, "incarnations": []} for ids in id_lists],
    }


def attempt(call: str, ids: list[int], t: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"ev": "attempt", "call": call, "ids": ids, "t": t, "origin": t, **extra}


def done(
    call: str,
    t: float = 1.0,
    *,
    sent: list[int] | None = None,
    duplicate: list[int] | None = None,
    in_doubt: list[int] | None = None,
    permanent: list[int] | None = None,
) -> dict[str, Any]:
    return {
        "ev": "done",
        "call": call,
        "t": t,
        "sent": sent or [],
        "duplicate": duplicate or [],
        "in_doubt": in_doubt or [],
        "permanent": permanent or [],
        "other": [],
    }


def copies(*ns: int, at: float = 0.5) -> list[tuple[str, bytes, float]]:
    return [(message_id(n), body(n).encode(), at) for n in ns]


def kinds(verdict: Any) -> list[str]:
    return [v.split(":")[0] for v in verdict.violations]


def test_clean_run_passes() -> None:
    journal = [attempt("0.0", [1, 2, 3]), done("0.0", sent=[1, 2, 3])]
    verdict = check(schedule([1, 2, 3]), {0: journal}, copies(1, 2, 3))
    assert verdict.ok, verdict.violations
    assert verdict.stats["confirmed"] == 3


def test_duplicate_is_a_violation() -> None:
    journal = [attempt("0.0", [1, 2]), done("0.0", sent=[1, 2])]
    verdict = check(schedule([1, 2]), {0: journal}, copies(1, 2, 2))
    assert kinds(verdict) == ["duplicate"]


def test_confirmed_but_missing_is_a_violation() -> None:
    journal = [attempt("0.0", [1, 2]), done("0.0", sent=[1, 2])]
    verdict = check(schedule([1, 2]), {0: journal}, copies(1))
    assert kinds(verdict) == ["missing"]


def test_in_doubt_may_be_present_once_or_absent_but_never_twice() -> None:
    journal = [attempt("0.0", [1, 2, 3]), done("0.0", sent=[1], in_doubt=[2, 3])]
    assert check(schedule([1, 2, 3]), {0: journal}, copies(1, 2)).ok
    assert kinds(check(schedule([1, 2, 3]), {0: journal}, copies(1, 2, 2))) == ["duplicate"]


def test_permanent_failure_must_leave_nothing_stored() -> None:
    journal = [attempt("0.0", [1, 2]), done("0.0", sent=[1], permanent=[2])]
    assert check(schedule([1, 2]), {0: journal}, copies(1)).ok
    assert kinds(check(schedule([1, 2]), {0: journal}, copies(1, 2))) == ["permanent-but-stored"]


def test_killed_in_flight_and_expired_counts_as_in_doubt() -> None:
    journal = [
        attempt("0.0", [1, 2]),
        {"ev": "expired", "ids": [1, 2], "t": 30.0, "origin": 0.0, "resumes": "0.0"},
    ]
    assert check(schedule([1, 2]), {0: journal}, copies(1)).ok
    assert kinds(check(schedule([1, 2]), {0: journal}, copies(1, 1))) == ["duplicate"]


def test_phantoms_and_foreign_bodies_are_violations() -> None:
    journal = [attempt("0.0", [1]), done("0.0", sent=[1])]
    stored = [*copies(1), ("order-9", body(9).encode(), 0.5), ("other", b"x", 0.5)]
    assert sorted(kinds(check(schedule([1]), {0: journal}, stored))) == ["phantom", "phantom"]
    wrong = [(message_id(1), b"not the order", 0.5)]
    assert kinds(check(schedule([1]), {0: journal}, wrong)) == ["body"]


def test_unsent_ids_are_violations() -> None:
    journal = [attempt("0.0", [1]), done("0.0", sent=[1])]
    assert kinds(check(schedule([1, 2]), {0: journal}, copies(1))) == ["unsent"]


def test_report_must_account_for_each_message_once() -> None:
    journal = [attempt("0.0", [1, 2]), done("0.0", sent=[1])]
    assert "report" in kinds(check(schedule([1, 2]), {0: journal}, copies(1)))


def test_duplicate_outcome_on_a_first_send_breaks_the_sdk_contract() -> None:
    journal = [attempt("0.0", [1]), done("0.0", duplicate=[1])]
    assert kinds(check(schedule([1]), {0: journal}, copies(1))) == ["sdk-contract"]


@pytest.mark.parametrize(
    ("gap", "second_producer", "ok"),
    [
        (W + 1, 1, True),  # two producers, copies a full window apart: the broker forgot
        (W - 1, 1, False),  # inside the window: the broker should have deduplicated
        (W + 1, 0, False),  # one producer's copies are never excused
    ],
)
def test_copies_a_window_apart_are_excused_only_across_producers(
    gap: float, second_producer: int, ok: bool
) -> None:
    first = [attempt("0.0", [1], t=0.0), done("0.0", t=1.0, sent=[1])]
    second = [attempt("0.1", [1], t=gap - 0.5), done("0.1", t=gap + 0.5, sent=[1])]
    journals = {0: first, 1: [attempt("0.0", [1], t=100.0), done("0.0", t=101.0, sent=[1])]}
    if second_producer == 1:
        journals[1] = [attempt("0.0", [1], t=gap - 0.5), done("0.0", t=gap + 0.5, sent=[1])]
    else:
        journals[0] = first + second
    stored = copies(1, at=0.5) + copies(1, at=gap)
    verdict = check(schedule([1], [1]), journals, stored)
    assert verdict.ok is ok, verdict.violations
    if ok:
        assert verdict.stats["window_expired_duplicates"] == 1


def test_subscriptions_must_match_the_topic() -> None:
    journal = [attempt("0.0", [1, 2]), done("0.0", sent=[1, 2])]
    ids = [message_id(1), message_id(2)]
    subs = {"(topic)": ids, "audit": ids, "billing": ids[:1]}
    assert kinds(check(schedule([1, 2]), {0: journal}, copies(1, 2), subs)) == ["fan-out"]


def test_reported_sequence_numbers_must_be_the_stored_copies() -> None:
    journal = [attempt("0.0", [1, 2]), {**done("0.0", sent=[1, 2]), "seq": [[1, 7], [2, 8]]}]
    ok = check(
        schedule([1, 2]), {0: journal}, copies(1, 2), sequences={"order-1": {7}, "order-2": {8}}
    )
    assert ok.ok, ok.violations
    wrong = check(
        schedule([1, 2]), {0: journal}, copies(1, 2), sequences={"order-1": {7}, "order-2": {9}}
    )
    assert kinds(wrong) == ["sequence"]


# -- the file-sharing dimensions: the shapes in which issue 10 lost acknowledged messages


def test_a_forked_childs_confirmed_messages_must_be_stored() -> None:
    # the parent sent chunk 0, its forked children chunks 1 and 2 (calls "0.fC.seq")
    journal = [
        attempt("0.0", [1, 2], chunk=0),
        done("0.0", sent=[1, 2]),
        attempt("0.f0.0", [3, 4], chunk=1),
        attempt("0.f1.0", [5, 6], chunk=2),
        done("0.f1.0", sent=[5, 6]),
        done("0.f0.0", sent=[3, 4]),
    ]
    ids = [1, 2, 3, 4, 5, 6]
    assert check(schedule(ids), {0: journal}, copies(*ids)).ok
    # the parent closed first and the children's acknowledged messages vanished
    lost = check(schedule(ids), {0: journal}, copies(1, 2, 5))
    assert kinds(lost) == ["missing"] * 3
    # an unrelated process then got its own copy of an id the child had stored
    split = check(schedule(ids), {0: journal}, copies(*ids, 3))
    assert kinds(split) == ["duplicate"]


def test_an_interrupted_call_is_in_doubt_until_its_resume_confirms_it() -> None:
    interrupted = [
        attempt("0.0", [1, 2], chunk=0),
        {"ev": "interrupted", "call": "0.0", "t": 0.5},
    ]
    # exited after Ctrl-C, never resumed: in doubt, present at most once
    assert check(schedule([1, 2]), {0: interrupted}, copies(1)).ok
    assert kinds(check(schedule([1, 2]), {0: interrupted}, copies(1, 1))) == ["duplicate"]
    resumed = [
        *interrupted,
        attempt("0.1", [1, 2], chunk=0, resumes="0.0"),
        done("0.1", sent=[1], duplicate=[2]),
    ]
    assert check(schedule([1, 2]), {0: resumed}, copies(1, 2)).ok
    # the resume was acknowledged, yet the stuck transaction never reached the file
    assert kinds(check(schedule([1, 2]), {0: resumed}, copies(2))) == ["missing"]


def test_messages_acknowledged_through_several_handles_must_all_be_stored() -> None:
    # two producers, each alternating its own stack and url senders (calls are calls)
    first = [attempt("0.0", [1, 2]), done("0.0", sent=[1, 2]), attempt("0.1", [3])]
    first.append(done("0.1", sent=[3]))
    second = [attempt("0.0", [2, 3, 4]), done("0.0", sent=[4], duplicate=[2, 3])]
    journals = {0: first, 1: second}
    assert check(schedule([1, 2, 3], [2, 3, 4]), journals, copies(1, 2, 3, 4)).ok
    # the WAL was checkpointed and deleted under one handle: its later commits are gone
    lost = check(schedule([1, 2, 3], [2, 3, 4]), journals, copies(1, 2))
    assert kinds(lost) == ["missing", "missing"]


def test_a_key_stored_out_of_input_order_is_a_violation() -> None:
    """Sessions s0..s2 (id % 3): ids 0, 3, 6 share s0; a call sent them in that order."""
    keyed = schedule([0, 1, 3, 6])
    keyed["entity"]["sessions"] = True
    journal = [attempt("0.0", [0, 1, 3, 6]), done("0.0", sent=[0, 1, 3, 6])]
    stored = copies(1, at=0.5) + copies(0, at=0.1) + copies(3, at=0.2) + copies(6, at=0.3)
    in_order = check(keyed, {0: journal}, stored)  # listed in another order: times count
    assert in_order.ok, in_order.violations
    assert in_order.stats["ordered_keys"] == 1
    swapped = copies(0, at=0.1) + copies(6, at=0.2) + copies(1, at=0.3) + copies(3, at=0.4)
    assert kinds(check(keyed, {0: journal}, swapped)) == ["key-order"]


def test_a_cancelled_call_is_counted_and_in_doubt_until_its_re_run_confirms_it() -> None:
    keyed = schedule([0, 3, 6, 9])
    keyed["entity"]["sessions"] = True  # 0, 3, 6, 9 share session s0
    cancelled = [
        attempt("0.0", [0, 3], chunk=0),
        {"ev": "interrupted", "call": "0.0", "t": 0.2, "how": "cancel"},
        attempt("0.1", [0, 3], chunk=0, resumes="0.0"),
        done("0.1", sent=[3], duplicate=[0]),  # 0 was stored before the cancellation landed
        attempt("0.2", [6, 9], chunk=1),
        done("0.2", sent=[6, 9]),
    ]
    stored = copies(0, at=0.1) + copies(3, at=0.3) + copies(6, at=0.4) + copies(9, at=0.5)
    verdict = check(keyed, {0: cancelled}, stored)
    assert verdict.ok, verdict.violations
    assert verdict.stats["cancelled_calls"] == 1
    assert verdict.stats["ordered_keys"] == 1  # the later call's key order is checked
    # the re-run's acknowledgement without its copy, a second copy, a later call reordered
    assert kinds(check(keyed, {0: cancelled}, copies(0, 6, 9))) == ["missing"]
    assert kinds(check(keyed, {0: cancelled}, [*stored, *copies(0)])) == ["duplicate"]
    swapped = copies(0, at=0.1) + copies(3, at=0.3) + copies(9, at=0.4) + copies(6, at=0.5)
    assert kinds(check(keyed, {0: cancelled}, swapped)) == ["key-order"]
