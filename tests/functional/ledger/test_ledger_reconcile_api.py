"""``Ledger.reconcile(backend, entity)`` and ``Ledger.keys_in_doubt(entity, rule)``: the
library API that ``sendonce ledger reconcile`` / ``in-doubt`` call.

Keys are left unconfirmed the way a real run leaves them: a sender with a ledger whose only
attempt failed in doubt (one after the broker stored the message, one before), against a
real local broker file and a real SQLite ledger.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sendonce import EntityProfile, IdempotentSender, InDoubtError, Message, RetryPolicy
from sendonce.backends.local import LocalBackend
from sendonce.errors import ConfigurationError
from sendonce.ledger import InDoubtRule, Ledger, Reconciliation
from sendonce.testing import Fault, FaultyBackend

ORDERS = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=10))
ONE_TRY = RetryPolicy(max_attempts=1, sleep=lambda _s: None)


def _leave_in_doubt(broker: LocalBackend, ledger: Ledger) -> None:
    """``held``: stored, ack lost; ``never``: lost before the broker stored it."""
    faulty = FaultyBackend(broker, [Fault.AFTER_COMMIT, Fault.BEFORE_COMMIT])
    with IdempotentSender(faulty, ORDERS, ledger=ledger, retry=ONE_TRY) as sender:
        for mid in ("held", "never"):
            with pytest.raises(InDoubtError):
                sender.send(Message(f"body {mid}", message_id=mid))


@pytest.fixture
def broker(tmp_path: Path) -> LocalBackend:
    backend = LocalBackend(tmp_path / "broker.db")
    backend.create_entity(ORDERS)
    return backend


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")


def test_reconcile_compares_and_records_only_when_asked(
    broker: LocalBackend, ledger: Ledger
) -> None:
    with broker, ledger:
        _leave_in_doubt(broker, ledger)
        assert broker.message_ids("orders") == ["held"]
        found = ledger.reconcile(broker, "orders", min_age=timedelta(0))
        assert isinstance(found, Reconciliation)
        assert found.rule == InDoubtRule("window", window=timedelta(minutes=10))
        [held] = found.keys("held")
        [never] = found.keys("not_stored")  # inside the window: the broker would remember it
        assert (held.message_id, never.message_id) == ("held", "never")
        assert (found.to_confirm, found.to_release, found.too_young) == ((held,), (never,), ())
        assert not found.applied and found.left == 2
        assert found.cannot_tell  # says what even the local broker cannot show
        # Nothing was recorded: both keys are still unconfirmed.
        assert len(ledger.keys_in_doubt("orders", InDoubtRule("none"))) == 2

        done = ledger.reconcile(broker, "orders", apply=True, min_age=timedelta(0))
        assert done.applied and done.left == 0
        assert ledger.keys_in_doubt("orders", InDoubtRule("none")) == []
        # The next run skips the confirmed key and sends the released one, once.
        with IdempotentSender(broker, ORDERS, ledger=ledger) as sender:
            report = sender.send_many(
                [Message("body held", message_id="held"), Message("body never", message_id="never")]
            )
        assert report.failed == 0
        assert sorted(broker.message_ids("orders")) == ["held", "never"]


def test_a_key_younger_than_min_age_is_not_released(broker: LocalBackend, ledger: Ledger) -> None:
    with broker, ledger:
        _leave_in_doubt(broker, ledger)
        found = ledger.reconcile(broker, "orders", apply=True)  # the default guard: 160 s
        assert [k.message_id for k in found.to_confirm] == ["held"]
        assert found.to_release == ()
        assert [k.message_id for k in found.too_young] == ["never"]
        assert found.left == 1
        [left] = ledger.keys_in_doubt("orders", InDoubtRule("none"))
        assert left.key.message_id == "never"


def test_a_local_url_is_read_without_creating_anything(
    broker: LocalBackend, ledger: Ledger, tmp_path: Path
) -> None:
    with broker, ledger:
        _leave_in_doubt(broker, ledger)
    with Ledger(ledger.url) as ledger:
        found = ledger.reconcile(f"local:{tmp_path / 'broker.db'}", "orders", min_age=timedelta(0))
        assert [k.message_id for k in found.to_confirm] == ["held"]
        missing = tmp_path / "typo.db"
        with pytest.raises(ConfigurationError, match="no broker file") as no_file:
            ledger.reconcile(f"local:{missing}", "orders")
        assert no_file.value.field == "broker"
        assert not missing.exists()


def test_brokers_and_options_it_cannot_use_are_refused_naming_the_field(
    broker: LocalBackend, ledger: Ledger
) -> None:
    with broker, ledger:
        _leave_in_doubt(broker, ledger)
        cases: list[tuple[dict[str, object], str]] = [
            ({"backend": "amqp://user:s3cret@localhost:5672"}, "broker"),
            ({"backend": object()}, "broker"),
            ({"backend": broker, "subscriptions": ["audit"]}, "subscriptions"),
            ({"backend": broker, "release_absent": True}, "apply"),
        ]
        for options, field in cases:
            with pytest.raises(ConfigurationError) as refused:
                ledger.reconcile(entity="orders", **options)  # type: ignore[arg-type]
            assert refused.value.field == field
            assert "s3cret" not in str(refused.value)
        assert len(ledger.keys_in_doubt("orders", InDoubtRule("none"))) == 2  # nothing recorded


def test_keys_in_doubt_follow_the_entitys_rule(tmp_path: Path, broker: LocalBackend) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with broker, Ledger(url) as ledger:
        _leave_in_doubt(broker, ledger)
        # Inside the window a re-run resends them and the broker drops a copy: not in doubt.
        assert ledger.keys_in_doubt("orders", ORDERS) == []
        assert ledger.keys_in_doubt("orders", InDoubtRule.of(ORDERS)) == []
        # Without duplicate detection, or remembering ids by count: every one at once.
        for rule in (
            InDoubtRule.of(EntityProfile("orders", duplicate_detection=False)),
            InDoubtRule.of(EntityProfile("orders", id_cache_size=100)),
            InDoubtRule(None),
        ):
            assert len(ledger.keys_in_doubt("orders", rule)) == 2, rule
        assert len(ledger.keys_in_doubt("orders", InDoubtRule("none"), limit=1)) == 1
    later = datetime.now(UTC) + timedelta(minutes=11)
    with Ledger(url, clock=lambda: later) as ledger:  # past the window: in doubt
        in_doubt = ledger.keys_in_doubt("orders", ORDERS)
        assert sorted(k.key.message_id for k in in_doubt) == ["held", "never"]


def test_the_rule_says_when_a_key_is_in_doubt() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    window = InDoubtRule("window", window=timedelta(minutes=10))
    assert window.cutoff(now) == now - timedelta(minutes=10) + timedelta(seconds=5)
    assert not window.in_doubt(now - timedelta(minutes=9), now)
    assert window.in_doubt(now - timedelta(minutes=11), now)
    assert InDoubtRule("none").cutoff(now) is None
    assert InDoubtRule("none").in_doubt(now, now)
    assert InDoubtRule.of(EntityProfile("q", id_cache_size=5)) == InDoubtRule(
        "id_cache", id_cache_size=5
    )
    assert InDoubtRule.of(ORDERS) == window
