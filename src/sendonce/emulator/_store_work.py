"""What each client operation does to the broker file: run on the storage worker, never the reactor.

These functions take the worker's store and plain values (never proton
objects, which belong to the reactor thread).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import NoSessionAvailableError, SessionCannotBeLockedError, ValidationError
from . import _codec
from ._conditions import ARGUMENT_ERROR, NOT_FOUND, SESSION_CANNOT_BE_LOCKED, TIMEOUT, describe
from ._nodes import SESSION_FILTER, Locked, Node
from ._worker import Outcome, is_busy_failure

if TYPE_CHECKING:
    from ..backends.local import LocalSession

__all__ = [
    "Changes",
    "abandon",
    "check_entity",
    "complete",
    "dead_letter",
    "defer",
    "encode_received",
    "lock_session",
    "max_size",
    "properties_to_modify",
    "send_together",
]

DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"
_DEFAULT_MAX_SIZE = 256 * 1024

Refusal = tuple[str, str]


def check_entity(store: Any, node: Node, *, receiving: bool) -> Refusal | None:
    """Why a link to ``node`` is refused (as Service Bus refuses it), or None.

    Names ignore case, as on Service Bus: an accepted ``node`` gets the entity's and
    subscription's names as created, so that every later comparison sees one name.
    """
    if not node.entity:
        return NOT_FOUND, "no entity named in the link address"
    if "$" in node.entity or (node.subscription and "$" in node.subscription):
        return NOT_FOUND, f"{node.entity!r}: dead-letter and system queues are not emulated"
    try:
        profile = store.describe(node.entity)
    except Exception:
        return NOT_FOUND, f"the messaging entity {node.entity!r} could not be found"
    if not receiving and node.subscription is not None:
        return NOT_FOUND, "cannot send to a subscription"
    if not receiving and node.sub_queue is not None:
        return NOT_FOUND, "cannot send to a dead-letter queue"
    if getattr(profile, "kind", "queue") == "topic" and receiving:
        if not node.subscription:
            return NOT_FOUND, (
                f"{node.entity!r} is a topic: receive from {node.entity}/Subscriptions/<name>"
            )
        refusal = _canonical_subscription(store, node)
        if refusal is not None:
            return refusal
    node.entity = profile.name
    return None


def _canonical_subscription(store: Any, node: Node) -> Refusal | None:
    """Give ``node`` its subscription's name as created; a refusal when there is none."""
    try:
        node.subscription = store.describe_subscription(node.entity, node.subscription).name
    except ValidationError:
        return NOT_FOUND, (
            f"the messaging entity {node.entity}/Subscriptions/{node.subscription} "
            "could not be found"
        )
    return None


def check_management(store: Any, node: Node) -> Refusal | None:
    """Why a ``$management`` link to ``node``'s entity is refused (it does not exist), or None."""
    try:
        profile = store.describe(node.entity)
    except Exception:
        return NOT_FOUND, f"the messaging entity {node.entity!r} could not be found"
    if node.subscription is not None:
        refusal = _canonical_subscription(store, node)
        if refusal is not None:
            return refusal
    node.entity = profile.name
    return None


def send_together(
    store: Any, sends: list[tuple[str, list[Any], list[bytes]]], *, timeout: float
) -> list[Outcome[Any]]:
    """Store several transfers in one commit; each transfer's outcome (acks or error).

    A transfer that fails the shared transaction (a refused message, a deleted
    entity) leaves nothing stored; then each is stored on its own, so only it fails.
    A locked file fails the whole call, nothing stored, to be tried again.
    """
    try:
        return [Outcome(value=acks) for acks in store.send_together(sends, timeout=timeout)]
    except Exception as exc:
        if len(sends) == 1 or is_busy_failure(exc):
            raise
    outcomes: list[Outcome[Any]] = []
    for entity, messages, raws in sends:
        try:
            outcomes.append(Outcome(value=store.send(entity, messages, timeout=timeout, raw=raws)))
        except Exception as exc:
            outcomes.append(Outcome(error=exc))
    return outcomes


def max_size(store: Any, node: Node) -> int:
    """The largest message the entity takes (what a sender link advertises)."""
    try:
        return int(store.describe(node.entity).max_message_size)
    except Exception:
        return _DEFAULT_MAX_SIZE


def lock_session(
    store: Any,
    node: Node,
    filters: dict[str, Any],
    lock_duration: timedelta | None,
) -> tuple[Refusal | None, LocalSession | None]:
    """Give a session receiver its session (the one asked for, or the next available).

    The lock lives in the broker file: local:// session receivers and other
    emulators on the same file compete for it with this client.
    """
    if node.sub_queue is not None:
        return None, None  # a dead-letter subqueue has no sessions to lock
    if node.subscription is not None:  # a subscription has its own sessions setting
        sessionful = bool(store.describe_subscription(node.entity, node.subscription).sessions)
    else:
        sessionful = bool(getattr(store.describe(node.entity), "sessions", False))
    if str(SESSION_FILTER) not in filters:
        if sessionful:
            refusal = f"{node.entity!r} requires sessions: open a session receiver"
            return (ARGUMENT_ERROR, refusal), None
        return None, None
    wanted = filters[str(SESSION_FILTER)]
    try:
        session = store.accept_session(
            node.entity,
            _codec._text(wanted) if wanted is not None else None,
            subscription=node.subscription,
            max_wait_time=0,
            lock_duration=lock_duration,
        )
    except SessionCannotBeLockedError as exc:
        return (SESSION_CANNOT_BE_LOCKED, describe(exc)), None
    except NoSessionAvailableError as exc:
        return (TIMEOUT, describe(exc)), None
    except ValidationError as exc:  # no sessions on the entity, a bad session id
        return (ARGUMENT_ERROR, describe(exc)), None
    return None, session


def complete(store: Any, locked: Locked) -> None:
    if locked.session is not None:
        locked.session.complete(locked.lock_token)
        return
    store.complete(
        locked.entity,
        locked.lock_token,
        subscription=locked.subscription,
        sub_queue=locked.sub_queue,
    )


# Properties to modify: what a client's abandon, defer or dead-letter writes over the
# message's application properties (None: nothing).
Changes = dict[str, Any] | None


def properties_to_modify(value: Any, *, without: tuple[str, ...] = ()) -> Changes:
    """A settlement's properties to modify as the store takes them (str keys, plain values).

    Sent as the modified outcome's message-annotations, in the rejected outcome's error
    info beside the dead-letter reason (``without`` those keys), or as the management
    request's ``properties-to-modify`` map.
    """
    if not isinstance(value, dict) or not value:
        return None
    changes = {
        str(key): _codec._property(item) for key, item in value.items() if str(key) not in without
    }
    return changes or None


def abandon(store: Any, locked: Locked, changes: Changes = None) -> None:
    if locked.session is not None:
        locked.session.abandon(locked.lock_token, properties_to_modify=changes)
        return
    store.abandon(
        locked.entity,
        locked.lock_token,
        subscription=locked.subscription,
        sub_queue=locked.sub_queue,
        properties_to_modify=changes,
    )


def defer(store: Any, locked: Locked, changes: Changes = None) -> None:
    if locked.sub_queue is not None:
        abandon(store, locked, changes)  # nothing to defer to on a dead-letter subqueue
        return
    if locked.session is not None:
        locked.session.defer(locked.lock_token, properties_to_modify=changes)
        return
    store.defer(
        locked.entity,
        locked.lock_token,
        subscription=locked.subscription,
        properties_to_modify=changes,
    )


def dead_letter(
    store: Any,
    locked: Locked,
    reason: str | None,
    description: str | None,
    changes: Changes = None,
) -> None:
    if locked.sub_queue is not None:
        # Service Bus: "you can't dead-letter a message from a DLQ"; the message
        # stays in the dead-letter subqueue, released (the broker decides).
        store.dead_letter(
            locked.entity,
            locked.lock_token,
            subscription=locked.subscription,
            sub_queue=locked.sub_queue,
            properties_to_modify=changes,
        )
        return
    if locked.session is not None:
        locked.session.dead_letter(
            locked.lock_token,
            reason=reason,
            error_description=description,
            properties_to_modify=changes,
        )
        return
    store.dead_letter(
        locked.entity,
        locked.lock_token,
        subscription=locked.subscription,
        reason=reason,
        error_description=description,
        properties_to_modify=changes,
    )


# x-opt-message-state values, as Service Bus sets them (ServiceBusMessageState).
DEFERRED = 1
SCHEDULED = 2
_STATES = {"deferred": DEFERRED, "scheduled": SCHEDULED}


def encode_received(
    m: Any, *, peek_lock: bool, peeked: bool = False, state: int | None = None
) -> bytes:
    """A stored message as the client receives it, with the broker's annotations.

    The header's delivery-count counts earlier deliveries: a received message's
    own delivery is not one of them, while a peek reports every delivery so far
    (0 for a message never received), as Service Bus does. ``state`` marks a
    deferred message (else the stored message's own state does); a peeked message not yet
    due is marked scheduled. The time to live is the one the message has on its entity.
    """
    raw = getattr(m, "raw", None)
    if not raw:
        raw = _codec.encode_fields(
            message_id=m.message_id,
            body=m.body,
            subject=m.subject,
            content_type=m.content_type,
            correlation_id=m.correlation_id,
            session_id=m.session_id,
            application_properties=m.application_properties,
            time_to_live=m.time_to_live,
        )
    count = getattr(m, "delivery_count", None)
    reason = getattr(m, "dead_letter_reason", None)
    description = getattr(m, "dead_letter_error_description", None)
    extra: dict[str, Any] = {}
    modified = getattr(m, "modified_properties", ())
    if modified:
        # Written over the sender's by settlements (properties to modify).
        props = m.application_properties or {}
        extra.update({key: props.get(key) for key in modified})
    if reason is not None or description is not None:
        # Service Bus hands the reason out as application properties.
        named = {DEAD_LETTER_REASON: reason, DEAD_LETTER_DESCRIPTION: description}
        extra.update({k: v for k, v in named.items() if v is not None})
    if extra:
        raw = _codec.with_application_properties(raw, extra)
    if state is None:
        state = _STATES.get(getattr(m, "state", "active"))
    scheduled = getattr(m, "scheduled_enqueue_time", None)
    if state is None and peeked and scheduled is not None and scheduled > datetime.now(UTC):
        state = SCHEDULED
    return _codec.restamp(
        raw,
        extra_annotations={"x-opt-message-state": state} if state is not None else None,
        sequence_number=m.sequence_number,
        enqueued_time=m.enqueued_time,
        locked_until=m.locked_until if peek_lock else None,
        partition_key=m.partition_key,
        time_to_live=getattr(m, "time_to_live", None),
        delivery_count=int(count or 0) if peeked else max(0, int(count) - 1) if count else None,
    )
