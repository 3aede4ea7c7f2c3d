"""Service Bus behaviour on proton events, assembled from one part per concept.

One :class:`EmulatorHandler` serves every connection of one emulator on the
reactor thread: connection and link lifecycle (``_links``), transfers in and
out with their settlement (``_transfers``), and the ``$cbs``/``$management``
request nodes (``_management``). Broker-file work goes to the storage worker
(``_worker``); results come back to this thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from proton import Delivery, Handler

from ._base import guarded
from ._conditions import NOT_FOUND, condition
from ._links import LinkLifecycle
from ._management import Management
from ._transfers import Transfers
from ._worker import StorageWorker

if TYPE_CHECKING:
    from ._server import Emulator

__all__ = ["EmulatorHandler", "Tick"]

_log = logging.getLogger("sendonce.emulator")

_RECEIVE_CREDIT = 200


class EmulatorHandler(LinkLifecycle, Transfers, Management):
    """Proton events -> Service Bus behaviour."""

    def __init__(self, emulator: Emulator, worker: StorageWorker) -> None:
        super().__init__(emulator, worker)
        self.init_lifecycle()
        self.init_transfers()

    @guarded
    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        link = event.link
        if not link.is_receiver:
            if dlv.updated:
                self.on_settlement(dlv)
            return
        node = self.nodes.get(link)
        if not dlv.readable:
            return
        payload = self.read_delivery(link, dlv, node)
        if dlv.partial:
            return  # more to come
        link.advance()
        if link.credit < _RECEIVE_CREDIT // 2:
            link.flow(_RECEIVE_CREDIT - link.credit)
        if payload is None:
            return  # refused as too large
        if node is None:
            self.settle(dlv, Delivery.REJECTED, condition(NOT_FOUND, "link not attached"))
        elif node.kind == "cbs":
            self.on_cbs(link, dlv, payload)
        elif node.kind == "management":
            self.on_management(link, dlv, node, payload)
        else:
            self.on_transfer(link, dlv, node, payload)

    def poll(self) -> None:
        """Timer work: limits, lock expiry, waiting session receivers, receivers' polls."""
        self.enforce_handshake_timeout()
        self.close_finished()
        if self.sessions:
            self.expire_session_locks()
        if self.tokens or self.locked:
            self.expire_locks()
        if self.waiting:
            self.retry_waiting()
        self.poll_receivers()


class Tick(Handler):
    """The periodic timer: polls the store for receivers and honours the stop flag."""

    def __init__(self, handler: EmulatorHandler) -> None:
        self.handler = handler

    def on_timer_task(self, event: Any) -> None:
        h = self.handler
        if h.emulator._stop.is_set():
            h.shutdown(event.container)
            return
        try:
            h.poll()
        except Exception:
            _log.exception("emulator poll failed")
        event.container.schedule(h.emulator.poll_interval, self)
