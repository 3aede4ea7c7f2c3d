"""``sendonce broker create`` / ``create-subscription``: lock duration, max delivery count,
default time to live and dead-lettering on expiry, for queues and subscriptions."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sendonce import Message, SubscriptionProfile
from sendonce.backends.local import LocalBackend
from sendonce.cli import main


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "broker.db")


def test_a_queue_gets_its_receive_settings_from_the_options(db: str) -> None:
    result = run(
        "broker", "create", db, "--entity", "orders", "--lock-duration", "30s",
        "--max-delivery-count", "5", "--default-ttl", "1h", "--dead-letter-on-expiry",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with LocalBackend(db) as backend:
        profile = backend.describe("orders")
    assert profile.lock_duration == timedelta(seconds=30)
    assert profile.max_delivery_count == 5
    assert profile.default_message_time_to_live == timedelta(hours=1)
    assert profile.dead_lettering_on_message_expiration is True
    shown = run("broker", "stats", db)
    assert (
        "orders (queue, window 10m, lock 30s, max deliveries 5, ttl 1h, dead-letter on expiry)"
        in (shown.output)
    )
    settings = json.loads(run("broker", "stats", db, "--json").output)["entities"]["orders"][
        "settings"
    ]
    assert settings["lock_duration_seconds"] == 30
    assert settings["max_delivery_count"] == 5
    assert settings["default_ttl_seconds"] == 3600
    assert settings["dead_letter_on_expiry"] is True


def test_subscriptions_take_the_topic_s_settings_or_their_own(db: str) -> None:
    result = run(
        "broker", "create", db, "--entity", "events", "--topic", "--subscription", "billing",
        "--max-delivery-count", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    result = run(
        "broker", "create-subscription", db, "--entity", "EVENTS", "--subscription", "audit",
        "--sessions", "--lock-duration", "10s", "--default-ttl", "2m",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "subscription 'audit' of topic 'events' created" in result.output
    with LocalBackend(db) as backend:
        assert backend.subscription_profiles("events") == [
            SubscriptionProfile(
                "audit",
                sessions=True,
                lock_duration=timedelta(seconds=10),
                max_delivery_count=3,
                default_message_time_to_live=timedelta(minutes=2),
            ),
            SubscriptionProfile("billing", max_delivery_count=3),
        ]
    listed = json.loads(run("broker", "stats", db, "--json").output)["entities"]["events"][
        "subscriptions"
    ]
    assert listed["audit"] == {
        "sessions": True,
        "lock_duration_seconds": 10,
        "max_delivery_count": 3,
        "default_ttl_seconds": 120,
        "dead_letter_on_expiry": False,
    }
    text = run("broker", "stats", db).output
    assert "subscription audit (sessions, lock 10s, max deliveries 3, ttl 2m)" in text


def test_an_existing_subscription_with_other_settings_is_refused_naming_the_option(
    db: str,
) -> None:
    run("broker", "create", db, "--entity", "events", "--topic")
    run("broker", "create-subscription", db, "--entity", "events", "--subscription", "audit")
    same = run(
        "broker", "create-subscription", db, "--entity", "events", "--subscription", "AUDIT",
        "--exist-ok",
    )  # fmt: skip
    assert same.exit_code == 0 and "already exists with these settings" in same.output
    other = run(
        "broker", "create-subscription", db, "--entity", "events", "--subscription", "audit",
        "--exist-ok", "--max-delivery-count", "4",
    )  # fmt: skip
    assert other.exit_code == 2
    assert "has max-delivery-count 10, but the options ask for 4" in other.output
    again = run(
        "broker", "create-subscription", db, "--entity", "events", "--subscription", "audit"
    )
    assert again.exit_code == 2 and "already has subscription 'audit'" in again.output


@pytest.mark.parametrize(
    ("args", "option", "words"),
    [
        (
            ("--lock-duration", "10m"),
            "--lock-duration",
            "10m is outside the broker's range 1s to 5m",
        ),
        (("--lock-duration", "0"), "--lock-duration", "0s is outside the broker's range"),
        (("--default-ttl", "0"), "--default-ttl", "0s is not a positive duration"),
        (("--max-delivery-count", "0"), "--max-delivery-count", "0 is not in the range x>=1"),
        (("--lock-duration", "1 minute"), "--lock-duration", "is not a duration"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_option_and_leaves_no_file(
    db: str, args: tuple[str, ...], option: str, words: str
) -> None:
    result = run("broker", "create", db, "--entity", "orders", *args)
    assert result.exit_code == 2
    assert option in result.output and words in result.output
    assert not Path(db).exists()


def test_a_subscription_of_a_queue_is_refused(db: str) -> None:
    run("broker", "create", db, "--entity", "orders")
    result = run("broker", "create-subscription", db, "--entity", "orders", "--subscription", "a")
    assert result.exit_code == 2
    assert "'orders' is a queue; only topics have subscriptions" in result.output
    with LocalBackend(db) as backend:
        assert backend.describe("orders").kind == "queue"


def test_session_id_selects_in_a_sessionful_subscription_of_a_sessionless_topic(db: str) -> None:
    run("broker", "create", db, "--entity", "events", "--topic", "--subscription", "plain")
    run(
        "broker", "create-subscription", db, "--entity", "events", "--subscription", "ordered",
        "--sessions",
    )  # fmt: skip
    with LocalBackend(db) as backend:
        backend.send("events", [Message(b"x", message_id="m1", session_id="s1")], timeout=5)
    peeked = run(
        "broker", "peek", db, "--entity", "events", "--subscription", "Ordered",
        "--session-id", "s1",
    )  # fmt: skip
    assert peeked.exit_code == 0, peeked.output
    assert json.loads(peeked.output)["message_id"] == "m1"
    refused = run(
        "broker", "peek", db, "--entity", "events", "--subscription", "plain",
        "--session-id", "s1",
    )  # fmt: skip
    assert refused.exit_code == 2
    assert "subscription 'plain' of 'events' has no sessions" in refused.output
