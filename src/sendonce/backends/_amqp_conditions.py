"""The AMQP 1.0 error conditions (§2.8.15-§2.8.18) and what each says about a transfer.

Both AMQP backends (Service Bus and Artemis) read a refusal's condition before anything
else, so the standard conditions are classified once, here. The rule for doubt is the
same for both: *refused* only when the broker refused and cannot have stored the message;
everything else is transient. Each backend adds its broker's own conditions
(``com.microsoft:*``) and decides the one standard condition the brokers use differently,
:data:`RESOURCE_LIMIT`.
"""

from __future__ import annotations

__all__ = ["REFUSED", "RESOURCE_LIMIT", "TRANSIENT"]

REFUSED: frozenset[str] = frozenset(
    {
        "amqp:unauthorized-access",
        "amqp:not-found",
        "amqp:link:message-size-exceeded",
        "amqp:not-implemented",
        "amqp:not-allowed",
        "amqp:decode-error",
        "amqp:invalid-field",
        "amqp:precondition-failed",
        "amqp:resource-deleted",
        "amqp:frame-size-too-small",
    }
)
"""The broker refused: nothing was stored, and the same request will be refused again."""

TRANSIENT: frozenset[str] = frozenset(
    {
        "amqp:internal-error",
        "amqp:connection:forced",
        "amqp:link:detach-forced",
        "amqp:link:stolen",
        "amqp:resource-locked",
        "amqp:illegal-state",
    }
)
"""The link or connection went away, or the broker could not act now: try again (a
transfer without a disposition is in doubt)."""

RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
"""A quota on Service Bus (refused: the same send is refused until the namespace changes),
an address full on Artemis (nothing stored now; it may take it later)."""
