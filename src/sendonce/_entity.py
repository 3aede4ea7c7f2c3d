"""What a queue or topic enforces, and the partition/session key rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from ._message import Message
from ._property_quotas import QUOTA_SAFE_SIZE, check_property_quotas
from .errors import ConfigurationError, KeyRuleError, MessageSizeError

__all__ = [
    "DEFAULT_LOCK_DURATION",
    "DEFAULT_WINDOW",
    "MAX_LOCK_DURATION",
    "MIN_LOCK_DURATION",
    "MAX_WINDOW",
    "MIN_WINDOW",
    "DedupKey",
    "EntityKind",
    "EntityProfile",
]

MIN_WINDOW = timedelta(seconds=20)
MAX_WINDOW = timedelta(days=7)
DEFAULT_WINDOW = timedelta(minutes=10)
DEFAULT_ID_CACHE_SIZE = 20_000
# Service Bus: LockDuration defaults to 1 minute and is at most 5 minutes (its floor
# is 5 seconds). The local broker takes locks down to 1 second, so that tests of lock
# expiry wait seconds, not minutes.
DEFAULT_LOCK_DURATION = timedelta(minutes=1)
MIN_LOCK_DURATION = timedelta(seconds=1)
MAX_LOCK_DURATION = timedelta(minutes=5)
EntityKind = Literal["queue", "topic"]
DedupKey = tuple[str, str | None]
"""(message id, partition key or None): what the broker compares."""


def _readable(value: timedelta) -> str:
    """``timedelta(days=8)`` as ``8 days`` (its ``str`` reads ``8 days, 0:00:00``)."""
    total = value.total_seconds()
    if total != int(total) or total < 60:
        return f"{total:g} seconds"
    parts, rest = [], int(total)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count} {unit}{'s' * (count != 1)}")
    return " ".join(parts)


def check_receive_settings(
    owner: str,
    *,
    lock_duration: object,
    max_delivery_count: object,
    default_message_time_to_live: object,
    flags: dict[str, object],
) -> None:
    """The settings queues and subscriptions share; a specific error naming the field.

    ``owner`` names what is checked in the message (``entity 'orders'``).
    """
    ttl = default_message_time_to_live
    if ttl is not None and (not isinstance(ttl, timedelta) or ttl <= timedelta(0)):
        raise ConfigurationError(
            f"{owner}: default_message_time_to_live must be a positive timedelta or None",
            field="default_message_time_to_live",
        )
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigurationError(f"{owner}: {flag} must be a bool", field=flag)
    deliveries = max_delivery_count
    if not isinstance(deliveries, int) or isinstance(deliveries, bool) or deliveries < 1:
        raise ConfigurationError(
            f"{owner}: max_delivery_count must be an int of at least 1",
            field="max_delivery_count",
        )
    lock = lock_duration
    if not isinstance(lock, timedelta):
        raise ConfigurationError(
            f"{owner}: lock_duration must be a timedelta", field="lock_duration"
        )
    if not MIN_LOCK_DURATION <= lock <= MAX_LOCK_DURATION:
        raise ConfigurationError(
            f"{owner}: lock_duration {_readable(lock)} is outside the broker's range "
            "1 second to 5 minutes (Service Bus: 5 seconds to 5 minutes)",
            field="lock_duration",
        )


@dataclass(frozen=True, slots=True)
class EntityProfile:
    """What the target queue or topic enforces.

    ``id_cache_size`` switches duplicate detection from the Service Bus time
    window to an Artemis-style count-bounded id cache; ``persist_id_cache``
    says whether that cache survives a broker restart.

    On Service Bus, sessions, lock duration, max delivery count and
    dead-lettering on expiration are settings of each queue and subscription,
    not of a topic. On a topic's profile they are what its producers expect:
    ``sessions=True`` makes senders refuse a message without a session id, and
    the settings are the defaults of subscriptions created without their own
    (see :class:`SubscriptionProfile`). A topic's
    ``default_message_time_to_live`` applies to every subscription's copy.
    """

    name: str
    kind: EntityKind = field(default="queue", kw_only=True)
    duplicate_detection: bool = field(default=True, kw_only=True)
    duplicate_detection_window: timedelta = field(default=DEFAULT_WINDOW, kw_only=True)
    partitioned: bool = field(default=False, kw_only=True)
    sessions: bool = field(default=False, kw_only=True)
    max_message_size: int = field(default=256 * 1024, kw_only=True)
    id_cache_size: int | None = field(default=None, kw_only=True)
    persist_id_cache: bool = field(default=True, kw_only=True)
    # Service Bus moves a message to the dead-letter subqueue once it was
    # delivered this many times (MaxDeliveryCount, default 10).
    max_delivery_count: int = field(default=10, kw_only=True)
    # The entity's default message time to live (Service Bus DefaultMessageTimeToLive):
    # a message's own time_to_live applies when shorter. None: messages never expire
    # unless they carry their own.
    default_message_time_to_live: timedelta | None = field(default=None, kw_only=True)
    # Expired messages go to the dead-letter subqueue instead of being removed.
    dead_lettering_on_message_expiration: bool = field(default=False, kw_only=True)
    # How long a peek-lock (of a message or a session) lasts unless renewed
    # (Service Bus LockDuration). On a topic: the default of its subscriptions.
    lock_duration: timedelta = field(default=DEFAULT_LOCK_DURATION, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError("entity name must be a non-empty str", field="name")
        if len(self.name) > 260 or any(c in self.name for c in "\\?#\x00"):
            raise ConfigurationError(
                f"entity name {self.name!r} is not a valid queue or topic name", field="name"
            )
        if self.kind not in ("queue", "topic"):
            raise ConfigurationError(
                f"entity {self.name!r}: kind must be 'queue' or 'topic', got {self.kind!r}",
                field="kind",
            )
        check_receive_settings(
            f"entity {self.name!r}",
            lock_duration=self.lock_duration,
            max_delivery_count=self.max_delivery_count,
            default_message_time_to_live=self.default_message_time_to_live,
            flags={
                flag: getattr(self, flag)
                for flag in (
                    "duplicate_detection",
                    "partitioned",
                    "sessions",
                    "persist_id_cache",
                    "dead_lettering_on_message_expiration",
                )
            },
        )
        window = self.duplicate_detection_window
        if not isinstance(window, timedelta):
            raise ConfigurationError(
                f"entity {self.name!r}: duplicate_detection_window must be a timedelta",
                field="duplicate_detection_window",
            )
        if not MIN_WINDOW <= window <= MAX_WINDOW:
            raise ConfigurationError(
                f"entity {self.name!r}: duplicate_detection_window {_readable(window)} is "
                "outside the broker's range 20 seconds to 7 days",
                field="duplicate_detection_window",
            )
        size = self.max_message_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1024:
            raise ConfigurationError(
                f"entity {self.name!r}: max_message_size must be an int of at least 1024 bytes",
                field="max_message_size",
            )
        cache = self.id_cache_size
        if cache is not None and (
            not isinstance(cache, int) or isinstance(cache, bool) or cache < 1
        ):
            raise ConfigurationError(
                f"entity {self.name!r}: id_cache_size must be a positive int or None",
                field="id_cache_size",
            )

    @property
    def count_bounded(self) -> bool:
        """True when duplicates are remembered by count (Artemis), not by time."""
        return self.id_cache_size is not None

    @property
    def window(self) -> timedelta | None:
        """The time window the broker remembers ids for, or None when count-bounded."""
        return None if self.count_bounded else self.duplicate_detection_window

    def dedup_key(self, message: Message) -> DedupKey:
        """The uniqueness key the broker uses for ``message``.

        Partitioned: MessageId + PartitionKey, where the session id stands in for
        a missing partition key and, with duplicate detection on, the MessageId
        stands in for both. Otherwise: MessageId alone.
        """
        if not self.partitioned:
            return (message.message_id, None)
        key = message.partition_key or message.session_id
        if key is None:
            key = message.message_id
        return (message.message_id, key)

    def effective_partition_key(self, message: Message) -> str | None:
        """The key that decides which partition (or batch) a message belongs to."""
        return message.partition_key or message.session_id

    def check(self, message: Message) -> None:
        """Raise if the entity would refuse ``message``; nothing has been sent yet."""
        if self.sessions and message.session_id is None:
            raise KeyRuleError(
                f"message {message.message_id!r}: entity {self.name!r} requires sessions, "
                "so session_id must be set",
                field="session_id",
            )
        if (
            message.partition_key is not None
            and message.session_id is not None
            and message.partition_key != message.session_id
        ):
            raise KeyRuleError(
                f"message {message.message_id!r}: partition_key must equal session_id",
                field="partition_key",
            )
        if message.size > self.max_message_size:
            raise MessageSizeError(
                f"message {message.message_id!r} is {message.size} bytes, over the "
                f"{self.max_message_size}-byte limit of entity {self.name!r}",
                field="body",
            )
        if self.id_cache_size is None and message.size > QUOTA_SAFE_SIZE:
            # Service Bus's property quotas (an Artemis-style entity has none).
            check_property_quotas(message, self.name)

    @property
    def _check_above(self) -> int:
        """The message size over which :meth:`check` can refuse a message whose session id
        the entity does not require: the fast paths skip the check below it."""
        if self.id_cache_size is None:
            return min(self.max_message_size, QUOTA_SAFE_SIZE)
        return self.max_message_size

    def require_duplicate_detection(self) -> None:
        """Refuse an entity that cannot deduplicate: idempotent sends would be a lie."""
        if not self.duplicate_detection:
            raise ConfigurationError(
                f"entity {self.name!r} has duplicate detection off (or is on the Basic tier, "
                "which has none), so a resend after an in-doubt failure would create a "
                "duplicate. Duplicate detection can only be set when the entity is created: "
                "recreate it with requires_duplicate_detection=True, or pass "
                "require_duplicate_detection=False to accept at-least-once delivery.",
                field="duplicate_detection",
            )
