"""Broker management over AMQP: requests to ``activemq.management``, answers matched by
correlation id on a dynamic reply queue. Used by ``_loop`` (loop thread only).

Artemis answers with the application property ``_AMQ_OperationSucceeded`` and a JSON body
(a one-element array holding the result, itself JSON for the ``...AsJSON`` operations). A
user without the ``manage`` permission gets the request *rejected*, not answered: the
delivery's outcome is watched too, so such a call fails at once. Every answer spends a
credit of the reply link, topped up as answers come.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from proton import Delivery, Message

from ._errors import outcome_name
from ._requests import Request

__all__ = [
    "MANAGEMENT_ADDRESS",
    "ManagementCall",
    "ManagementChannel",
    "ManagementRefused",
    "flag",
    "our_acceptor",
]

MANAGEMENT_ADDRESS = "activemq.management"
_REPLY_CREDIT = 100  # answers the broker may send before we read them


class ManagementCall(Request):
    """One broker management operation (``activemq.management``), answered as JSON."""

    def __init__(self, resource: str, operation: str, params: list[Any]) -> None:
        super().__init__()
        self.resource = resource
        self.operation = operation
        self.params = params
        self.correlation = uuid.uuid4().hex
        self.asked: float | None = None  # when the request went out (monotonic)
        self.on_answer: Callable[[ManagementCall], None] | None = None  # in the loop thread

    def refused(self, said: object) -> None:
        self.finish(error=ManagementRefused(f"{self.resource}.{self.operation}: {said}"))


class ManagementRefused(Exception):
    """A management operation failed or could not be asked. Internal: the backend turns it
    into what the caller sees (an unknown address, or a profile to pass)."""


class ManagementChannel:
    """The management links of one connection and the calls waiting on them.

    ``answered(call)`` runs after a call is finished by the broker's answer, its refusal of
    the request, or the links' loss.
    """

    def __init__(
        self, container: Any, connection: Any, answered: Callable[[ManagementCall], None]
    ) -> None:
        self._container = container
        self._connection = connection
        self._answered = answered
        self._sender: Any = None
        self._receiver: Any = None
        self._reply_to: str | None = None
        self._waiting: list[ManagementCall] = []  # until the reply queue exists
        self._calls: dict[str, ManagementCall] = {}

    def ask(self, call: ManagementCall) -> None:
        if self._receiver is None:
            self._receiver = self._container.create_receiver(
                self._connection, None, dynamic=True, name=f"sendonce-reply-{uuid.uuid4().hex[:8]}"
            )
            self._receiver.flow(_REPLY_CREDIT)
            self._sender = self._container.create_sender(
                self._connection,
                MANAGEMENT_ADDRESS,
                name=f"sendonce-mgmt-{uuid.uuid4().hex[:8]}",
            )
        if self._reply_to is None:
            self._waiting.append(call)
            return
        self._calls[call.correlation] = call
        request = Message(
            body=json.dumps(call.params),
            reply_to=self._reply_to,
            correlation_id=call.correlation,
            properties={"_AMQ_ResourceName": call.resource, "_AMQ_OperationName": call.operation},
        )
        request.id = call.correlation
        call.asked = time.monotonic()
        delivery = self._sender.send(request)
        delivery.sendonce_call = call  # a refused request (no manage permission) says so here

    def owns(self, link: Any) -> bool:
        return bool(link == self._receiver or link == self._sender)

    def link_opened(self, link: Any) -> None:
        """The reply queue exists once its receiver is attached: the waiting calls go."""
        if link.is_receiver and link == self._receiver:
            self._reply_to = link.remote_source.address
            calls, self._waiting = self._waiting, []
            for call in calls:
                self.ask(call)

    def settled(self, delivery: Any) -> bool:
        """True when ``delivery`` was a request: the broker took it (its answer comes as a
        message) or refused it (its call fails)."""
        call: ManagementCall | None = getattr(delivery, "sendonce_call", None)
        if call is None:
            return False
        if delivery.remote_state == Delivery.ACCEPTED:
            return True
        condition = delivery.remote.condition
        said = str(condition) if condition is not None else outcome_name(delivery.remote_state)
        self._calls.pop(call.correlation, None)
        # Artemis refuses the request message itself when the user may not manage: its own
        # words are then a Java NullPointerException text, so say what it means first.
        call.refused(
            "the broker refused the management request (the user may lack the 'manage' "
            f"permission on activemq.management); the broker said: {said}"
        )
        self._answered(call)
        return True

    def message(self, receiver: Any, reply: Any) -> None:
        """An answer came on ``receiver``: it finishes the call it names."""
        if receiver.credit < _REPLY_CREDIT // 2:  # every answer spends one: top it up
            receiver.flow(_REPLY_CREDIT - receiver.credit)
        key = reply.correlation_id
        call = self._calls.pop(str(key), None) if key is not None else None
        if call is None:
            return
        try:
            body = json.loads(reply.body) if isinstance(reply.body, str) else reply.body
        except ValueError:
            body = reply.body
        if (reply.properties or {}).get("_AMQ_OperationSucceeded") is True:
            value = body[0] if isinstance(body, list) and len(body) == 1 else body
            if isinstance(value, str) and value[:1] in "[{":
                with contextlib.suppress(ValueError):
                    value = json.loads(value)
            call.finish(value)
        else:
            call.refused(body[0] if isinstance(body, list) and body else body)
        if call.on_answer is not None:
            call.on_answer(call)
        self._answered(call)

    def forget(self, call: ManagementCall) -> None:
        """Its caller stopped waiting: an answer that still comes is ignored."""
        self._calls.pop(call.correlation, None)

    def pending(self) -> list[ManagementCall]:
        """The calls asked and not answered, then those waiting for the reply queue."""
        return list(self._calls.values()) + self._waiting

    def fail(self, said: str) -> None:
        """The links went away: every call waiting on them fails; the next call reopens."""
        calls = self.pending()
        self._calls.clear()
        self._waiting = []
        self._receiver = self._sender = self._reply_to = None
        for call in calls:
            call.refused(said)
            self._answered(call)


def our_acceptor(acceptors: Any, port: int) -> dict[str, Any] | None:
    """The acceptor listening on ``port`` (its params and extra properties merged), from
    ``getAcceptorsAsJSON``; None when none matches (a proxy or NAT in between)."""
    if not isinstance(acceptors, list):
        return None
    for entry in acceptors:
        if not isinstance(entry, dict):
            continue
        params = {**(entry.get("params") or {}), **(entry.get("extraProps") or {})}
        if str(params.get("port")) == str(port):
            return {"name": entry.get("name"), **params}
    return None


def flag(params: dict[str, Any], name: str) -> bool | None:
    """A boolean acceptor parameter as written in broker.xml (None: not written)."""
    value = params.get(name)
    if value is None:
        return None
    return str(value).strip().lower() == "true"
