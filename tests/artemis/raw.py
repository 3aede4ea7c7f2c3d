"""A hand-written proton client for tests: it checks the broker's facts without sendonce's code.

Blocking (``proton.utils.BlockingConnection``), one connection per call: slow, simple, and
independent of the backend under test.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from proton import Delivery, Link, Message, symbol
from proton.reactor import Copy, LinkOption
from proton.utils import BlockingConnection

__all__ = ["Routing", "browse_ids", "drain", "manage", "message_count", "raw_send", "wait_for"]


class Routing(LinkOption):
    """Target (sender) or source (receiver) capability ``queue`` (anycast) or ``topic``."""

    def __init__(self, capability: str) -> None:
        self.capability = capability

    def apply(self, link: Link) -> None:
        terminus = link.target if link.is_sender else link.source
        terminus.capabilities.put_object(symbol(self.capability))


def raw_send(
    url: str,
    address: str,
    messages: Iterable[tuple[str, Any]],
    *,
    capability: str = "queue",
    properties: Mapping[str, Any] | None = None,
) -> list[int]:
    """Send ``(duplicate id, body)`` pairs one at a time; the remote outcome of each."""
    connection = BlockingConnection(url, timeout=30)
    try:
        sender = connection.create_sender(address, options=Routing(capability))
        outcomes = []
        for dup_id, body in messages:
            props = {**(properties or {}), "_AMQ_DUPL_ID": dup_id}
            delivery = sender.send(Message(body=body, id=str(dup_id), properties=props))
            outcomes.append(delivery.remote_state)
        return outcomes
    finally:
        connection.close()


def drain(url: str, address: str, *, capability: str = "queue", idle: float = 0.5) -> list[Message]:
    """Receive and accept what the queue holds until it stays empty for ``idle`` seconds
    and, for a queue, the broker counts no deliverable message left in it (a broker paused
    longer than ``idle`` on a loaded machine must not end the drain early; a scheduled
    message not due yet is not waited for)."""
    connection = BlockingConnection(url, timeout=30)
    try:
        receiver = connection.create_receiver(address, credit=100, options=Routing(capability))
        got = []
        deadline = time.monotonic() + 120
        while True:
            try:
                got.append(receiver.receive(timeout=idle))
            except Exception:  # proton.Timeout: nothing arrived for ``idle`` seconds
                if capability != "queue" or time.monotonic() > deadline:
                    return got
                if _deliverable(url, address) == 0:
                    return got
                continue
            receiver.accept()
    finally:
        connection.close()


def message_count(url: str, queue: str) -> int:
    """How many messages ``queue`` holds (0 when it does not exist)."""
    try:
        return int(manage(url, f"queue.{queue}", "getMessageCount"))
    except RuntimeError:
        return 0


def _deliverable(url: str, queue: str) -> int:
    """Messages ``queue`` holds that are not scheduled for later (0 when it does not exist)."""
    try:
        held = int(manage(url, f"queue.{queue}", "getMessageCount"))
        return held - int(manage(url, f"queue.{queue}", "getScheduledCount"))
    except RuntimeError:
        return 0


def browse_ids(url: str, queue: str, *, capability: str = "queue", idle: float = 0.5) -> list[str]:
    """The ``message-id`` of every message ``queue`` holds, in queue order, not consumed
    (a browsing receiver: source distribution mode ``copy``)."""
    connection = BlockingConnection(url, timeout=30)
    try:
        receiver = connection.create_receiver(
            queue, credit=1000, options=[Routing(capability), Copy()]
        )
        ids = []
        while True:
            try:
                ids.append(str(receiver.receive(timeout=idle).id))
            except Exception:  # proton.Timeout: nothing more
                return ids
            receiver.accept()
    finally:
        connection.close()


def wait_for(condition: Callable[[], bool], *, timeout: float = 60.0, what: str = "") -> None:
    """Poll ``condition`` until it holds; ``AssertionError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what or condition}")
        time.sleep(0.05)


ACCEPTED = Delivery.ACCEPTED


def manage(url: str, resource: str, operation: str, *params: Any) -> Any:
    """One broker management operation over AMQP (``activemq.management``); its result, or
    ``RuntimeError`` with the broker's answer."""
    import json

    from proton.utils import SyncRequestResponse

    connection = BlockingConnection(url, timeout=30)
    try:
        reply = SyncRequestResponse(connection, "activemq.management").call(
            Message(
                body=json.dumps(list(params)),
                properties={"_AMQ_ResourceName": resource, "_AMQ_OperationName": operation},
            )
        )
    finally:
        connection.close()
    body = json.loads(reply.body) if reply.body else None  # a void operation answers nothing
    if not (reply.properties or {}).get("_AMQ_OperationSucceeded"):
        raise RuntimeError(f"{resource}.{operation}: {body}")
    return body[0] if isinstance(body, list) and len(body) == 1 else body


def raw_transaction(
    url: str, address: str, messages: Iterable[tuple[str, Any]]
) -> tuple[str, str | None, str | None]:
    """Send ``(duplicate id, body)`` pairs in one AMQP transaction and commit it:
    ``("committed", None, None)`` or ``("rejected", condition, description)``."""
    from proton.handlers import MessagingHandler, TransactionHandler
    from proton.reactor import Container

    pairs = list(messages)
    outcome: list[tuple[str, str | None, str | None]] = []

    class Group(MessagingHandler, TransactionHandler):  # type: ignore[misc]
        def on_start(self, event: Any) -> None:
            self.conn = event.container.connect(url, reconnect=False)
            self.sender = event.container.create_sender(
                self.conn, address, options=Routing("queue")
            )
            event.container.declare_transaction(self.conn, handler=self)

        def on_transaction_declared(self, event: Any) -> None:
            for dup_id, body in pairs:
                event.transaction.send(
                    self.sender, Message(body=body, properties={"_AMQ_DUPL_ID": dup_id})
                )
            event.transaction.commit()

        def on_transaction_committed(self, event: Any) -> None:
            outcome.append(("committed", None, None))
            self.conn.close()

        def on_transaction_commit_failed(self, event: Any) -> None:
            condition = event.delivery.remote.condition
            outcome.append(("rejected", condition.name, condition.description))
            self.conn.close()

    Container(Group()).run()
    return outcome[0]
