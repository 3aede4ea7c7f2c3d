"""Apache ActiveMQ Artemis / Red Hat AMQ Broker over AMQP 1.0 (the ``artemis`` extra).

The whole backend lives in this package, one concept per module: ``_url`` parses
``amqp://`` urls, ``_convert`` encodes a message, ``_requests`` and ``_doorbell`` are the
work callers hand the event loop and how, ``_loop`` owns the one AMQP
connection, with its sender links (``_links``) and transactions (``_transactions``),
``_shared`` shares it per broker and credential, ``_management`` asks the broker's
management address, ``_errors`` maps outcomes to errors, ``_reach``, ``_cache`` and
``_resend`` bound resends by the id cache, and ``_backend`` ties them into
:class:`ArtemisBackend`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._backend import ArtemisBackend

__all__ = ["ArtemisBackend"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: ``connect()`` reads ``_url`` without the artemis extra installed.
    if name == "ArtemisBackend":
        from ..._extras import requires_extra

        with requires_extra("sendonce.backends.artemis.ArtemisBackend", "artemis"):
            from ._backend import ArtemisBackend

        return ArtemisBackend
    raise AttributeError(f"module 'sendonce.backends.artemis' has no attribute {name!r}")
