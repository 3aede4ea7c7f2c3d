"""The ledger's run object (``sendonce.ledger._run``) on a real SQLite file and a real
PostgreSQL database, and the write-ahead protocol's old public spellings on ``Ledger``.

A run is driven here the way a sender drives it (a worker thread for the writes, the
transfers' outcomes handed back one by one), then stopped midway: what it leaves in the
store is what docs/ledger.md says a call leaves: acknowledged transfers confirmed, intents
of transfers never attempted released, nothing else.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from sendonce import EntityProfile, Message
from sendonce._report import Part, SendReport
from sendonce._retry import Attempted
from sendonce.backends._base import Ack
from sendonce.errors import SendError
from sendonce.ledger import Key, Ledger, Prepared
from sendonce.ledger._run import LedgerLayer, LedgerRun, WriteAhead

MARGIN = timedelta(seconds=5)


def batch(prefix: str, n: int) -> list[Message]:
    return [Message(f"body {prefix}{i}", message_id=f"{prefix}{i}") for i in range(n)]


def acked(messages: list[Message]) -> list[Part]:
    return [Part(messages, Attempted([Ack("sent") for _ in messages], 1, False), None)]


def drive(
    ledger: Ledger, profile: EntityProfile, transfers: list[list[Message]], stop_after: int
) -> tuple[LedgerRun, SendReport]:
    """Run the protocol over ``transfers`` with up to 2 in flight, acknowledging the first
    ``stop_after`` of them, then stop as an interrupted call does."""
    layer = LedgerLayer(ledger, profile, MARGIN, lambda: 0.0)
    report = SendReport()
    failed: dict[object, SendError] = {}
    positions, at = [], 0
    for transfer in transfers:
        positions.append(list(range(at, at + len(transfer))))
        at += len(transfer)

    def fail(*args: Any) -> None:
        raise AssertionError(f"no write may fail here: {args!r}")

    run = LedgerRun(
        layer, transfers, positions, None, 2, report, failed, fail, lambda m: m.message_id
    )
    with ThreadPoolExecutor(1) as pool:
        ahead = WriteAhead(run, pool.submit, Future())
        ahead.launch()
        for index in range(stop_after):
            while (waiting := ahead.ready(index)) is not None:
                assert waiting is not ahead.room, "a transfer waited for room it had"
                waiting.result()
            sends, _start = run.to_send(index)
            assert list(sends) in ([], transfers[index])  # nothing: decided by the ledger
            released, _owner = run.done(index, acked(list(sends)) if sends else [])
            assert released == []
            ahead.after_transfer()
        if ahead.in_flight is not None:
            ahead.collect(then_next=False)
        pool.submit(int).result()
        releases, confirmation = ahead.closing()
    for keys, owner in releases:
        layer.release_quietly(keys, owner)
    if confirmation:
        layer.confirm_quietly(confirmation)
    return run, report


@pytest.mark.parametrize("dedup", [False, True], ids=["no-dedup", "window"])
def test_a_stopped_run_leaves_acknowledged_keys_confirmed_and_untried_ones_released(
    ledger_url: str, dedup: bool
) -> None:
    profile = EntityProfile("orders", duplicate_detection=dedup)
    transfers = [batch(f"t{t}-", 3) for t in range(6)]
    with Ledger(ledger_url) as ledger:
        run, report = drive(ledger, profile, transfers, stop_after=3)
        assert not report.failures and not run.reordered
        rows = ledger.lookup("orders", [m.message_id for t in transfers for m in t])
    sent = {Key(m.message_id) for t in transfers[:3] for m in t}
    assert set(rows) == sent, "untried transfers' intents must be released"
    assert all(rows[k].confirmed_at is not None for k in sent)


def test_a_re_run_reports_confirmed_keys_from_the_ledger_without_sending(
    ledger_url: str,
) -> None:
    profile = EntityProfile("orders", duplicate_detection=False)
    transfers = [batch(f"t{t}-", 2) for t in range(4)]
    with Ledger(ledger_url) as ledger:
        drive(ledger, profile, transfers, stop_after=4)
        run, report = drive(ledger, profile, transfers, stop_after=4)
    assert run.reordered and all(not run.to_send(i)[0] for i in range(4))
    assert sorted(report.from_ledger) == sorted(m.message_id for t in transfers for m in t)
    assert [r.outcome for r in report.results] == ["duplicate"] * 8


def test_an_intent_is_durable_before_its_transfer_may_start(ledger_url: str) -> None:
    profile = EntityProfile("orders", duplicate_detection=False)
    transfers = [batch("a", 2), batch("b", 2)]
    with Ledger(ledger_url) as ledger:
        layer = LedgerLayer(ledger, profile, MARGIN, lambda: 0.0)
        run = LedgerRun(
            layer,
            transfers,
            [[0, 1], [2, 3]],
            None,
            2,
            SendReport(),
            {},
            lambda *a: None,
            lambda m: m.message_id,
        )
        assert not run.ready(0)
        request = run.next_write()
        assert request is not None
        w, messages, keys, carried, staged = request
        assert not run.ready(0), "no transfer before its write returned"
        written = layer.intents(messages, keys, carried, staged)
        rows = ledger.lookup("orders", keys)
        assert set(rows) == set(keys) and all(r.confirmed_at is None for r in rows.values())
        run.written(w, messages, written)
        assert run.ready(0)


# -- the protocol's old public spellings -----------------------------------------------


def test_prepare_still_works_with_a_deprecation_warning(ledger_url: str) -> None:
    messages = batch("p", 2)
    with Ledger(ledger_url) as ledger:
        with pytest.warns(DeprecationWarning, match=r"Ledger\.prepare is deprecated") as caught:
            prepared = ledger.prepare(
                "orders", messages, [Key("p0"), Key("p1")], window=timedelta(0), margin=MARGIN
            )
        assert caught[0].filename == __file__, "the warning names the caller's line"
        assert isinstance(prepared, Prepared) and prepared.send == [0, 1]
        assert set(ledger.lookup("orders", ["p0", "p1"])) == {Key("p0"), Key("p1")}


def test_new_owner_still_works_with_a_deprecation_warning(ledger_url: str) -> None:
    with Ledger(ledger_url) as ledger:
        with pytest.warns(DeprecationWarning, match=r"Ledger\.new_owner is deprecated"):
            owner = ledger.new_owner()
    assert len(owner) == 16 and int(owner, 16) >= 0


def test_stages_still_works_with_a_deprecation_warning(ledger_url: str) -> None:
    with Ledger(ledger_url) as ledger:
        with pytest.warns(DeprecationWarning, match=r"Ledger\.stages is deprecated"):
            stages = ledger.stages
        assert stages is ledger._stages
    assert stages is True  # both built-in stores stage intents written ahead


def test_arm_still_works_with_a_deprecation_warning(ledger_url: str) -> None:
    messages = batch("s", 2)
    keys = [Key("s0"), Key("s1")]
    with Ledger(ledger_url) as ledger:
        staged = ledger._prepare(
            "orders", messages, keys, window=timedelta(0), margin=MARGIN, staged=True
        )
        with pytest.warns(DeprecationWarning, match=r"Ledger\.arm is deprecated"):
            assert ledger.arm("orders", staged.owner) is True


def test_the_sender_s_own_path_warns_nothing(ledger_url: str) -> None:
    transfers = [batch(f"q{t}-", 2) for t in range(3)]
    with Ledger(ledger_url) as ledger, warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        drive(ledger, EntityProfile("orders", duplicate_detection=False), transfers, 3)


# -- staged intents on either store ----------------------------------------------------


def _write(ledger: Ledger, messages: list[Message], *, staged: bool = False) -> Prepared:
    keys = [Key(m.message_id) for m in messages]
    return ledger._prepare(
        "audit", messages, keys, window=timedelta(0), margin=MARGIN, staged=staged
    )


def test_a_staged_intent_is_taken_over_and_its_stager_cannot_arm(ledger_url: str) -> None:
    """Writer A stages 3 intents and stops before arming: writer B takes 2 over (it sends
    them), A's arm fails; A's own re-write takes its third back, arms, and from then on the
    key is a plain intent, in doubt for anyone else."""
    messages = batch("order-", 3)
    with Ledger(ledger_url) as first, Ledger(ledger_url) as second:
        assert first._stages and second._stages
        staged = _write(first, messages, staged=True)
        assert staged.send == [0, 1, 2]
        assert {r.outcome for r in first.lookup("audit", staged.keys).values()} == {"staged"}
        taken = _write(second, messages[:2])
        assert taken.send == [0, 1] and not taken.in_doubt  # never sent by A: not in doubt
        assert not first._arm("audit", staged.owner)  # two of its intents are B's now
        rows = first.lookup("audit", staged.keys)
        assert {k.message_id for k, r in rows.items() if r.owner == taken.owner} == {
            "order-0",
            "order-1",
        }
        again = _write(first, messages[2:], staged=True)
        assert again.send == [0]  # A's own staged row of order-2 is taken back
        assert first._arm("audit", again.owner)
        late = _write(second, messages[2:])
        assert late.send == [] and len(late.in_doubt) == 1


def test_a_staged_intent_with_another_body_is_a_conflict_not_taken_over(
    ledger_url: str,
) -> None:
    messages = batch("order-", 2)
    others = [Message(f"another {m.body!s}", message_id=m.message_id) for m in messages]
    with Ledger(ledger_url) as first, Ledger(ledger_url) as second:
        staged = _write(first, messages, staged=True)
        met = _write(second, others)
        assert met.send == [] and len(met.conflicts) == 2
        assert first._arm("audit", staged.owner)  # nothing was taken


def test_staged_keys_are_neither_counted_nor_in_doubt(ledger_url: str) -> None:
    messages = batch("order-", 4)
    with Ledger(ledger_url) as ledger:
        _write(ledger, messages[:2], staged=True)
        plain = _write(ledger, messages[2:])
        rule = EntityProfile("audit", duplicate_detection=False)
        doubt = ledger.keys_in_doubt("audit", rule)
        assert sorted(u.key for u in doubt) == sorted(plain.keys)


# -- a kill -9 while a window is staged, on either store ---------------------------------


@pytest.mark.parametrize(("moment", "n", "doubt"), [("ledger-stage", 4, 5), ("buffer-full", 9, 5)])
def test_a_kill_with_a_window_staged_leaves_each_message_once(
    tmp_path: Any, ledger_url: str, moment: str, n: int, doubt: int
) -> None:
    """The streamed producer of ``test_ledger_streaming`` killed mid-call (its next window
    staged by then, on PostgreSQL too): the re-run stores each message once, and what it
    reports in doubt is at most the transfer in flight."""
    from test_ledger_streaming import check_rerun, produce, stored

    db = tmp_path / "broker.db"
    produce(db, ledger_url, moment, n)
    assert max(stored(db).values(), default=1) == 1
    check_rerun(db, ledger_url, doubt)


@pytest.mark.parametrize("partitioned", [False, True])
def test_the_ledger_keys_are_the_brokers_keys(tmp_path: Any, partitioned: bool) -> None:
    """Read in C where every message has its own partition key, through ``dedup_key``
    where a session id or the message id stands in: the same keys either way."""
    from sendonce._message import MessageFactory
    from sendonce._message_columns import MessageColumns

    profile = EntityProfile("orders", partitioned=partitioned)
    own = [Message("b", message_id=f"m-{i}", partition_key=f"k{i % 3}") for i in range(6)]
    standing_in = [
        Message("b", message_id="s-1", session_id="sess"),
        Message("b", message_id="s-2"),
        Message("b", message_id="s-3", partition_key="k"),
    ]
    columns = MessageColumns.of(
        MessageFactory(), [b"b"] * 4, [f"c-{i}" for i in range(4)], ["p", "q", "p", "r"]
    )
    plain_columns = MessageColumns.of(MessageFactory(), [b"b"] * 2, ["d-1", "d-2"])
    assert columns is not None and plain_columns is not None
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}") as ledger:
        layer = LedgerLayer(ledger, profile, MARGIN, lambda: 0.0)
        for batch in (own, standing_in, columns, plain_columns, columns[1:3]):
            expected = [(mid, pk or "") for mid, pk in map(profile.dedup_key, batch)]
            assert layer.keys(batch) == expected
