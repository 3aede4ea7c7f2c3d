"""``$cbs`` and ``$management`` requests: each answered with a reply, errors included."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from proton import Delivery, Endpoint, Message, symbol

from ..backends.local import MessageNotFoundError
from ..errors import SessionCannotBeLockedError, SessionLockLostError
from . import _codec, _store_work
from ._base import HandlerBase
from ._conditions import (
    ARGUMENT_ERROR,
    DECODE_ERROR,
    DETACH_FORCED,
    INTERNAL_ERROR,
    LOCK_LOST,
    MESSAGE_NOT_FOUND,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    SERVER_BUSY,
    SESSION_LOCK_LOST,
    UNAUTHORIZED,
    ManagementError,
    condition,
    describe,
    is_missing_entity,
    lost,
    store_condition,
)
from ._faults import FaultAction
from ._nodes import Locked, Node, strip_address
from ._worker import Outcome, attempt_timeout, is_busy_failure

__all__ = ["Management"]

_log = logging.getLogger("sendonce.emulator")

_STORE_TIMEOUT = 30.0

Status = tuple[int, str | None]
# What a management operation is: work for the storage worker, then how its result
# becomes the reply (status, body), run back on the reactor thread.
Operation = tuple[Callable[[Any], Any], Callable[[Any], tuple[Status, Any]], bool]


class _Fault(Exception):
    def __init__(self, action: FaultAction) -> None:
        super().__init__(action.value)
        self.action = action


class Management(HandlerBase):
    """The request/response nodes: token puts on ``$cbs``, operations on ``$management``."""

    def request(self, dlv: Any, payload: bytes) -> Message | None:
        request = Message()
        try:
            request.decode(payload)
        except Exception as exc:
            self.settle(dlv, Delivery.REJECTED, condition(DECODE_ERROR, describe(exc)))
            return None
        self.settle(dlv, Delivery.ACCEPTED)
        return request

    def on_cbs(self, link: Any, dlv: Any, payload: bytes) -> None:
        request = self.request(dlv, payload)
        if request is None:
            return
        self.reply(link, request, {"status-code": 200, "status-description": "OK"}, None)

    def reply(self, link: Any, request: Message, properties: dict[str, Any], body: Any) -> None:
        reply = Message()
        reply.correlation_id = request.id
        reply.properties = properties  # type: ignore[assignment]
        if body is not None:
            reply.body = body
        encoded = bytes(reply.encode())
        target = self._reply_link(link, request.reply_to)
        if target is None:
            _log.warning("no reply link for %r", request.reply_to)
            return
        state = self.connections.get(link.connection)
        if state is None:
            return
        state.outbox.setdefault(target, []).append(encoded)
        self.flush_outbox(target)

    def _reply_link(self, link: Any, reply_to: str | None) -> Any:
        source = strip_address(link.remote_target.address)
        fallback = None
        other = link.connection.link_head(Endpoint.LOCAL_ACTIVE)
        while other is not None:
            if other.is_sender:
                if reply_to and other.remote_target.address == reply_to:
                    return other
                if strip_address(other.remote_source.address) == source:
                    fallback = other
            other = other.next(Endpoint.LOCAL_ACTIVE)
        return fallback

    def on_management(self, link: Any, dlv: Any, node: Node, payload: bytes) -> None:
        request = self.request(dlv, payload)
        if request is None:
            return
        request_props: dict[Any, Any] = dict(request.properties or {})
        props = {str(k): v for k, v in request_props.items()}
        operation = str(props.get("operation", ""))
        try:
            body = _codec._copy(request.body)
            work, finish, writes = self._operation(link, node, operation, body, payload)
        except Exception as exc:
            self._answer(link, request, exc, None)
            return

        def done(outcome: Outcome[Any]) -> None:
            try:
                result = finish(outcome.get())
            except Exception as exc:
                self._answer(link, request, exc, None)
                return
            self._answer(link, request, None, result)

        self.submit(work, done, writes=writes, connection=link.connection)

    def _answer(
        self,
        link: Any,
        request: Message,
        error: BaseException | None,
        result: tuple[Status, Any] | None,
    ) -> None:
        """Reply to a request: its result, or its error as a status (never a dropped connection)."""
        description = "OK"
        reply_body = None
        if result is not None:
            status, reply_body = result
        elif isinstance(error, _Fault):
            if error.action is FaultAction.SERVER_BUSY:
                status = (503, SERVER_BUSY)
            elif error.action is FaultAction.UNAUTHORIZED:
                status = (401, UNAUTHORIZED)
            else:
                return  # dropped, detached or withheld: no reply
        elif isinstance(error, ManagementError):
            status, description = (error.status, error.condition), error.description
        elif error is not None and is_busy_failure(error):
            status, description = (503, SERVER_BUSY), describe(error)
        elif error is not None and is_missing_entity(error):
            status, description = (404, NOT_FOUND), describe(error)
        else:
            _log.warning("management operation failed: %r", error)
            status = (500, INTERNAL_ERROR)
            description = f"{type(error).__name__}: {describe(error)}" if error else "failed"
        code, error_condition = status
        properties: dict[str, Any] = {"statusCode": code, "statusDescription": description}
        if error_condition:
            properties["errorCondition"] = symbol(error_condition)
            if description == "OK":
                properties["statusDescription"] = error_condition
        self.reply(link, request, properties, reply_body)

    def _operation(
        self, link: Any, node: Node, operation: str, body: Any, payload: bytes
    ) -> Operation:
        body = body if isinstance(body, dict) else {}
        body = {str(k): v for k, v in body.items()}
        if operation == "com.microsoft:schedule-message":
            return self._schedule(link, node, payload)
        if operation == "com.microsoft:cancel-scheduled-message":
            seqs = [int(s) for s in body.get("sequence-numbers") or []]

            def cancel(store: Any) -> None:
                # Service Bus answers "Messages not found" for a number that names no waiting
                # message (unknown, cancelled, or activated already) and cancels none.
                try:
                    store.cancel_scheduled(node.entity, seqs, missing_ok=False)
                except MessageNotFoundError as exc:
                    raise ManagementError(
                        404, MESSAGE_NOT_FOUND, f"Messages not found: {describe(exc)}"
                    ) from exc
                except Exception as exc:
                    if is_busy_failure(exc):
                        raise
                    raise ManagementError(404, NOT_FOUND, describe(exc)) from exc

            return cancel, lambda _: ((200, None), {}), True
        if operation == "com.microsoft:update-disposition":
            return self._update_disposition(body)
        if operation == "com.microsoft:renew-lock":
            return self._renew(body)
        if operation == "com.microsoft:peek-message":
            return self._peek(node, body)
        if operation == "com.microsoft:receive-by-sequence-number":
            return self._receive_deferred(link, node, body)
        if operation in (
            "com.microsoft:renew-session-lock",
            "com.microsoft:get-session-state",
            "com.microsoft:set-session-state",
        ):
            return self._session_operation(node, operation, body)
        raise ManagementError(501, NOT_IMPLEMENTED, f"{operation!r} is not emulated")

    # -- scheduling ---------------------------------------------------------------------------

    def _schedule(self, link: Any, node: Node, payload: bytes) -> Operation:
        entity = node.entity
        self.emulator._count(entity)
        action = self.emulator.faults.take(entity, "schedule")
        if action in (FaultAction.SERVER_BUSY, FaultAction.UNAUTHORIZED):
            raise _Fault(action)
        if action is FaultAction.DROP_BEFORE_COMMIT:
            self.hard_close(link.connection)
            raise _Fault(action)
        try:
            decoded = [_codec.to_message(raw) for raw in _codec.scheduled_messages(payload)]
        except Exception as exc:
            raise ManagementError(400, DECODE_ERROR, describe(exc)) from exc
        if not decoded:
            return (lambda store: []), lambda seqs: ((200, None), {"sequence-numbers": seqs}), False
        at = decoded[0].message.scheduled_enqueue_time
        if at is None:
            raise ManagementError(400, ARGUMENT_ERROR, "x-opt-scheduled-enqueue-time is missing")
        messages = [d.message for d in decoded]
        raws = [d.raw for d in decoded]

        def work(store: Any) -> list[int]:
            try:
                acks = store.schedule(entity, messages, at, timeout=attempt_timeout(), raw=raws)
            except Exception as exc:
                if is_busy_failure(exc):
                    raise
                cond = store_condition(exc)
                status = 503 if cond.name == SERVER_BUSY else 404 if cond.name == NOT_FOUND else 400
                raise ManagementError(status, str(cond.name), cond.description or "") from exc
            # A copy dropped as a duplicate still has its number (Azure/azure-service-bus#265).
            return [int(a.sequence_number) if a.sequence_number is not None else -1 for a in acks]

        def finish(seqs: list[int]) -> tuple[Status, Any]:
            if action is not FaultAction.NONE:
                self._after_commit(link, action)
                raise _Fault(action)
            return (200, None), {"sequence-numbers": seqs}

        return work, finish, True

    def _after_commit(self, link: Any, action: FaultAction) -> None:
        if action is FaultAction.DROP_AFTER_COMMIT:
            self.hard_close(link.connection)
        elif action is FaultAction.DETACH_AFTER_COMMIT:
            self.detach(link, condition(DETACH_FORCED, "link detached (injected)"))

    # -- settlement and locks -----------------------------------------------------------------

    def _update_disposition(self, body: dict[str, Any]) -> Operation:
        status = str(body.get("disposition-status", ""))
        reason = _codec._text(body.get("deadletter-reason"))
        description = _codec._text(body.get("deadletter-description"))
        changes = _store_work.properties_to_modify(body.get("properties-to-modify"))
        taken: list[Locked] = []
        for token in body.get("lock-tokens") or []:
            locked = self.tokens.pop(_as_uuid(token), None)
            if locked is None:
                raise ManagementError(410, LOCK_LOST, "the lock on the message is lost")
            taken.append(locked)

        def work(store: Any) -> None:
            for locked in taken:
                try:
                    if status == "completed":
                        _store_work.complete(store, locked)
                    elif status == "defered":  # sic: the client's spelling
                        _store_work.defer(store, locked, changes)
                    elif status == "suspended":  # the management form of dead-lettering
                        _store_work.dead_letter(store, locked, reason, description, changes)
                    else:
                        _store_work.abandon(store, locked, changes)
                except Exception as exc:
                    if is_busy_failure(exc):
                        raise
                    raise ManagementError(410, lost(exc), describe(exc)) from exc

        def finish(_: None) -> tuple[Status, Any]:
            settled = {locked.key for locked in taken}
            for dlv, locked in list(self.locked.items()):
                if locked.key in settled:
                    self.locked.pop(dlv, None)
                    dlv.settle()
            return (200, None), {}

        return work, finish, True

    def _renew(self, body: dict[str, Any]) -> Operation:
        held: list[Locked] = []
        for token in body.get("lock-tokens") or []:
            locked = self.tokens.get(_as_uuid(token))
            if locked is None:
                raise ManagementError(410, LOCK_LOST, "the lock on the message is lost")
            held.append(locked)
        lock_duration = self.emulator.lock_duration

        def work(store: Any) -> list[datetime]:
            untils = []
            for locked in held:
                try:
                    until = store.renew_lock(
                        locked.entity,
                        locked.lock_token,
                        subscription=locked.subscription,
                        lock_duration=lock_duration,
                        sub_queue=locked.sub_queue,
                    )
                except Exception as exc:
                    if is_busy_failure(exc):
                        raise
                    raise ManagementError(410, LOCK_LOST, describe(exc)) from exc
                untils.append(until)
            return untils

        def finish(untils: list[datetime]) -> tuple[Status, Any]:
            for locked, until in zip(held, untils, strict=True):
                locked.locked_until = until
            return (200, None), {"expirations": [_codec._ms(u) for u in untils]}

        return work, finish, True

    # -- sessions ------------------------------------------------------------------------------

    def _held_session(self, node: Node, session_id: str | None) -> Any:
        """The session this emulator holds for a management request's session-id."""
        for session in self.sessions.values():
            if (
                session.session_id == session_id
                and session.entity == node.entity
                and session.subscription == node.subscription
            ):
                return session
        return None

    def _session_operation(self, node: Node, operation: str, body: dict[str, Any]) -> Operation:
        session_id = _codec._text(body.get("session-id"))
        session = self._held_session(node, session_id)
        if session is None:
            raise ManagementError(410, SESSION_LOCK_LOST, f"session {session_id!r} is not locked")
        state = body.get("session-state")

        # Session state lives in the broker file: it outlives the emulator and
        # local:// consumers see it (LocalBackend.get/set_session_state).
        def work(store: Any) -> Any:
            try:
                if operation.endswith("renew-session-lock"):
                    # Renews the locks of the session's messages too (they have none of their own).
                    return {"expiration": _codec._ms(session.renew_lock())}
                if operation.endswith("get-session-state"):
                    return {"session-state": session.get_state()}
                session.set_state(bytes(state) if state is not None else None)
            except SessionLockLostError as exc:
                raise ManagementError(410, SESSION_LOCK_LOST, describe(exc)) from exc
            return {}

        return work, lambda reply: ((200, None), reply), True

    # -- reading ------------------------------------------------------------------------------

    def _peek(self, node: Node, body: dict[str, Any]) -> Operation:
        count = int(body.get("message-count") or 1)
        start = body.get("from-sequence-number")
        # A session receiver's peek carries its session: it browses that session only.
        session_id = _codec._text(body.get("session-id"))

        def work(store: Any) -> list[bytes]:
            messages = store.peek(
                node.entity,
                max_messages=count,
                subscription=node.subscription,
                session_id=session_id,
                from_sequence_number=int(start) if start is not None else None,
                sub_queue=node.sub_queue,
            )
            return [_store_work.encode_received(m, peek_lock=False, peeked=True) for m in messages]

        def finish(encoded: list[bytes]) -> tuple[Status, Any]:
            if not encoded:
                return (204, None), None
            return (200, None), {"messages": [{"message": e} for e in encoded]}

        return work, finish, False

    def _receive_deferred(self, link: Any, node: Node, body: dict[str, Any]) -> Operation:
        seqs = [int(s) for s in body.get("sequence-numbers") or []]
        settle_mode = body.get("receiver-settle-mode")
        peek_lock = settle_mode is None or int(settle_mode) == 1
        session_id = _codec._text(body.get("session-id"))
        mode: Literal["peek_lock", "receive_and_delete"] = (
            "peek_lock" if peek_lock else "receive_and_delete"
        )
        session = self._held_session(node, session_id) if session_id is not None else None
        lock_duration = self.emulator.lock_duration

        def work(store: Any) -> list[tuple[Any, bytes]]:
            try:
                if session is not None:
                    messages = session.receive_deferred(seqs, mode=mode)
                else:
                    messages = store.receive_deferred(
                        node.entity,
                        seqs,
                        subscription=node.subscription,
                        session_id=session_id,
                        mode=mode,
                        lock_duration=lock_duration,
                    )
            except (SessionLockLostError, SessionCannotBeLockedError) as exc:
                raise ManagementError(410, SESSION_LOCK_LOST, describe(exc)) from exc
            except Exception as exc:
                if is_busy_failure(exc):
                    raise
                raise ManagementError(404, MESSAGE_NOT_FOUND, describe(exc)) from exc
            return [
                (m, _store_work.encode_received(m, peek_lock=peek_lock, state=_store_work.DEFERRED))
                for m in messages
            ]

        def finish(received: list[tuple[Any, bytes]]) -> tuple[Status, Any]:
            out = []
            for m, encoded in received:
                item: dict[str, Any] = {"message": encoded}
                if peek_lock and m.lock_token:
                    key = uuid.UUID(bytes_le=_codec.lock_token_tag(m.lock_token))
                    self.tokens[key] = Locked(
                        node.entity,
                        node.subscription,
                        m.lock_token,
                        key,
                        link.connection,
                        getattr(m, "locked_until", None),
                        session=session,
                    )
                    item["lock-token"] = key
                out.append(item)
            return (200, None), {"messages": out}

        return work, finish, True


def _as_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes | bytearray) and len(value) == 16:
        return uuid.UUID(bytes=bytes(value))
    return uuid.UUID(str(value))
