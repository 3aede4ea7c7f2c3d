"""The invariant: what the entity must hold, given what each producer was told.

For every business id, from the producers' journals:

- confirmed (some send of it returned ``sent`` or ``duplicate``): present exactly once;
- in doubt and never confirmed (``InDoubtError``, or in a call in flight at a
  SIGKILL that was not confirmed later): present at most once;
- only ever failed with ``PermanentSendError`` ("nothing was stored"): absent;
- never sent by anyone: absent.

Every stored copy carries the one body of its id. A topic's subscriptions each
hold exactly the topic's accepted messages.

Producers with overlapping ids are independent senders: the broker deduplicates
their copies only inside its window. Several copies of one id are therefore
excused (and counted as ``window_expired_duplicates``) only when the broker
enqueued each a full window after the previous one, each while a different
producer was sending the id: nothing the SDK promises covers that case. Copies
from one producer never are.

Each send call's report must account for every message of the call exactly
once, a sequence number it reports must be the stored copy's, and
``duplicate`` must never be reported for the first send of an id only one
producer sends (no earlier copy can exist).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .producer import body, id_number, message_id


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def check(
    schedule: dict[str, Any],
    journals: dict[int, list[dict[str, Any]]],
    stored: list[tuple[str, bytes, float]],
    by_subscription: dict[str, list[str]] | None = None,
    incarnation_ends: dict[tuple[int, int], float] | None = None,
    *,
    sequences: dict[str, set[int]] | None = None,
) -> Verdict:
    """Compare the final entity contents with the producers' journals."""
    verdict = Verdict()
    bad = verdict.violations
    window = schedule["entity"]["window_s"]
    if schedule["entity"].get("id_cache_size"):
        window = None

    owners: dict[int, set[int]] = defaultdict(set)
    for p, spec in enumerate(schedule["producers"]):
        for n in spec["ids"]:
            owners[n].add(p)

    confirmed: set[int] = set()
    doubt: set[int] = set()
    permanent: set[int] = set()
    attempted: set[int] = set()
    expired: set[int] = set()
    # when each producer may have put a copy of an id into the broker: its calls' spans
    spans: dict[int, list[tuple[int, float, float]]] = defaultdict(list)
    ends = incarnation_ends or {}
    for p, events in journals.items():
        attempts = {e["call"]: e for e in events if e["ev"] == "attempt"}
        done_calls = set()
        first_attempt: dict[int, str] = {}
        for e in events:
            if e["ev"] == "attempt":
                attempted.update(e["ids"])
                for n in e["ids"]:
                    first_attempt.setdefault(n, e["call"])
            elif e["ev"] == "expired":
                doubt.update(e["ids"])
                expired.update(e["ids"])
            elif e["ev"] == "done":
                done_calls.add(e["call"])
                _check_accounting(p, attempts.get(e["call"]), e, bad)
                confirmed.update(e["sent"], e["duplicate"])
                if sequences is not None:
                    _check_sequences(p, e, sequences, bad, schedule.get("scheduled_every", 0))
                doubt.update(e["in_doubt"])
                permanent.update(e["permanent"])
                for n in e["duplicate"]:
                    if len(owners[n]) == 1 and first_attempt.get(n) == e["call"]:
                        bad.append(
                            f"sdk-contract: producer {p} call {e['call']} reported "
                            f"{message_id(n)} as 'duplicate' on its first send, but no other "
                            "producer sends it: no earlier copy could exist"
                        )
        # an attempt never settled by a done, a resume or an expiry stays in doubt
        done_at = {e["call"]: e["t"] for e in events if e["ev"] == "done"}
        for call, e in attempts.items():
            if call not in done_calls:
                doubt.update(e["ids"])  # in flight at a SIGKILL: it may have stored them
            end = done_at.get(call, ends.get((p, int(call.split(".")[0])), float("inf")))
            for n in e["ids"]:
                spans[n].append((p, e["t"], end))

    copies: Counter[int] = Counter()
    enqueued: dict[int, list[float]] = defaultdict(list)
    for mid, data, when in stored:
        try:
            n = id_number(mid)
        except (ValueError, IndexError):
            bad.append(f"phantom: stored message id {mid!r} is not a business id")
            continue
        copies[n] += 1
        enqueued[n].append(when)
        if data != body(n).encode():
            bad.append(f"body: {mid} stored with body {data[:80]!r}, not its own")

    excused = 0
    for n in sorted(set(copies) | set(owners) | attempted):
        count = copies[n]
        mid = message_id(n)
        if n not in owners and count:
            bad.append(f"phantom: {mid} is stored {count}x but no producer owns it")
            continue
        if count > 1:
            times = sorted(enqueued[n])
            gap = times[-1] - times[0]
            if window is not None and _apart(spans[n], times, window):
                excused += 1
                continue
            bad.append(
                f"duplicate: {mid} stored {count}x (enqueued {gap:.2f}s apart, window "
                f"{window}s; producers {sorted(owners[n])}; confirmed={n in confirmed} "
                f"in_doubt={n in doubt} permanent={n in permanent})"
            )
        elif n in confirmed:
            if count != 1:
                bad.append(f"missing: {mid} was confirmed to a producer but is not stored")
        elif n in doubt:
            pass  # at most once: checked above
        elif n in permanent:
            if count:
                bad.append(
                    f"permanent-but-stored: {mid} only ever failed with PermanentSendError "
                    "('nothing was stored'), yet the broker holds it"
                )
        elif count:
            bad.append(f"phantom: {mid} is stored but no producer ever sent it")
        elif n in owners and n not in attempted:
            bad.append(f"unsent: {mid} belongs to producers {sorted(owners[n])} but none sent it")

    if by_subscription:
        topic = Counter(by_subscription.get("(topic)", []))
        for name, ids in by_subscription.items():
            if Counter(ids) != topic:
                bad.append(f"fan-out: subscription {name!r} does not hold the topic's messages")

    ordered = _check_key_order(schedule, journals, stored, copies, bad, sequences)

    verdict.stats = {
        "ordered_keys": ordered,
        "ids": len(owners),
        "stored": sum(copies.values()),
        "confirmed": len(confirmed),
        "in_doubt_unconfirmed": len(doubt - confirmed),
        "in_doubt_present": sum(1 for n in doubt - confirmed if copies[n]),
        "expired_resends": len(expired),
        "permanent_unconfirmed": len(permanent - confirmed - doubt),
        "window_expired_duplicates": excused,
        # calls whose task the producer cancelled (then resumed, or re-run by a restart)
        "cancelled_calls": sum(
            1
            for events in journals.values()
            for e in events
            if e["ev"] == "interrupted" and e.get("how") == "cancel"
        ),
    }
    return verdict


def _key_of(n: int, entity: dict[str, Any]) -> str | None:
    """The key a message keeps its order by (session, else partition key), as the producer
    builds it (``producer.message``)."""
    if entity.get("sessions"):
        return f"s{n % 3}"
    if entity.get("partitioned") and entity.get("explicit_pk"):
        return f"pk{n % 5}"
    return None


def _check_key_order(
    schedule: dict[str, Any],
    journals: dict[int, list[dict[str, Any]]],
    stored: list[tuple[str, bytes, float]],
    copies: Counter[int],
    bad: list[str],
    sequences: dict[str, set[int]] | None = None,
) -> int:
    """Within one call, the ids it reported ``sent`` that share a key are stored in the
    order of the call's input (transfers of one key never overlap and start in order).

    Ids stored more than once are left out (their position is ambiguous). Returns how
    many (call, key) sequences of two or more ids were checked.
    """
    entity = schedule["entity"]
    if _key_of(0, entity) is None:
        return 0
    # The broker's order: sequence numbers where known, else enqueue times (ties allowed).
    # Not the listing's order: a session entity is listed session by session.
    position: dict[int, float] = {}
    for mid, _data, when in stored:
        try:
            n = id_number(mid)
        except (ValueError, IndexError):
            continue
        held = sequences.get(mid) if sequences is not None else None
        position.setdefault(n, float(min(held)) if held else when)
    owners: Counter[int] = Counter(n for spec in schedule["producers"] for n in set(spec["ids"]))
    checked = 0
    for p, events in journals.items():
        order = {e["call"]: e["ids"] for e in events if e["ev"] == "attempt"}
        # A copy is this call's own only if no one sent the id before: one producer owns it
        # and this is its first attempt (a "sent" after an in-doubt attempt may otherwise
        # be an earlier copy, stored at another time).
        first_call: dict[int, str] = {}
        for e in events:
            if e["ev"] == "attempt":
                for n in e["ids"]:
                    first_call.setdefault(n, e["call"])
        for e in events:
            if e["ev"] != "done" or e["call"] not in order:
                continue
            sent = set(e["sent"])
            lanes: dict[str, list[int]] = defaultdict(list)
            every = schedule.get("scheduled_every", 0)
            for n in order[e["call"]]:
                if every and n % every == 0:
                    continue  # scheduled: stored for later, after the call's other messages
                key = _key_of(n, entity)
                own = owners[n] == 1 and first_call.get(n) == e["call"]
                if own and n in sent and key is not None and copies[n] == 1 and n in position:
                    lanes[key].append(n)
            for key, ids in lanes.items():
                if len(ids) < 2:
                    continue
                checked += 1
                where = [position[n] for n in ids]
                if where != sorted(where):
                    bad.append(
                        f"key-order: producer {p} call {e['call']} sent key {key!r} as "
                        f"{[message_id(n) for n in ids][:8]}, stored in another order"
                    )
    return checked


def _apart(spans: list[tuple[int, float, float]], times: list[float], window: float) -> bool:
    """Whether the copies are each a window after the last, from distinct producers' sends.

    The broker accepts a copy only once the previous accepted one is a window
    old; each copy must be explained by a different producer that was sending
    the id at that moment (one producer's copies are never excused).
    """
    if any(b - a < window for a, b in itertools.pairwise(times)):
        return False
    slack = 0.001  # enqueue times are stored to the microsecond
    senders = [{p for p, start, end in spans if start - slack <= t <= end + slack} for t in times]
    producers = sorted({p for p, _, _ in spans})
    return any(
        all(p in senders[i] for i, p in enumerate(choice))
        for choice in itertools.permutations(producers, len(times))
    )


def _check_sequences(
    p: int, done: dict[str, Any], sequences: dict[str, set[int]], bad: list[str], every: int
) -> None:
    """A sequence number the sender reported is the one of a copy the broker holds.

    Except for scheduled ids: Service Bus returns a number for a scheduled copy it drops
    as a duplicate (Azure/azure-service-bus#265), which names no stored copy.
    """
    for n, seq in done.get("seq", []):
        if every and n % every == 0:
            continue
        held = sequences.get(message_id(n), set())
        if held and seq not in held:
            bad.append(
                f"sequence: producer {p} call {done['call']} was told {message_id(n)} has "
                f"sequence number {seq}, but the stored copies have {sorted(held)}"
            )


def _check_accounting(
    p: int, attempt: dict[str, Any] | None, done: dict[str, Any], bad: list[str]
) -> None:
    """A send call's report names each of its messages exactly once."""
    if attempt is None:
        bad.append(f"journal: producer {p} call {done['call']} finished without an attempt")
        return
    reported = done["sent"] + done["duplicate"] + done["in_doubt"] + done["permanent"]
    reported += [n for n, _ in done["other"]]
    if Counter(reported) != Counter(attempt["ids"]):
        bad.append(
            f"report: producer {p} call {done['call']} accounted for {sorted(reported)[:10]}... "
            f"({len(reported)}), not its {len(attempt['ids'])} messages"
        )
    for n, error in done["other"]:
        bad.append(
            f"report: producer {p} call {done['call']}: {message_id(n)} failed with "
            f"an unexpected error {error}"
        )
