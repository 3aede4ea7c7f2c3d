"""One ``$cbs`` token link per shared connection: each entity's token put on it, and refreshed.

Service Bus authorises a link by a token put on the connection's claims-based-security node
(``$cbs``) for the entity's audience. The client opens one ``$cbs`` link pair per sender;
16 of them on one connection all listened on the same reply address, and the answers went
astray (docs/servicebus.md, Connections). Here a connection has exactly one, as the Java
and .NET clients do: every audience's token goes through it, one request at a time, and a
background task puts a fresh token before each one expires.

The token is the client's own (``azure.servicebus._common.utils.create_authentication``):
a SAS token signed from the connection string's key, or an Entra ID token. It is never
logged, kept in a repr, or put in an error's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from azure.servicebus._pyamqp.constants import ManagementExecuteOperationResult
from azure.servicebus._pyamqp.error import AMQPConnectionError, ErrorCondition
from azure.servicebus._pyamqp.message import Message, Properties
from azure.servicebus._pyamqp.utils import utc_from_timestamp
from azure.servicebus.exceptions import ServiceBusAuthenticationError

__all__ = ["TokenLink"]

logger = logging.getLogger("sendonce.servicebus")

_REFRESH_SHARE = 0.1
"""A token is put again when this share of its lifetime is left (pyamqp's own margin)."""
_MIN_REFRESH_LEAD = 5.0
_RETRY_REFRESH = 5.0


@dataclass(slots=True)
class _Grant:
    """What was put for one audience: its auth (the client's token source) and expiry."""

    auth: Any
    expires_on: float
    refresh_at: float


class TokenLink:
    """The ``$cbs`` link pair of one connection, on its own session."""

    def __init__(self, connection: Any, *, timeout: float) -> None:
        self._session = connection.create_session()
        self._link: Any = None
        self._timeout = timeout
        self._grants: dict[str, _Grant] = {}
        self._lock = asyncio.Lock()  # one put at a time: answers are matched by message id
        self._refresher: asyncio.Task[None] | None = None
        self._granted = asyncio.Event()  # a grant was added or renewed: recompute the wait

    def __repr__(self) -> str:
        return f"TokenLink(audiences={len(self._grants)})"

    async def open(self, deadline: float) -> None:
        """Begin the session and attach the ``$cbs`` pair; the connection's reader must run."""
        await self._session.begin()
        self._link = self._session.create_request_response_link_pair(
            endpoint="$cbs",
            on_amqp_management_open_complete=_ignore,
            on_amqp_management_error=_ignore,
            status_code_field=b"status-code",
            status_description_field=b"status-description",
        )
        await self._link.open()
        from azure.servicebus._pyamqp.constants import ManagementLinkState

        while self._link.state != ManagementLinkState.OPEN:
            if self._link.state in (ManagementLinkState.IDLE, ManagementLinkState.ERROR):
                raise AMQPConnectionError(
                    ErrorCondition.UnauthorizedAccess, description="the $cbs link did not open"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError("opening the $cbs link timed out")
            await asyncio.sleep(0.005)
        self._refresher = asyncio.ensure_future(self._refresh_loop())

    async def authorize(self, audience: str, auth: Any, deadline: float) -> None:
        """Put a token for ``audience`` unless a valid one is there already."""
        async with self._lock:
            grant = self._grants.get(audience)
            if grant is not None and time.time() < grant.refresh_at:
                return
            await self._put(audience, auth, deadline)

    async def _put(self, audience: str, auth: Any, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        # The credential may block (azure-identity asks a token service): not on the loop.
        token = await asyncio.wait_for(
            loop.run_in_executor(None, auth.get_token), max(deadline - time.monotonic(), 0.001)
        )
        if inspect.isawaitable(token):  # an aio credential (the aio backend: a SAS key's)
            token = await asyncio.wait_for(token, max(deadline - time.monotonic(), 0.001))
        raw = token.token.decode() if isinstance(token.token, bytes) else token.token
        token_type = auth.token_type
        token_type = token_type.decode() if isinstance(token_type, bytes) else token_type
        message = Message(
            value=raw,
            properties=Properties(message_id=uuid4()),
            application_properties={
                "name": audience,
                "operation": "put-token",
                "type": token_type,
                "expiration": utc_from_timestamp(token.expires_on),
            },
        )
        answer: asyncio.Future[tuple[Any, Any, Any]] = loop.create_future()

        async def done(result: Any, status: Any, description: Any, _: Any, *rest: Any) -> None:
            if not answer.done():
                answer.set_result((result, status, description))

        left = max(deadline - time.monotonic(), 0.001)
        await self._link.execute_operation(
            message, done, timeout=left, operation="put-token", type=token_type
        )
        result, status, description = await asyncio.wait_for(answer, left)
        if result != ManagementExecuteOperationResult.OK:
            text = description.decode() if isinstance(description, bytes) else str(description)
            raise ServiceBusAuthenticationError(
                message=f"the token for {audience} was refused (status {status}): {text}"
            )
        now = time.time()
        lifetime = max(float(token.expires_on) - now, 0.0)
        lead = max(lifetime * _REFRESH_SHARE, min(_MIN_REFRESH_LEAD, lifetime / 2))
        self._granted.set()
        self._grants[audience] = _Grant(
            auth, float(token.expires_on), float(token.expires_on) - lead
        )
        logger.debug("authorised %s on the shared connection (%.0fs left)", audience, lifetime)

    async def _refresh_loop(self) -> None:
        """Put each audience's token again before it expires, for as long as the link lives."""
        while True:
            soonest = min((g.refresh_at for g in self._grants.values()), default=time.time() + 3600)
            self._granted.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._granted.wait(), max(soonest - time.time(), 0.05))
            for audience, grant in list(self._grants.items()):
                if time.time() < grant.refresh_at:
                    continue
                try:
                    async with self._lock:
                        await self._put(audience, grant.auth, time.monotonic() + self._timeout)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the links carry on with the old token meanwhile
                    grant.refresh_at = time.time() + _RETRY_REFRESH
                    logger.warning(
                        "refreshing the token for %s failed (%s); retrying in %gs",
                        audience,
                        type(exc).__name__,
                        _RETRY_REFRESH,
                    )

    def stop(self) -> None:
        """Stop refreshing (the connection is closing or lost)."""
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None

    async def close(self) -> None:
        """Stop refreshing and detach the pair (best effort: the connection closes next)."""
        self.stop()
        if self._link is not None:
            with contextlib.suppress(Exception):
                await self._link.close()


async def _ignore(*_: Any) -> None:
    """The management link's open/error callbacks: its ``state`` is read instead."""
