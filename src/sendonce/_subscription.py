"""What a topic's subscription enforces on its receivers: its own receive settings.

Service Bus keeps sessions, lock duration, max delivery count, default time to
live and dead-lettering on expiration per subscription
(https://learn.microsoft.com/azure/service-bus-messaging/service-bus-queues-topics-subscriptions#topics-and-subscriptions);
a topic has only what concerns accepting messages (duplicate detection, size,
partitioning, its own default time to live).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from ._entity import DEFAULT_LOCK_DURATION, check_receive_settings
from .errors import ConfigurationError

__all__ = ["MAX_SUBSCRIPTION_NAME", "SubscriptionProfile", "check_subscription_name"]

MAX_SUBSCRIPTION_NAME = 50


def check_subscription_name(name: object) -> str:
    """A Service Bus subscription name: 1 to 50 characters, no ``/`` (it separates paths)."""
    if (
        not isinstance(name, str)
        or not name.strip()
        or "/" in name
        or "\x00" in name
        or len(name) > MAX_SUBSCRIPTION_NAME
    ):
        raise ConfigurationError(
            f"subscription name {name!r} must be a non-empty str of at most "
            f"{MAX_SUBSCRIPTION_NAME} characters without '/'",
            field="subscription",
        )
    return name


@dataclass(frozen=True, slots=True)
class SubscriptionProfile:
    """A subscription's own settings, as the broker applies them to its copies.

    ``default_message_time_to_live`` caps the time to live of the subscription's
    copies; the topic's own default caps it too (the shorter wins), as on Service
    Bus. A sessionful subscription (``sessions=True``) of a topic without sessions
    dead-letters the copies of messages that carry no session id, as Service Bus
    does (reason ``Session id is null.``).
    """

    name: str
    sessions: bool = field(default=False, kw_only=True)
    lock_duration: timedelta = field(default=DEFAULT_LOCK_DURATION, kw_only=True)
    max_delivery_count: int = field(default=10, kw_only=True)
    default_message_time_to_live: timedelta | None = field(default=None, kw_only=True)
    dead_lettering_on_message_expiration: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        check_subscription_name(self.name)
        check_receive_settings(
            f"subscription {self.name!r}",
            lock_duration=self.lock_duration,
            max_delivery_count=self.max_delivery_count,
            default_message_time_to_live=self.default_message_time_to_live,
            flags={
                "sessions": self.sessions,
                "dead_lettering_on_message_expiration": self.dead_lettering_on_message_expiration,
            },
        )
