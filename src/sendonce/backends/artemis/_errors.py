"""What an Artemis answer means for the sender: every outcome and condition is mapped here.

A transfer's outcome is its delivery's disposition (AMQP 1.0 §3.4):

- ``Accepted``: stored (or, outside a transaction, a duplicate silently dropped: Artemis
  answers both the same way);
- ``Rejected`` with a condition: the broker refused it, nothing stored;
- ``Released`` / ``Modified``: the broker did not take it (nothing stored), and another
  try may succeed;
- no disposition because the connection or link went away first: **in doubt** — the
  broker may have stored it. Only a resend with the same ``_AMQ_DUPL_ID`` is safe.

The rule for doubt is the Service Bus backend's: an error is permanent only when the
broker refused and cannot have stored the message; anything unclassified is transient.
"""

from __future__ import annotations

import re

from proton import Delivery

from ...errors import (
    ConfigurationError,
    MessageSizeError,
    NotSentError,
    PermanentSendError,
    SendError,
    TransientSendError,
    redact,
)
from .. import _amqp_conditions as _amqp

__all__ = [
    "PERMANENT_CONDITIONS",
    "TLS_FAILED",
    "TRANSIENT_CONDITIONS",
    "attach_error",
    "connection_error",
    "culprit_of",
    "lost_error",
    "outcome_error",
    "outcome_name",
    "peer_error",
]

# The broker refused: nothing was stored, and the same request will be refused again.
PERMANENT_CONDITIONS: frozenset[str] = _amqp.REFUSED

# The broker could not take it now (address full, resources): nothing stored, try again.
TRANSIENT_CONDITIONS: frozenset[str] = _amqp.TRANSIENT | {_amqp.RESOURCE_LIMIT}

TLS_FAILED = "sendonce:tls-failed"
_DUPLICATE_ID = re.compile(r"_AMQ_DUPL_ID=(.*?)(?:, [A-Za-z_]\w*=|\})")


def _ids(message_id: str | None, partition_key: str | None) -> dict[str, str | None]:
    return {"message_id": message_id, "partition_key": partition_key}


def outcome_name(state: int) -> str:
    """The outcome a delivery's (terminal) disposition state names."""
    if state == Delivery.ACCEPTED:
        return "accepted"
    if state == Delivery.REJECTED:
        return "rejected"
    if state == Delivery.MODIFIED:
        return "modified"
    if state == Delivery.RELEASED:
        return "released"
    return "released"  # settled with no outcome: the broker did not take it


def outcome_error(
    outcome: str,
    condition: str | None,
    description: str | None,
    *,
    entity: str,
    message_id: str | None,
    partition_key: str | None = None,
) -> SendError | MessageSizeError:
    """The error for a delivery the broker settled with something other than Accepted.

    ``outcome`` is ``rejected``, ``released`` or ``modified``. Nothing was stored.
    """
    said = f"{condition}: {description}" if description else str(condition)
    if outcome == "rejected":
        if condition == "amqp:link:message-size-exceeded":
            return MessageSizeError(
                f"message {message_id!r} is larger than address {entity!r} accepts "
                f"({redact(said)}); nothing was stored",
                field="body",
            )
        if condition in TRANSIENT_CONDITIONS:
            return NotSentError(
                f"the broker could not take message {message_id!r} on address {entity!r} now "
                f"({redact(said)}); nothing was stored, retrying may succeed",
                condition=condition,
                **_ids(message_id, partition_key),
            )
        return PermanentSendError(
            f"the broker rejected message {message_id!r} on address {entity!r} "
            f"({redact(said)}); nothing was stored",
            condition=condition or "amqp:rejected",
            **_ids(message_id, partition_key),
        )
    # Released: "not processed"; Modified: the same, possibly "undeliverable here".
    return NotSentError(
        f"the broker {outcome} message {message_id!r} on address {entity!r} without storing "
        "it; retrying may succeed",
        condition=f"amqp:{outcome}",
        **_ids(message_id, partition_key),
    )


def attach_error(
    condition: str | None, description: str | None, *, entity: str, host: str
) -> SendError:
    """A sender link the broker refused to attach (or detached before any transfer)."""
    said = redact(f"{condition}: {description}" if description else str(condition))
    if condition == "amqp:not-found":
        return PermanentSendError(
            f"address {entity!r} does not exist on {host} and the broker does not create it "
            f"({said}); nothing was sent",
            condition=condition,
        )
    if condition == "amqp:unauthorized-access":
        return PermanentSendError(
            f"the user may not send to address {entity!r} on {host} ({said}); nothing was sent",
            condition=condition,
        )
    if condition in PERMANENT_CONDITIONS:
        return PermanentSendError(
            f"the broker refused a sender link to {entity!r} on {host} ({said}); nothing was sent",
            condition=condition,
        )
    return NotSentError(
        f"the sender link to {entity!r} on {host} closed before it opened ({said}); nothing "
        "was sent",
        condition=condition or "amqp:link:detach-forced",
    )


def connection_error(condition: str | None, description: str | None, *, host: str) -> SendError:
    """A connection that failed before anything was sent on it: refused, SASL, TLS."""
    if condition is None:
        said = "the connection closed"
    else:
        said = redact(f"{condition}: {description}" if description else condition)
    lowered = (description or "").lower()
    if "ssl failure" in lowered or "certificate" in lowered:
        return PermanentSendError(
            f"TLS with the broker at {host} failed ({said}): its certificate is not trusted or "
            "does not name the host; pass ca_file= (?ca_file=/path/ca.pem in the url) with the "
            "CA that signed it; nothing was sent",
            condition=TLS_FAILED,
        )
    # A peer that closes the connection before any answer (a proxy or load balancer whose
    # broker is down or restarting) ends the SASL exchange too: that passes, unlike a refusal.
    aborted = "connection aborted" in lowered or "no protocol header" in lowered
    if condition == "amqp:unauthorized-access" or ("sasl" in lowered and not aborted):
        return PermanentSendError(
            f"the broker at {host} refused the credentials (SASL: {said}); check the user and "
            "password of the url; nothing was sent",
            condition="amqp:unauthorized-access",
        )
    return NotSentError(
        f"cannot connect to the broker at {host} ({said}); nothing was sent",
        condition=condition or "amqp:socket-error",
    )


def lost_error(
    what: str, *, entity: str, host: str, in_doubt: bool, count: int
) -> TransientSendError:
    """The connection or link went away while ``count`` messages of a transfer awaited their
    outcome (0: every one sent was settled, some stored, the rest not sent yet; or a
    transaction's commit awaited its outcome)."""
    if not in_doubt:
        return NotSentError(
            f"{what} before anything of the transfer to {entity!r} was sent ({host}); nothing "
            "was stored",
            condition="amqp:connection:forced",
        )
    if count > 0:
        said = f"before the broker at {host} settled {count} message(s) sent to {entity!r}"
    else:
        said = (
            f"before the broker at {host} answered for the whole transfer to {entity!r} "
            "(part of it was stored)"
        )
    return TransientSendError(
        f"{what} {said}: they may or may not be stored (in doubt); a resend with the same ids "
        "is dropped as a duplicate while the address's id cache still holds them",
        condition="amqp:connection:forced",
    )


def peer_error(host: str, product: object) -> ConfigurationError:
    """The peer answered AMQP but is not Artemis: ``_AMQ_DUPL_ID`` would mean nothing there."""
    said = "no product name" if product is None else f"product {str(product)!r}"
    return ConfigurationError(
        f"the AMQP peer at {host} is not Apache ActiveMQ Artemis / AMQ Broker ({said} in its "
        "open frame): it does not detect duplicates by _AMQ_DUPL_ID, so a resend after an "
        "in-doubt failure could be stored twice. Use the right url, or pass "
        "require_duplicate_detection=False to the backend to accept at-least-once delivery.",
        field="url",
    )


def culprit_of(description: str | None) -> str | None:
    """The duplicate id a rolled-back transaction names (Artemis prints the message)."""
    if not description:
        return None
    found = _DUPLICATE_ID.search(description)
    return found.group(1) if found else None
