"""The AMQP transactions of an Artemis connection: one all-or-nothing transfer each.

An atomic transfer declares its own transaction on the connection (one at a time, in
submission order), sends its deliveries in it on its address's sender link, and commits
(the discharge). Artemis stores the group whole or not at all; a rollback for a duplicate
names the last duplicate it met. This is proton's transaction handler for the loop's
connection (loop thread only).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from proton.handlers import TransactionHandler

from ._errors import attach_error, culprit_of, outcome_error
from ._requests import Transfer

if TYPE_CHECKING:
    from ._loop import ArtemisLoop

__all__ = ["Transactions"]


class Transactions(TransactionHandler):
    """The queue of atomic transfers and the one whose transaction is open."""

    def __init__(self, loop: ArtemisLoop) -> None:
        self._loop = loop
        self._queue: deque[Transfer] = deque()
        self._active: Transfer | None = None

    def add(self, transfer: Transfer) -> None:
        self._queue.append(transfer)
        self._next()

    def commit(self, transfer: Transfer) -> None:
        """The transfer's last delivery went out: discharge its transaction."""
        transfer.commit_sent = True
        transfer.txn.commit()

    def cancelled(self, transfer: Transfer) -> None:
        """Cancelled before its first delivery: end its transaction, so the next can start."""
        if self._active is transfer and transfer.txn is not None:
            transfer.txn.abort()
            self._done(transfer)

    def drain(self) -> list[Transfer]:
        """Forget every transfer (the connection is gone): the open one and those queued."""
        transfers = ([] if self._active is None else [self._active]) + list(self._queue)
        self._queue.clear()
        self._active = None
        return transfers

    def _next(self) -> None:
        loop = self._loop
        while self._active is None and self._queue:
            transfer = self._queue.popleft()
            if transfer.abandoned:
                continue
            self._active = transfer
            transfer.txn = loop.container.declare_transaction(loop.connection, handler=self)

    def _open(self, event: Any) -> Transfer | None:
        """The transfer whose transaction ``event`` is about (None: a forgotten one)."""
        transfer = self._active
        if transfer is None or event.transaction is not transfer.txn:
            return None
        return transfer

    def _done(self, transfer: Transfer) -> None:
        self._loop.untrack(transfer)
        self._active = None
        self._next()

    # -- proton's TransactionHandler callbacks ------------------------------------------

    def on_transaction_declared(self, event: Any) -> None:
        self._loop.heard()
        transfer = self._open(event)
        if transfer is None:
            return
        if transfer.abandoned:
            transfer.txn.abort()
            self._done(transfer)
            return
        self._loop.route(transfer)

    def on_transaction_declare_failed(self, event: Any) -> None:
        transfer = self._open(event)
        if transfer is None:
            return
        condition = event.delivery.remote.condition
        transfer.finish(
            error=attach_error(
                None if condition is None else str(condition.name),
                None if condition is None else condition.description,
                entity=transfer.entity,
                host=self._loop.where,
            )
        )
        self._done(transfer)

    def on_transaction_committed(self, event: Any) -> None:
        self._loop.heard()
        transfer = self._open(event)
        if transfer is None:
            return
        transfer.finish(["accepted"] * len(transfer.payloads))
        self._done(transfer)

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._loop.heard()
        transfer = self._open(event)
        if transfer is None:
            return
        condition = event.delivery.remote.condition
        name = None if condition is None else str(condition.name)
        description = None if condition is None else condition.description
        culprit = culprit_of(description)
        if name in ("failed", "amqp:transaction:rollback") and culprit is not None:
            # Rolled back for a duplicate: Artemis names the last one it met.
            transfer.finish(("duplicate-group", culprit))
        else:
            transfer.finish(
                error=outcome_error(
                    "rejected",
                    name or "amqp:transaction:rollback",
                    description,
                    entity=transfer.entity,
                    message_id=transfer.ids[0][0],
                )
            )
        self._done(transfer)

    def on_transaction_aborted(self, event: Any) -> None:
        transfer = self._open(event)
        if transfer is not None:
            self._done(transfer)
