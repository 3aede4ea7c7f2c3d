"""The ledger at the edges a user meets first: where its file lives, one file in two roles,
resolving an in-doubt key by hand, the retention rule, and what an in-doubt key says.

Real SQLite files (and a real broker file) throughout.
"""

from __future__ import annotations

import pickle
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from ledger_helpers import T0, WINDOW, Clock, msg

from sendonce import ConfigurationError, EntityProfile, IdempotentSender, Ledger, RetryPolicy
from sendonce.backends import LocalBackend
from sendonce.ledger import Confirmation, Key, LedgerOptions, body_digest

NO_DEDUP = EntityProfile("orders", duplicate_detection=False)


def on_broker(broker: LocalBackend) -> Counter[str]:
    return Counter(m.message_id for m in broker.receive("orders", max_messages=10_000))


# -- where the file lives ------------------------------------------------------------------


def test_a_ledger_in_a_missing_directory_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(ConfigurationError) as info:
        Ledger(f"sqlite://{missing / 'ledger.db'}")
    assert info.value.field == "ledger"
    assert str(missing) in str(info.value) and "does not exist" in str(info.value)
    assert not missing.exists()  # nothing created on the way
    with LocalBackend(tmp_path / "broker.db") as broker, pytest.raises(ConfigurationError):
        IdempotentSender(broker, "orders", ledger=f"sqlite://{missing / 'ledger.db'}")


def test_a_relative_ledger_url_is_kept_as_an_absolute_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What another process (a Spark executor) opens is the same file, wherever it runs."""
    monkeypatch.chdir(tmp_path)
    with Ledger("sqlite:ledger.db") as ledger:
        assert ledger.url == f"sqlite://{tmp_path / 'ledger.db'}"
    assert (tmp_path / "ledger.db").exists()


# -- one file, two roles ------------------------------------------------------------------


def test_a_broker_file_open_in_this_process_is_refused_as_a_ledger(
    tmp_path: Path, retry: RetryPolicy
) -> None:
    path = tmp_path / "shared.db"
    with LocalBackend(path) as broker:
        with pytest.raises(ConfigurationError) as info:
            Ledger(f"sqlite://{path}")
        assert info.value.field == "ledger" and "open in this process as a broker" in str(
            info.value
        )
        # the broker is untouched by the refusal
        with IdempotentSender(broker, EntityProfile("orders"), retry=retry) as sender:
            assert sender.send_many([msg(i) for i in range(3)]).sent == 3
        assert on_broker(broker) == Counter(f"order-{i}" for i in range(3))


def test_a_ledger_file_open_in_this_process_is_refused_as_a_broker(
    tmp_path: Path, retry: RetryPolicy
) -> None:
    path = tmp_path / "shared.db"
    with Ledger(f"sqlite://{path}") as ledger:
        with pytest.raises(ConfigurationError) as info:
            LocalBackend(path)
        assert info.value.field == "path" and "open in this process as a ledger" in str(info.value)
        # the ledger is untouched by the refusal and still records sends
        with (
            LocalBackend(tmp_path / "broker.db") as broker,
            IdempotentSender(broker, EntityProfile("orders"), retry=retry, ledger=ledger) as s,
        ):
            assert s.send_many([msg(i) for i in range(3)]).sent == 3
            assert s.send_many([msg(i) for i in range(3)]).from_ledger == [
                "order-0",
                "order-1",
                "order-2",
            ]
            assert on_broker(broker) == Counter(f"order-{i}" for i in range(3))


# -- resolving in-doubt keys by hand --------------------------------------------------------


def _left_by_a_dead_producer(ledger: Ledger, *numbers: int) -> None:
    """Intents of a producer killed between its sends and their confirmation, an hour ago."""
    messages = [msg(i) for i in numbers]
    ledger.store.record_intents(
        "orders",
        [Key(m.message_id, "") for m in messages],
        [body_digest(m) for m in messages],
        first_attempt=T0 - timedelta(hours=1),
        owner="dead",
    )


def test_in_doubt_keys_are_resolved_by_hand_with_none_for_no_partition_key(
    tmp_path: Path, broker: LocalBackend, clock: Clock, retry: RetryPolicy
) -> None:
    """order-3 did reach the broker before the crash, order-4 did not: confirm one, release
    the other, and the re-run sends exactly what is missing."""
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}", clock=clock) as ledger:
        with IdempotentSender(broker, NO_DEDUP, retry=retry, ledger=ledger) as sender:
            _left_by_a_dead_producer(ledger, 3, 4)
            with IdempotentSender(broker, NO_DEDUP, require_duplicate_detection=False) as raw:
                raw.send(msg(3))  # what the dead producer did deliver
            first = sender.send_many([msg(i) for i in range(5)])
            assert first.sent == 3 and sorted(first.in_doubt) == ["order-3", "order-4"]

            ledger.confirm("orders", {Key("order-3", None): "sent"})  # type: ignore[arg-type]
            rows = ledger.lookup("orders", ["order-4"])
            assert list(rows) == [Key("order-4", "")] and rows[Key("order-4", "")].owner == "dead"
            ledger.release("orders", ["order-4"], rows[Key("order-4", "")].owner)

            again = sender.send_many([msg(i) for i in range(5)])
        assert (again.sent, again.failed) == (1, 0)
        assert sorted(again.from_ledger) == ["order-0", "order-1", "order-2", "order-3"]
        assert on_broker(broker) == Counter(f"order-{i}" for i in range(5))


def test_a_confirmed_key_is_never_released(tmp_path: Path, clock: Clock) -> None:
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}", clock=clock) as ledger:
        _left_by_a_dead_producer(ledger, 1)
        ledger.store.confirm("orders", Confirmation(("dead",), {}), T0)  # the whole transfer
        ledger.release("orders", ["order-1"], "dead")
        assert ledger.lookup("orders", ["order-1"])[Key("order-1", "")].outcome == "sent"


@pytest.mark.parametrize(
    ("confirmation", "field"),
    [
        ({Key("order-1", None): "delivered"}, "outcome"),  # type: ignore[arg-type]
        ({("order-1", 5): "sent"}, "key"),
        ({"": "sent"}, "key"),
        ({42: "sent"}, "key"),
    ],
)
def test_a_bad_hand_resolution_names_the_field_and_writes_nothing(
    tmp_path: Path, confirmation: dict[object, str], field: str
) -> None:
    with Ledger(f"sqlite://{tmp_path / 'ledger.db'}") as ledger:
        _left_by_a_dead_producer(ledger, 1)
        with pytest.raises(ConfigurationError) as info:
            ledger.confirm("orders", confirmation)  # type: ignore[arg-type]
        assert info.value.field == field
        assert ledger.lookup("orders", ["order-1"])[Key("order-1", "")].confirmed_at is None


# -- the retention rule ------------------------------------------------------------------------


def test_retention_is_checked_against_the_window_the_broker_keeps(tmp_path: Path) -> None:
    with Ledger(f"sqlite://{tmp_path / 'l.db'}", retention=timedelta(minutes=5)) as ledger:
        ledger.check_entity(NO_DEDUP)  # remembers nothing: any retention outlives it
        ledger.check_entity(EntityProfile("artemis", id_cache_size=100))  # count-bounded
        with pytest.raises(ConfigurationError) as info:
            ledger.check_entity(EntityProfile("orders", duplicate_detection_window=WINDOW))
        assert info.value.field == "retention" and "0:10:00" in str(info.value)


# -- what an in-doubt key says ----------------------------------------------------------------


def test_an_intent_another_live_producer_holds_is_not_called_a_stopped_sender(
    tmp_path: Path, clock: Clock
) -> None:
    """Two producers on one ledger, no duplicate detection: the second meets the first's
    intent while the first is still sending, then (much later) after it died unconfirmed."""
    url = f"sqlite://{tmp_path / 'ledger.db'}"
    keys, batch = [Key("order-1", "")], [msg(1)]
    margin = timedelta(seconds=5)
    with Ledger(url, clock=clock) as first, Ledger(url, clock=clock) as second:
        sending = first.prepare("orders", batch, keys, window=timedelta(0), margin=margin)
        assert sending.send == [0]  # the first producer's send (of batch[0]) is now in flight
        clock.now += timedelta(seconds=2)
        met = second.prepare("orders", batch, keys, window=timedelta(0), margin=margin)
        [(index, row)] = met.in_doubt
        message = batch[index]
        live = second.in_doubt_message(message.message_id, row, window=timedelta(0))
        assert "another producer wrote its intent 2.0s ago" in live
        assert "may still be sending" in live and "stopped" not in live

        # With a window, a key is in doubt only past its producer's own deadline: not live.
        assert "stopped" in second.in_doubt_message(message.message_id, row, window=WINDOW)

        clock.now += timedelta(hours=1)  # the first producer never confirmed: it died
        met = second.prepare("orders", batch, keys, window=timedelta(0), margin=margin)
        [(index, row)] = met.in_doubt
        stale = second.in_doubt_message(message.message_id, row, window=WINDOW)
        assert "stopped before the ack was recorded" in stale
        assert "window (0:10:00) has passed" in stale and "may still be sending" not in stale


# -- a ledger's choices, whole ----------------------------------------------------------------


def test_a_ledgers_options_travel_whole_and_reopen_the_same_ledger(tmp_path: Path) -> None:
    chosen = Ledger(
        f"sqlite://{tmp_path / 'l.db'}",
        in_doubt="resend",
        retention=timedelta(days=2),
        prune_limit=7,
        prune_interval=timedelta(minutes=3),
    )
    with chosen:
        options = pickle.loads(pickle.dumps(chosen.options))
        assert options == LedgerOptions("resend", timedelta(days=2), 7, timedelta(minutes=3))
        with options.open(chosen.url) as reopened:
            assert reopened.options == chosen.options and reopened.url == chosen.url


# -- the same rules through the sender ---------------------------------------------------------


def test_a_sender_on_an_entity_without_dedup_accepts_a_short_retention(
    tmp_path: Path, broker: LocalBackend, clock: Clock
) -> None:
    """The entity's unused default window (10 min) puts no bound on the retention."""
    url = f"sqlite://{tmp_path / 'ledger.db'}"
    with (
        Ledger(url, retention=timedelta(minutes=5), clock=clock) as ledger,
        IdempotentSender(broker, NO_DEDUP, ledger=ledger) as sender,
    ):
        assert sender.send_many([msg(1), msg(2)]).sent == 2
    assert on_broker(broker) == Counter({"order-1": 1, "order-2": 1})


def test_the_sender_says_another_live_producer_holds_the_intent(
    tmp_path: Path, broker: LocalBackend, clock: Clock
) -> None:
    url = f"sqlite://{tmp_path / 'ledger.db'}"
    with Ledger(url, clock=clock) as first, Ledger(url, clock=clock) as second:
        first.prepare(
            "orders",
            [msg(1)],
            [Key("order-1", "")],
            window=timedelta(0),
            margin=timedelta(seconds=5),
        )  # the first producer's send of order-1 is in flight
        clock.now += timedelta(seconds=2)
        with IdempotentSender(broker, NO_DEDUP, ledger=second) as sender:
            report = sender.send_many([msg(1), msg(2)])
    assert report.sent == 1 and [f.message_id for f in report.failures] == ["order-1"]
    text = str(report.failures[0].error)
    assert "another producer wrote its intent 2.0s ago" in text and "stopped" not in text
    assert on_broker(broker) == Counter({"order-2": 1})  # order-1 is the first producer's
