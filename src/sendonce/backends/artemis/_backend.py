"""``ArtemisBackend``: Red Hat AMQ Broker / Apache ActiveMQ Artemis over AMQP 1.0 (proton).

Duplicate detection on Artemis is the ``_AMQ_DUPL_ID`` message property, remembered in a
count-bounded ring per address (``id-cache-size``). This backend:

- sets ``_AMQ_DUPL_ID`` (a string) and the AMQP ``message-id`` to the business id
  (``_convert``);
- learns each message's fate from its delivery's disposition: Accepted is stored (a
  duplicate outside a transaction is Accepted too: Artemis drops it silently, as Service
  Bus does); Rejected / Released / Modified is a specific error, nothing stored; a
  connection or link lost before the disposition is *in doubt* and retried with the same
  id (``_errors``);
- keeps many transfers in flight on one connection and one link per address (unsettled
  deliveries, as many as the broker's credit allows); ``max_in_flight`` is how many
  transfers the sender hands it at once, and the sender keeps order per key
  (``_loop``);
- makes the count-bounded window real: a resend reaching further back than a safe part of
  the address's id cache is reported in doubt instead of sent (``_reach``);
- sends ``sender.transaction()`` groups as one AMQP transaction: all or nothing, and a
  duplicate member rolls the whole group back;
- refuses a peer that is not Artemis, or an acceptor with ``amqpDuplicateDetection=false``,
  before anything is sent.

How it is built (one concept per module): ``_url`` parses ``amqp://`` urls;
``_convert`` encodes a message; ``_requests`` holds the work callers hand the
event loop and wait for, ``_doorbell`` how they hand it over; ``_loop`` is
that loop (one thread owning every proton object: the connection), with its sender links
(``_links``) and transactions (``_transactions``); ``_shared`` shares one loop per broker
and credential; ``_management`` asks the broker's management address; ``_errors`` maps
outcomes and conditions to errors; ``_reach`` bounds resends by the id cache, ``_cache``
says which cache a resend would reach and ``_resend`` checks it before a resend. This module ties
them to the ``Backend`` protocol. Tests: ``tests/integration/artemis`` against the real
broker (``tests/artemis/broker.py`` runs it, ``tests/artemis/faultproxy.py`` cuts
connections, ``tests/artemis/raw.py`` is an independent proton client).

Addresses: an entity name is an Artemis address. An anycast address is a ``queue`` entity
(sender link capability ``queue``), a multicast one a ``topic`` (capability ``topic``);
``describe`` reads the address's routing types through the broker's management address,
or ``EntityProfile(kind=...)`` / ``kinds=`` says which. docs/artemis.md has the details.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from proton import SSLDomain

from ..._entity import DEFAULT_ID_CACHE_SIZE, EntityKind, EntityProfile
from ..._message import Message
from ...errors import (
    ConfigurationError,
    InDoubtError,
    NotSentError,
    PermanentSendError,
    SendError,
    TransientSendError,
    ValidationError,
    redact,
)
from .._base import Ack, Backend, Capabilities
from ..servicebus._lanes import check_max_in_flight
from . import _shared
from ._cache import Reached
from ._convert import encode
from ._errors import TLS_FAILED
from ._management import ManagementCall, ManagementRefused
from ._reach import Attempt, ResendReach
from ._requests import Connect, Transfer
from ._resend import ResendChecks

__all__ = ["ArtemisBackend"]

logger = logging.getLogger("sendonce.artemis")

DEFAULT_PORT = 5672
DEFAULT_TLS_PORT = 5671
DEFAULT_MAX_IN_FLIGHT = 16
DEFAULT_REACH = 0.5
DEFAULT_MAX_MESSAGE_SIZE = 100 * 1024 * 1024
"""Artemis sets no message size limit over AMQP (large messages go to files); the sender
still plans transfers by a size, and this one bounds them."""
_GROUP_MEMORY = 10_000
_LOOP_GRACE = 10.0
"""How long past a transfer's timeout ``send`` waits for the loop to give it up (it always
does: this only bounds a loop that died)."""


def _check_entity(entity: object) -> str:
    if not isinstance(entity, str) or not entity.strip():
        raise ConfigurationError("entity must be a non-empty address name", field="entity")
    return entity


def _positive(value: object, name: str) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{name} must be a positive number of seconds", field=name)
    return float(value)


class ArtemisBackend(Backend):
    """A backend that sends to Red Hat AMQ Broker / Apache ActiveMQ Artemis over AMQP 1.0.

    ``ArtemisBackend("broker.example", 5672, user="app", password="...")`` or
    ``connect("amqp://app:secret@broker.example:5672")`` (``amqps://`` for TLS). Keyword
    options:

    - ``tls``: TLS (``amqps``), verifying the broker's certificate and host name against the
      system's CAs, or against ``ca_file`` (a PEM file of the CAs to trust, such as a
      self-signed broker's certificate), unless ``ssl_domain`` (a ``proton.SSLDomain``)
      says otherwise;
    - ``profiles``: explicit :class:`EntityProfile` values by address name (they win over
      the broker's management answers; needed where the user may not manage);
    - ``kinds``: ``"queue"`` (anycast) or ``"topic"`` (multicast) by address name;
    - ``max_in_flight``: transfers carried at once (default 16);
    - ``resend_reach``: the fraction of an address's id cache a resend may reach back
      over, counted in the distinct ids this backend wrote to the address (default 0.5;
      see ``_reach``);
    - ``require_duplicate_detection``: refuse a peer that is not Artemis or an acceptor
      with duplicate detection off (default True);
    - ``connect_timeout``, ``management_timeout``: seconds; ``heartbeat``: the AMQP idle
      timeout asked of the broker, so a dead connection is noticed.

    One AMQP connection, one event-loop thread. Safe for many threads at once.
    """

    supports_atomic = True

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        tls: bool = False,
        ca_file: str | None = None,
        ssl_domain: SSLDomain | None = None,
        profiles: Mapping[str, EntityProfile] | None = None,
        kinds: Mapping[str, EntityKind] | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        resend_reach: float = DEFAULT_REACH,
        require_duplicate_detection: bool = True,
        connect_timeout: float = 30.0,
        management_timeout: float = 30.0,
        heartbeat: float = 60.0,
    ) -> None:
        if not isinstance(host, str) or not host.strip() or any(c in host for c in "/@?# "):
            raise ConfigurationError(
                f"host must be a host name or address, got {host!r}", field="host"
            )
        if port is None:
            port = DEFAULT_TLS_PORT if tls or ssl_domain is not None else DEFAULT_PORT
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ConfigurationError(
                f"port must be an int from 1 to 65535, got {port!r}", field="port"
            )
        if user is not None and (not isinstance(user, str) or not user):
            raise ConfigurationError("user must be a non-empty str or None", field="user")
        if password is not None and not isinstance(password, str):
            raise ConfigurationError("password must be a str or None", field="password")
        if password is not None and user is None:
            raise ConfigurationError("a password needs a user", field="user")
        if not isinstance(tls, bool):
            raise ConfigurationError("tls must be a bool", field="tls")
        if (
            not isinstance(resend_reach, int | float)
            or isinstance(resend_reach, bool)
            or not 0 < resend_reach <= 1
        ):
            raise ConfigurationError(
                f"resend_reach must be a fraction above 0 and at most 1, got {resend_reach!r}",
                field="resend_reach",
            )
        if not isinstance(require_duplicate_detection, bool):
            raise ConfigurationError(
                "require_duplicate_detection must be a bool", field="require_duplicate_detection"
            )
        self.capabilities = Capabilities(
            max_in_flight=check_max_in_flight(max_in_flight),
            messaging_system="activemq",
            atomic_groups=True,
            reports_duplicates=True,
            native_submit=True,
        )
        self._connect_timeout = _positive(connect_timeout, "connect_timeout")
        self._management_timeout = _positive(management_timeout, "management_timeout")
        heartbeat = _positive(heartbeat, "heartbeat")
        self.host, self.port, self.user = host, port, user
        # OpenTelemetry's server.address / server.port (sendonce._telemetry reads them).
        self.server_address, self.server_port = host, port
        self.tls = tls or ssl_domain is not None
        self.require_duplicate_detection = require_duplicate_detection
        if ca_file is not None:
            if not isinstance(ca_file, str) or not os.path.isfile(ca_file):
                raise ConfigurationError(
                    f"ca_file must name a PEM file of trusted CAs, got {ca_file!r}",
                    field="ca_file",
                )
            if ssl_domain is not None:
                raise ConfigurationError("give ca_file or ssl_domain, not both", field="ca_file")
            self.tls = True
        custom_tls = ssl_domain is not None
        if self.tls and ssl_domain is None:
            ssl_domain = SSLDomain(SSLDomain.MODE_CLIENT)
            if ca_file is not None and ssl_domain.set_trusted_ca_db(ca_file) != 0:
                raise ConfigurationError(
                    f"ca_file {ca_file!r} cannot be read as PEM certificates", field="ca_file"
                )
            ssl_domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        self._profiles: dict[str, EntityProfile] = {}
        self._kinds: dict[str, EntityKind] = dict(kinds or {})
        for name, profile in (profiles or {}).items():
            self._profiles[name] = self._checked_profile(profile)
        self._reach = ResendReach(float(resend_reach))
        self._resends = ResendChecks(self)
        self._doubtful_groups: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False
        self._loop_key, self._loop = _shared.acquire(
            ("domain", id(ssl_domain)) if custom_tls else ("tls", self.tls, ca_file),
            host=host,
            port=port,
            user=user,
            password=password,
            ssl_domain=ssl_domain,
            heartbeat=heartbeat,
            require_artemis=require_duplicate_detection,
            check_acceptor=require_duplicate_detection,
        )
        logger.debug("created %r", self)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ArtemisBackend:
        """A backend for ``amqp://user:password@host:port`` (``amqps://`` for TLS)."""
        from ._url import parse_amqp_url

        parsed = parse_amqp_url(url)
        return cls(**{**parsed, **options})

    def __repr__(self) -> str:
        scheme = "amqps" if self.tls else "amqp"
        who = f"{self.user}@" if self.user else ""
        return f"ArtemisBackend({scheme}://{who}{self.host}:{self.port})"

    @property
    def broker_version(self) -> str | None:
        """The broker's version from its open frame, once connected."""
        version = self._loop.peer.get("version")
        return None if version is None else str(version)

    # -- entities -------------------------------------------------------------------------

    def _checked_profile(self, profile: object) -> EntityProfile:
        if not isinstance(profile, EntityProfile):
            raise ConfigurationError("a profile must be an EntityProfile", field="profile")
        if profile.duplicate_detection and profile.id_cache_size is None:
            raise ConfigurationError(
                f"entity {profile.name!r}: Artemis remembers duplicate ids by count, not by "
                "time: give the address's id-cache-size, e.g. EntityProfile("
                f"{profile.name!r}, id_cache_size=20000), or let the backend describe it",
                field="id_cache_size",
            )
        if profile.partitioned:
            raise ConfigurationError(
                f"entity {profile.name!r}: Artemis addresses have no partitions "
                "(partitioned=False)",
                field="partitioned",
            )
        return profile

    def declare(self, profile: EntityProfile) -> None:
        """Record an explicit profile (``IdempotentSender`` calls this) and check the peer."""
        profile = self._checked_profile(profile)
        with self._lock:
            self._profiles[profile.name] = profile
            self._kinds[profile.name] = profile.kind
        self._verify_peer()

    def describe(self, entity: str) -> EntityProfile:
        """The profile of an existing address, read through the broker's management.

        ``kind`` from its routing types (anycast: ``queue``, multicast: ``topic``; both:
        ``queue``), ``id_cache_size`` from its address settings (or the broker's), whether
        the cache is persisted, and ``duplicate_detection`` from the acceptor. An address
        that does not exist is a ``ConfigurationError`` (pass a profile to let the broker
        create it on first send, where its address settings allow).
        """
        entity = _check_entity(entity)
        with self._lock:
            known = self._profiles.get(entity)
        if known is not None:
            return known
        self._verify_peer()
        try:
            info = self._manage("broker", "getAddressInfo", [entity])
        except ManagementRefused as exc:
            if "AMQ229203" in str(exc) or "does not exist" in str(exc).lower():
                raise ConfigurationError(
                    f"address {entity!r} does not exist on the broker at {self._loop.where}; "
                    "create it, or declare its id cache to let the broker auto-create it on "
                    "the first send (EntityProfile(name, id_cache_size=20000); sendonce "
                    "publish --id-cache-size 20000)",
                    field="entity",
                ) from None
            raise self._needs_profile(entity, str(exc)) from None
        settings = self._manage("broker", "getAddressSettingsAsJSON", [entity])
        cache = settings.get("idCacheSize") if isinstance(settings, dict) else None
        if not isinstance(cache, int):
            cache = self._manage("broker", "getIDCacheSize", [])
        persist = self._manage("broker", "isPersistIDCache", [])
        kind = self._kinds.get(entity) or _kind_of(info)
        acceptor = self._loop.acceptor or {}
        dedup = str(acceptor.get("amqpDuplicateDetection", "true")).lower() != "false"
        size = int(cache) if isinstance(cache, int) and cache > 0 else DEFAULT_ID_CACHE_SIZE
        profile = EntityProfile(
            entity,
            kind=kind,
            duplicate_detection=dedup,
            id_cache_size=size,
            persist_id_cache=persist is not False,
            max_message_size=_max_size(settings),
        )
        with self._lock:
            self._profiles[entity] = profile
            self._kinds[entity] = kind
        logger.debug("described %s as %r", entity, profile)
        return profile

    def _needs_profile(self, entity: str, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"cannot read the settings of address {entity!r} through the broker's management "
            f"({redact(why)}); pass an explicit profile, e.g. ArtemisBackend(..., profiles="
            f"{{{entity!r}: EntityProfile({entity!r}, id_cache_size=20000)}}) or "
            "IdempotentSender(backend, EntityProfile(...)), with the address's id-cache-size",
            field="entity",
        )

    def _verify_peer(self) -> None:
        """Connect now: a peer that is not Artemis, or refused credentials, fail here."""
        request = Connect()
        self._submit(request)
        if not request.wait(self._connect_timeout) and self._loop.abandon(request):
            logger.info(
                "the broker at %s did not answer within %gs; sends will retry",
                self._loop.where,
                self._connect_timeout,
            )
            return
        error = request.error
        if error is None:
            return
        if isinstance(error, ValidationError):
            raise error
        if isinstance(error, PermanentSendError) and error.condition == "amqp:unauthorized-access":
            raise ConfigurationError(str(error), field="password") from None
        if isinstance(error, PermanentSendError) and error.condition == TLS_FAILED:
            raise ConfigurationError(str(error), field="url") from None
        logger.info(
            "cannot reach the broker at %s yet (%s); sends will retry", self._loop.where, error
        )

    def _manage(self, resource: str, operation: str, params: list[Any]) -> Any:
        call = ManagementCall(resource, operation, params)
        self._submit(call)
        if not call.wait(self._management_timeout) and self._loop.abandon(call):
            raise TransientSendError(
                f"the broker at {self._loop.where} did not answer {resource}.{operation} "
                f"within {self._management_timeout:g}s"
            )
        if call.error is not None:
            raise call.error
        return call.value

    def _profile(self, entity: str) -> EntityProfile:
        with self._lock:
            known = self._profiles.get(entity)
        return known if known is not None else self.describe(entity)

    def _submit(self, request: Any) -> None:
        if self._closed:
            raise ConfigurationError("the backend is closed", field="backend")
        self._loop.submit(request)

    # -- sending --------------------------------------------------------------------------

    def submit(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> concurrent.futures.Future[list[Ack]]:
        """Hand one transfer to the event loop; a future its settlement completes.

        No thread waits on it: the loop writes the deliveries on the address's link beside
        the others in flight and completes the future from the broker's dispositions, or
        with ``TransientSendError`` (in doubt) / ``NotSentError`` when ``timeout`` passes.
        ``cancel()`` succeeds until the first delivery is written. A transfer that must
        first ask the broker (an address not described yet, a resend's check of where it
        would go) is prepared on the backend's pool instead of the caller's thread."""
        return self._begin(entity, messages, timeout=timeout, atomic=atomic, at=None)[0]

    def send(
        self, entity: str, messages: Sequence[Message], *, timeout: float, atomic: bool = False
    ) -> list[Ack]:
        """Send ``messages`` to an address as one transfer (one delivery each, pipelined;
        with ``atomic`` one AMQP transaction). Every ack is ``accepted``: outside a
        transaction Artemis accepts a duplicate and drops it, like a first send."""
        future, transfer = self._begin(
            entity, messages, timeout=timeout, atomic=atomic, at=None, may_block=True
        )
        return self._wait(future, transfer, timeout)

    def schedule(
        self, entity: str, messages: Sequence[Message], at: datetime, *, timeout: float
    ) -> list[Ack]:
        """Send ``messages`` for delivery at ``at`` (``x-opt-delivery-time``). Artemis
        returns no sequence number, so none can be cancelled through sendonce."""
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValidationError("at must be a timezone-aware datetime", field="at")
        future, transfer = self._begin(
            entity, messages, timeout=timeout, atomic=False, at=at, may_block=True
        )
        return self._wait(future, transfer, timeout)

    def _wait(
        self,
        future: concurrent.futures.Future[list[Ack]],
        transfer: Transfer | None,
        timeout: float,
    ) -> list[Ack]:
        """The future's acks. The loop completes it by ``timeout``; should the loop itself
        be gone, the transfer is given up here the same way."""
        try:
            return future.result(_positive(timeout, "timeout") + _LOOP_GRACE)
        except TimeoutError:
            if transfer is None or future.done():
                raise
        if self._loop.abandon(transfer):
            callback, transfer.on_done = transfer.on_done, None
            if callback is not None:
                callback()
        return future.result(_LOOP_GRACE)

    def _begin(
        self,
        entity: str,
        messages: Sequence[Message],
        *,
        timeout: float,
        atomic: bool,
        at: datetime | None,
        may_block: bool = False,
    ) -> tuple[concurrent.futures.Future[list[Ack]], Transfer | None]:
        """Prepare one transfer and hand it to the loop: its future, and the transfer
        (None when no transfer went to the loop)."""
        entity = _check_entity(entity)
        timeout = _positive(timeout, "timeout")
        messages = list(messages)
        if not messages:
            return _done([]), None
        ids = [m.message_id for m in messages]
        with self._lock:
            profile = self._profiles.get(entity)
        earlier = (
            None
            if profile is None or profile.id_cache_size is None
            else self._reach.earlier(entity, ids)
        )
        if not may_block and (profile is None or earlier):
            try:
                pending = self._submit_pool().submit(
                    self._prepared_and_sent, entity, messages, timeout, atomic, at
                )
            except RuntimeError:  # the pool stopped with the backend
                raise ConfigurationError("the backend is closed", field="backend") from None
            return pending, None
        if profile is None:
            profile = self.describe(entity)
        payloads = [encode(m, at=at) for m in messages]
        if atomic and len(set(ids)) < len(ids):
            # Artemis commits a transaction that carries one id twice and stores both copies
            # (checked on 2.40: test_local_alignment.py); the local broker's Artemis mode
            # ignores such a group, and so does this backend: nothing is sent, the repeat is
            # the duplicate, the others are reported ignored (sendonce:group-ignored).
            seen: set[str] = set()
            acks = []
            for message_id in ids:
                acks.append(Ack("duplicate" if message_id in seen else "ignored"))
                seen.add(message_id)
            logger.info("a group to %s repeats an id: ignored whole, nothing sent", entity)
            return _done(acks), None
        capability = "topic" if profile.kind == "topic" else "queue"
        transfer = Transfer(
            entity,
            capability,
            payloads,
            [(m.message_id, m.partition_key or m.session_id) for m in messages],
            atomic=atomic,
        )
        attempt = Attempt()
        expect: int | None = None
        if profile.id_cache_size is not None:
            if earlier is None:  # (described just now)
                earlier = self._reach.earlier(entity, ids)
            if earlier:
                expect = self._resends.check(entity, profile, earlier, messages[0])
            beyond = self._reach.admit(entity, ids, profile.id_cache_size, attempt)
            if beyond:
                first = beyond[0]
                raise InDoubtError(
                    f"message {first.message_id!r} is in doubt and is not resent: "
                    f"{first.distance} distinct ids this backend sent to address {entity!r} "
                    "may have entered its id cache since the first attempt that reached the "
                    f"broker, beyond the {first.limit} a resend may reach back over "
                    f"(resend_reach of the id cache of {profile.id_cache_size}); the broker "
                    "may no longer remember its id, so a resend could store it twice. Check "
                    "the address, or let a ledger decide.",
                    message_id=first.message_id,
                    partition_key=messages[0].partition_key,
                )
        transfer.expect = expect
        transfer.deadline = time.monotonic() + timeout
        future: concurrent.futures.Future[list[Ack]] = concurrent.futures.Future()
        transfer.future = future

        def settle() -> None:
            if transfer.sent_on is not None and attempt.reached is None:
                attempt.reached = Reached(
                    transfer.sent_on, self._resends.generation(entity), profile.persist_id_cache
                )
            try:
                acks: list[Ack] | None = self._outcome(
                    transfer, messages, ids, timeout=timeout, atomic=atomic
                )
                error: Exception | None = None
            except Exception as exc:
                acks, error = None, exc
            # The reach hears of the attempt before the caller does: a retry admitted after
            # the future completes sees this attempt's written ids (h-artemis's rule).
            self._reach.settle(attempt, _written(transfer))
            if error is not None:
                _complete(future, error=error)
            else:
                _complete(future, acks)

        transfer.on_done = settle

        def cancelled(done: concurrent.futures.Future[list[Ack]]) -> None:
            if done.cancelled():  # before its first delivery: nothing written, nothing counted
                self._reach.settle(attempt, _written(transfer))

        future.add_done_callback(cancelled)
        self._submit(transfer)
        return future, transfer

    def _prepared_and_sent(
        self,
        entity: str,
        messages: list[Message],
        timeout: float,
        atomic: bool,
        at: datetime | None,
    ) -> list[Ack]:
        """A submitted transfer that had to ask the broker first, on the backend's pool."""
        future, transfer = self._begin(
            entity, messages, timeout=timeout, atomic=atomic, at=at, may_block=True
        )
        return self._wait(future, transfer, timeout)

    def _outcome(
        self,
        transfer: Transfer,
        messages: list[Message],
        ids: list[str],
        *,
        timeout: float,
        atomic: bool,
    ) -> list[Ack]:
        """The acks of a transfer the loop finished, or its error; a transfer not finished
        was given up at its deadline (in doubt if anything of it was written)."""
        entity = transfer.entity
        if not transfer.finished:
            with transfer.lock:
                sent = transfer.sent if not atomic else int(transfer.commit_sent)
            if atomic and transfer.commit_sent:
                self._remember_doubtful(ids)
            cls = TransientSendError if sent else NotSentError
            raise cls(
                f"no answer from the broker at {self._loop.where} within {timeout:g}s for "
                f"{len(messages)} message(s) to {entity!r}"
                + (": they may or may not be stored (in doubt)" if sent else "; nothing was sent"),
                condition="amqp:timeout",
                **_named(messages),
            )
        error = transfer.error
        if error is not None:
            doubtful = isinstance(error, TransientSendError) and not isinstance(error, NotSentError)
            if atomic and doubtful:
                self._remember_doubtful(ids)
            if isinstance(error, SendError) and error.message_id is None and len(messages) == 1:
                error = error.for_message(messages[0].message_id, messages[0].partition_key)
            raise error
        value = transfer.value
        if isinstance(value, tuple) and value[0] == "duplicate-group":
            return self._group_acks(ids, value[1])
        logger.debug("sent %d message(s) to %s", len(messages), entity)
        return [Ack("accepted") for _ in messages]

    def _remember_doubtful(self, ids: list[str]) -> None:
        with self._lock:
            self._doubtful_groups[tuple(ids)] = None
            while len(self._doubtful_groups) > _GROUP_MEMORY:
                self._doubtful_groups.popitem(last=False)

    def _group_acks(self, ids: list[str], culprit: str) -> list[Ack]:
        """A transaction rolled back because ``culprit`` is a duplicate.

        Artemis names only the *last* duplicate it met, in send order (measured on 2.40).
        After an in-doubt commit of this very group, a rollback naming its last member is
        our own earlier commit having landed: every member is a duplicate. Otherwise the
        named member is the duplicate and the rest were ignored with it (nothing of the
        group stored), as the local broker's Artemis mode reports it.
        """
        with self._lock:
            resent = tuple(ids) in self._doubtful_groups
            self._doubtful_groups.pop(tuple(ids), None)
        if resent and culprit == ids[-1]:
            return [Ack("duplicate") for _ in ids]
        return [Ack("duplicate" if i == culprit else "ignored") for i in ids]

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and stop the event loop. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_submissions()
        _shared.release(self._loop_key, self._loop, 5.0)

    def __getstate__(self) -> Any:
        raise TypeError(
            "ArtemisBackend holds a live connection and cannot be pickled: ship the url and "
            "call sendonce.backends.connect(url) on the executor"
        )

    def __del__(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None and not getattr(self, "_closed", True):
            self._closed = True
            with contextlib.suppress(Exception):  # interpreter shutdown
                _shared.release(self._loop_key, loop, 0.0)


def _done(acks: list[Ack]) -> concurrent.futures.Future[list[Ack]]:
    future: concurrent.futures.Future[list[Ack]] = concurrent.futures.Future()
    future.set_result(acks)
    return future


def _complete(
    future: concurrent.futures.Future[list[Ack]],
    acks: list[Ack] | None = None,
    *,
    error: BaseException | None = None,
) -> None:
    """Complete ``future`` unless its caller cancelled it (before anything was sent)."""
    if future.cancelled():
        return
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(acks if acks is not None else [])


def _written(transfer: Transfer) -> int:
    """How many of a finished (or abandoned) transfer's messages went on the wire, for the
    resend reach: the deliveries handed to proton, in order; a transaction's messages all,
    once any delivery went (whether its commit did is decided on the loop thread)."""
    with transfer.lock:
        sent = transfer.sent
    if transfer.atomic:
        return len(transfer.payloads) if sent else 0
    return sent


def _named(messages: Sequence[Message]) -> dict[str, str | None]:
    if len(messages) != 1:
        return {"message_id": None, "partition_key": None}
    return {"message_id": messages[0].message_id, "partition_key": messages[0].partition_key}


def _kind_of(info: Any) -> EntityKind:
    """``queue`` unless the address routes multicast only."""
    text = str(info).upper()
    return "topic" if "MULTICAST" in text and "ANYCAST" not in text else "queue"


def _max_size(settings: Any) -> int:
    """A message larger than the address's ``max-size-bytes`` under the FAIL policy can
    never be stored there; otherwise Artemis sets no limit."""
    if isinstance(settings, dict) and str(settings.get("addressFullMessagePolicy")) == "FAIL":
        limit = settings.get("maxSizeBytes")
        if isinstance(limit, int) and limit > 0:
            return max(limit, 1024)
    return DEFAULT_MAX_MESSAGE_SIZE
