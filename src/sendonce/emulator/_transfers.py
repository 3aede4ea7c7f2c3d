"""Transfers: messages clients send (size-checked while they arrive), messages delivered to
receivers, and the settlement of peek-locked deliveries."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Literal, NamedTuple

from proton import Delivery, Endpoint, Link

from ..errors import SessionLockLostError, ValidationError
from . import _codec, _store_work
from ._base import HandlerBase, guarded
from ._conditions import (
    ARGUMENT_ERROR,
    DECODE_ERROR,
    DETACH_FORCED,
    LOCK_LOST,
    MESSAGE_SIZE,
    NOT_FOUND,
    SERVER_BUSY,
    UNAUTHORIZED,
    condition,
    describe,
    is_missing_entity,
    lost,
    store_condition,
)
from ._faults import FaultAction
from ._nodes import Locked, Node
from ._worker import Outcome, attempt_timeout, is_busy_failure

__all__ = ["Transfers"]

_log = logging.getLogger("sendonce.emulator")

_STORE_TIMEOUT = 30.0
_RECEIVE_CREDIT = 200
# What a transfer may carry beyond the entity's largest message (the batch envelope).
SIZE_SLACK = 64 * 1024
# How long a receiver whose poll found the file locked waits before polling again.
_BUSY_BACKOFF = 0.2


class _Incoming:
    """A transfer still arriving: its bytes so far, or only its size once over the limit."""

    __slots__ = ("data", "size", "too_large")

    def __init__(self) -> None:
        self.data = bytearray()
        self.size = 0
        self.too_large = False


class _Staged(NamedTuple):
    """A received send waiting for the reactor's turn to end, to be committed with others."""

    entity: str
    messages: list[Any]
    raws: list[bytes]
    link: Any
    dlv: Any
    action: FaultAction
    connection: Any


class Transfers(HandlerBase):
    """Messages in (send transfers), messages out (receivers), and settlements."""

    incoming: dict[Any, _Incoming]
    pumping: set[Any]  # receivers whose poll is with the storage worker
    resting: dict[Any, float]  # receivers whose last poll found the file locked -> until
    staged: list[_Staged]  # sends received this turn, committed together at its end

    def init_transfers(self) -> None:
        self.staged = []
        self.incoming = {}
        self.pumping = set()
        self.resting = {}

    # -- incoming ---------------------------------------------------------------------------

    def transfer_limit(self, link: Any, node: Node | None) -> int:
        """The largest transfer a link takes: the entity's max message size plus slack."""
        if node is not None and node.kind == "entity" and link.max_message_size:
            return int(link.max_message_size) + SIZE_SLACK
        return self.emulator.limits.max_request_size

    def read_delivery(self, link: Any, dlv: Any, node: Node | None) -> bytes | None:
        """Take what has arrived of a transfer; its bytes once complete and within the limit.

        Oversized transfers are counted, not kept: memory stays bounded whatever a
        client declares or sends.
        """
        pending = self.incoming.get(dlv)
        if pending is None:
            if not dlv.partial:
                data = link.recv(dlv.pending)
                if len(data or b"") <= self.transfer_limit(link, node):
                    return bytes(data or b"")
                pending = _Incoming()
                pending.too_large = True
                pending.size = len(data or b"")
            else:
                pending = self.incoming[dlv] = _Incoming()
        chunk = link.recv(dlv.pending) if dlv.pending else b""
        chunk = chunk or b""
        pending.size += len(chunk)
        if not pending.too_large:
            if pending.size > self.transfer_limit(link, node):
                pending.too_large = True
                pending.data = bytearray()
            else:
                pending.data += chunk
        if dlv.partial:
            return None
        self.incoming.pop(dlv, None)
        if pending.too_large:
            limit = self.transfer_limit(link, node)
            self.settle(
                dlv,
                Delivery.REJECTED,
                condition(
                    MESSAGE_SIZE,
                    f"the transfer ({pending.size} bytes) exceeds the limit ({limit} bytes) "
                    "allowed on the link",
                ),
            )
            return None
        return bytes(pending.data)

    def on_transfer(self, link: Any, dlv: Any, node: Node, payload: bytes) -> None:
        entity = node.entity
        self.emulator._count(entity)
        action = self.emulator.faults.take(entity, "send")
        if action is FaultAction.SERVER_BUSY:
            self.settle(dlv, Delivery.REJECTED, condition(SERVER_BUSY, "server busy (injected)"))
            return
        if action is FaultAction.UNAUTHORIZED:
            refusal = condition(UNAUTHORIZED, "unauthorized (injected)")
            self.settle(dlv, Delivery.REJECTED, refusal)
            return
        if action is FaultAction.DROP_BEFORE_COMMIT:
            self.hard_close(link.connection)
            return
        try:
            decoded = [_codec.to_message(raw) for raw in _codec.unbatch(payload)]
        except ValidationError as exc:  # e.g. a message id over 128 characters
            self.settle(dlv, Delivery.REJECTED, condition(ARGUMENT_ERROR, describe(exc)))
            return
        except (_codec.CodecError, IndexError, ValueError) as exc:
            self.settle(dlv, Delivery.REJECTED, condition(DECODE_ERROR, describe(exc)))
            return
        messages = [d.message for d in decoded]
        raws = [d.raw for d in decoded]
        # Stored with whatever else arrives in this turn of the reactor, in one commit.
        self.staged.append(_Staged(entity, messages, raws, link, dlv, action, link.connection))

    def on_reactor_quiesced(self, event: Any) -> None:
        """Every event of this turn is handled: commit the sends it brought, together."""
        if not self.staged:
            return
        try:
            self.commit_staged()
        except Exception:  # a bug: never let it stop the reactor
            _log.exception("emulator failed storing received transfers")

    def commit_staged(self) -> None:
        """One transaction for the sends staged since the last commit (a group commit).

        Clients' transfers that arrive together share one commit; each is still
        acknowledged only after the commit that holds it. One that fails the group
        (a refused message) is stored on its own, as are the others.
        """
        staged, self.staged = self.staged, []
        sends = [(s.entity, s.messages, s.raws) for s in staged]

        def work(store: Any) -> list[Outcome[Any]]:
            return _store_work.send_together(store, sends, timeout=attempt_timeout())

        def done(outcome: Outcome[list[Outcome[Any]]]) -> None:
            outcomes = outcome.value if outcome.error is None else None
            woken: set[str] = set()
            answered: dict[Any, None] = {}  # connections, in order
            for i, send in enumerate(staged):
                if send.connection not in self.connections:
                    continue  # gone meanwhile: nothing to answer
                error = outcome.error if outcomes is None else outcomes[i].error
                try:
                    if error is not None:
                        self.settle(send.dlv, Delivery.REJECTED, store_condition(error))
                        continue
                    self.after_commit(send.link, send.dlv, send.action)
                except Exception:  # only this client's connection pays for it
                    _log.exception("emulator failed answering a transfer")
                    self.hard_close(send.connection)
                    continue
                answered[send.connection] = None
                woken.add(send.entity)
            for connection in answered:
                self.flush(connection)
            for entity in woken:
                self.wake_receivers(entity)

        self.submit(work, done, writes=True, patience=_STORE_TIMEOUT)

    def after_commit(self, link: Any, dlv: Any, action: FaultAction) -> None:
        if action is FaultAction.WITHHOLD:
            return  # stored, and the client never hears of it
        if action is FaultAction.DROP_AFTER_COMMIT:
            self.hard_close(link.connection)
            return
        if action is FaultAction.DETACH_AFTER_COMMIT:
            self.detach(link, condition(DETACH_FORCED, "link detached (injected)"))
            return
        self.settle(dlv, Delivery.ACCEPTED)

    # -- delivering to receivers -------------------------------------------------------------

    @guarded
    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_sender:
            self.flush_outbox(link)
            if link in self.senders:
                self.pump(link)

    def poll_receivers(self) -> None:
        now = time.monotonic()
        for link in list(self.senders):
            if link.credit > 0 and self.resting.get(link, 0.0) <= now:
                self.pump(link)

    def wake_receivers(self, entity: str) -> None:
        """A send committed to ``entity``: its receivers need not wait for the next poll."""
        for link in list(self.senders):
            node = self.nodes.get(link)
            if node is not None and node.entity == entity and link.credit > 0:
                self.pump(link)

    def pump(self, link: Any) -> None:
        """Ask the storage worker for messages for a receiver with credit (one ask at a time)."""
        node = self.nodes.get(link)
        if node is None or not link.state & Endpoint.LOCAL_ACTIVE or link in self.pumping:
            return
        if link.credit <= 0:
            if link.drain_mode:
                link.drained()
            return
        peek_lock = link.remote_snd_settle_mode != Link.SND_SETTLED
        mode: Literal["peek_lock", "receive_and_delete"] = (
            "peek_lock" if peek_lock else "receive_and_delete"
        )
        session = self.sessions.get(link)
        wanted = min(link.credit, 100)
        lock_duration = self.emulator.lock_duration

        def work(store: Any) -> list[tuple[Any, bytes]]:
            if session is not None:
                # Reads first itself; its messages are locked with the session.
                messages = session.receive(max_messages=wanted, mode=mode)
            # A read first: an empty poll must not take the broker's write lock.
            elif (
                store.count(node.entity, subscription=node.subscription, sub_queue=node.sub_queue)
                == 0
            ):
                return []
            else:
                messages = store.receive(
                    node.entity,
                    max_messages=wanted,
                    subscription=node.subscription,
                    mode=mode,
                    lock_duration=lock_duration,
                    sub_queue=node.sub_queue,
                )
            return [(m, _store_work.encode_received(m, peek_lock=peek_lock)) for m in messages]

        def done(outcome: Outcome[list[tuple[Any, bytes]]]) -> None:
            self.pumping.discard(link)
            self.deliver(link, node, session, peek_lock, outcome)

        self.pumping.add(link)
        # A read lane job: a poll must not wait behind writes held up by a locked file
        # (its own receive fails fast then, and the receiver rests a little).
        self.submit(work, done, writes=False, connection=link.connection, patience=0)

    def deliver(
        self,
        link: Any,
        node: Node,
        session: Any,
        peek_lock: bool,
        outcome: Outcome[list[tuple[Any, bytes]]],
    ) -> None:
        error = outcome.error
        if error is not None:
            if isinstance(error, SessionLockLostError):
                self.lose_session(link, describe(error))
            elif is_missing_entity(error):
                # Deleted while attached: Service Bus detaches the receiver.
                self.detach(link, condition(NOT_FOUND, describe(error)))
            elif is_busy_failure(error):
                self.resting[link] = time.monotonic() + _BUSY_BACKOFF
            else:
                _log.warning("receive from %r failed: %s", node.entity, describe(error))
                self.resting[link] = time.monotonic() + _BUSY_BACKOFF
            return
        items = outcome.get()
        if not link.state & Endpoint.LOCAL_ACTIVE or link.state & Endpoint.REMOTE_CLOSED:
            # The receiver went while the worker read: locked messages come back when
            # their locks run out (as Service Bus does), nothing else was taken.
            return
        for m, encoded in items:
            token = getattr(m, "lock_token", None)
            tag = _codec.lock_token_tag(token) if peek_lock and token else uuid.uuid4().bytes
            dlv = link.delivery(tag)
            link.stream(encoded)
            link.advance()
            if peek_lock and token:
                key = uuid.UUID(bytes_le=tag)
                until = getattr(m, "locked_until", None)
                locked = Locked(
                    node.entity,
                    node.subscription,
                    str(token),
                    key,
                    link.connection,
                    until,
                    node.sub_queue,
                    session,
                )
                self.locked[dlv] = locked
                self.tokens[key] = locked
            else:
                dlv.settle()
        if items and link.credit > 0:
            self.pump(link)  # more may be waiting
        elif link.drain_mode and link.credit > 0:
            link.drained()

    # -- settlement --------------------------------------------------------------------------

    def on_settlement(self, dlv: Any) -> None:
        locked = self.locked.pop(dlv, None)
        state = dlv.remote_state
        if locked is None:
            if dlv.settled:  # settled by the client
                dlv.settle()
            else:
                # Its lock expired (or its receiver went): the client waits for an answer.
                lost_lock = condition(LOCK_LOST, "the lock on the message is lost")
                self.settle(dlv, Delivery.REJECTED, lost_lock)
            return
        self.tokens.pop(locked.key, None)
        reason = description = None
        changes: _store_work.Changes = None
        if state == Delivery.REJECTED:
            # The client dead-letters with a rejected outcome whose error
            # (com.microsoft:dead-letter) carries the reason and description, and the
            # properties to modify beside them.
            error = dlv.remote.condition
            info = {str(k): v for k, v in dict(getattr(error, "info", None) or {}).items()}
            reason = _codec._text(info.get(_store_work.DEAD_LETTER_REASON))
            description = _codec._text(info.get(_store_work.DEAD_LETTER_DESCRIPTION))
            changes = _store_work.properties_to_modify(
                info,
                without=(_store_work.DEAD_LETTER_REASON, _store_work.DEAD_LETTER_DESCRIPTION),
            )
        elif state == Delivery.MODIFIED:
            # Abandon and defer: the modified outcome's message-annotations are the
            # properties to modify (AMQP 1.0, 3.4.5: annotations to combine with the
            # message's; Service Bus applies them to its application properties).
            changes = _store_work.properties_to_modify(_codec._copy(dlv.remote.annotations))
        undeliverable = state == Delivery.MODIFIED and bool(dlv.remote.undeliverable)

        def work(store: Any) -> None:
            if state == Delivery.ACCEPTED:
                _store_work.complete(store, locked)
            elif state == Delivery.REJECTED:
                _store_work.dead_letter(store, locked, reason, description, changes)
            elif undeliverable:
                # the client defers with modified, undeliverable-here
                _store_work.defer(store, locked, changes)
            else:
                _store_work.abandon(store, locked, changes)

        def done(outcome: Outcome[None]) -> None:
            if outcome.error is not None:
                exc = outcome.error
                self.settle(dlv, Delivery.REJECTED, condition(lost(exc), describe(exc)))
                return
            echo = (
                state
                if state
                in (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.MODIFIED, Delivery.RELEASED)
                else Delivery.ACCEPTED
            )
            self.settle(dlv, echo)

        self.submit(work, done, writes=True, connection=dlv.link.connection)
