"""What the sync and the aio Service Bus backends share: everything that does no I/O.

The two halves differ only in how they wait (threads and locks, or tasks on one loop):
the settings they keep, the checks before a transfer, the batch they fill, the profile an
administration answer becomes and the errors they raise are written here once, so the
halves cannot drift apart.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Self

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.servicebus.exceptions import MessageSizeExceededError

from ..._entity import DEFAULT_WINDOW, EntityKind, EntityProfile
from ..._message import Message
from ..._names import ByName, name_key
from ...errors import (
    ConfigurationError,
    KeyRuleError,
    MessageSizeError,
    NotSentError,
    TransientSendError,
    ValidationError,
    redact,
)
from .._base import Ack, Capabilities
from ._settings import check_timeout as _check_timeout
from ._settings import server_endpoint, settle

__all__ = [
    "DEFAULT_ADMIN_TIMEOUT",
    "DEFAULT_LINK_TIMEOUT",
    "MIN_TRANSFER_TIME",
    "ServiceBusShared",
    "admin_bounds",
    "check_entity",
    "fill_batch",
    "ids",
    "lookup_order",
    "profile_from_properties",
    "scheduled_acks",
    "skipped_kind",
]

DEFAULT_LINK_TIMEOUT = 60.0
DEFAULT_ADMIN_TIMEOUT = 30.0
MIN_TRANSFER_TIME = 0.001
"""Less time than this left for a transfer is none: it is not started (nothing sent)."""
_STANDARD_MAX_MESSAGE_KB = 256

logger = logging.getLogger("sendonce.servicebus")


def check_entity(entity: object) -> str:
    """``entity`` if it is a non-empty name, else the ``ConfigurationError`` naming it."""
    if not isinstance(entity, str) or not entity.strip():
        raise ConfigurationError("entity must be a non-empty queue or topic name", field="entity")
    return entity


def ids(messages: Sequence[Message]) -> dict[str, str | None]:
    """The message id and partition key an error names: only for a one-message transfer."""
    if len(messages) != 1:
        return {"message_id": None, "partition_key": None}
    one = messages[0]
    return {"message_id": one.message_id, "partition_key": one.partition_key or one.session_id}


def needs_profile(entity: str, why: str) -> ConfigurationError:
    """The error for an entity whose properties cannot be read: it asks for a profile."""
    return ConfigurationError(
        f"cannot read the properties of entity {entity!r} ({why}); pass an explicit profile, "
        f"e.g. AzureServiceBusBackend(..., profiles={{{entity!r}: EntityProfile({entity!r}, "
        "duplicate_detection=True, duplicate_detection_window=timedelta(minutes=10), "
        "partitioned=False, sessions=False)}) or IdempotentSender(backend, "
        "EntityProfile(...)), with the values the entity was created with",
        field="entity",
    )


def no_free_link(
    size: int, entity: str, timeout: float, messages: Sequence[Message]
) -> NotSentError:
    """Every lane stayed busy for the whole timeout: the transfer never started."""
    return NotSentError(
        f"all {size} links to {entity!r} stayed busy for the {timeout:g} s timeout "
        "(max_in_flight); nothing was sent",
        **ids(messages),
    )


def no_time_left(
    what: str, entity: str, timeout: float, messages: Sequence[Message]
) -> NotSentError:
    """``what`` (waiting for a link, opening it) used up the timeout before any transfer."""
    return NotSentError(
        f"{what} to {entity!r} used up the {timeout:g} s timeout; nothing was sent",
        **ids(messages),
    )


def link_too_slow(
    entity: str, namespace: str, timeout: float, messages: Sequence[Message]
) -> NotSentError:
    """Opening a link outlasted the timeout; nothing is sent while a link opens."""
    return NotSentError(
        f"opening a link to {entity!r} on {namespace!r} took longer than the "
        f"{timeout:g} s timeout; nothing was sent",
        **ids(messages),
    )


def fill_batch(batch: Any, entity: str, messages: list[Message], converted: list[Any]) -> Any:
    """Add ``converted`` to the client's empty ``batch``: what goes on the wire.

    One message that does not fit goes on its own (Premium allows large messages, where the
    link's size limit applies, not the batch's); several that do not fit are refused whole.
    """
    for index, (message, sb_message) in enumerate(zip(messages, converted, strict=True)):
        try:
            batch.add_message(sb_message)
        except MessageSizeExceededError:
            if len(messages) == 1:
                return sb_message
            raise MessageSizeError(
                f"message {message.message_id!r} (index {index}) does not fit in one "
                f"transfer of {len(messages)} messages to {entity!r}: the batch limit is "
                f"{batch.max_size_in_bytes} bytes; nothing was sent",
                field="messages",
            ) from None
    return batch


def scheduled_acks(numbers: Sequence[Any], count: int, entity: str) -> list[Ack]:
    """The acks of a schedule: one sequence number a message, a negative one unknown."""
    numbers = list(numbers)
    if len(numbers) != count:
        raise TransientSendError(
            f"schedule of {count} messages to {entity!r} returned {len(numbers)} "
            "sequence numbers: the outcome is in doubt"
        )
    return [Ack("accepted", int(n) if int(n) >= 0 else None) for n in numbers]


def lookup_order(kinds: ByName[EntityKind], entity: str) -> tuple[EntityKind, EntityKind]:
    """Which kinds to ask the administration API for, the likelier first."""
    first: EntityKind = kinds.get(entity, "queue")
    return (first, "topic") if first == "queue" else (first, "queue")


def admin_bounds(timeout: float) -> dict[str, float]:
    """Per request: an overall bound (azure-core's retry policy) and socket bounds."""
    return {"timeout": timeout, "connection_timeout": timeout, "read_timeout": timeout}


def skipped_kind(exc: Exception, entity: str) -> int:
    """After a failed administration GET: 1 if this kind is missing, 0 if the name is of the
    other kind; any other failure is raised, mapped."""
    if isinstance(exc, ResourceNotFoundError):
        return 1
    if isinstance(exc, AttributeError):
        # get_queue on a topic name (and get_topic on a queue name) finds the other
        # kind of description and fails to read it (azure-servicebus 7.x).
        return 0
    if isinstance(exc, HttpResponseError):
        status = getattr(exc, "status_code", None)
        if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
            raise needs_profile(
                entity, f"the credential may not read entity properties (HTTP {status})"
            ) from None
        if status == 404:
            raise needs_profile(entity, "the administration API is not there") from None
        raise TransientSendError(
            f"reading the properties of entity {entity!r} failed: "
            f"{type(exc).__name__} (HTTP {status})"
        ) from None
    if isinstance(exc, AzureError):
        raise TransientSendError(
            f"reading the properties of entity {entity!r} failed: {type(exc).__name__}: "
            f"{redact(str(exc))}"
        ) from None
    raise exc


def profile_from_properties(entity: str, kind: EntityKind, props: Any) -> EntityProfile:
    """The profile an administration API description says."""
    window = getattr(props, "duplicate_detection_history_time_window", None)
    if not isinstance(window, timedelta):
        window = DEFAULT_WINDOW
    size_kb = getattr(props, "max_message_size_in_kilobytes", None)
    if not isinstance(size_kb, int) or size_kb <= 0:
        size_kb = _STANDARD_MAX_MESSAGE_KB
    return EntityProfile(
        entity,
        kind=kind,
        duplicate_detection=bool(getattr(props, "requires_duplicate_detection", False)),
        duplicate_detection_window=window,
        partitioned=bool(getattr(props, "enable_partitioning", False)),
        sessions=bool(getattr(props, "requires_session", False)) if kind == "queue" else False,
        max_message_size=size_kb * 1024,
    )


class ServiceBusShared:
    """The state and the checks both backends have; each adds its own way of waiting."""

    _repr_name = "AzureServiceBusBackend"
    capabilities: Capabilities

    _client_class: Any
    """``azure.servicebus.ServiceBusClient`` or its ``aio`` twin."""
    _native_submit = False

    def __init__(
        self,
        *,
        client: Any = None,
        fully_qualified_namespace: str | None = None,
        credential: Any = None,
        connection_string: str | None = None,
        admin_client: Any = None,
        profiles: Mapping[str, EntityProfile] | None = None,
        kinds: Mapping[str, EntityKind] | None = None,
        transport_type: Any = None,
        link_timeout: float = DEFAULT_LINK_TIMEOUT,
        admin_timeout: float = DEFAULT_ADMIN_TIMEOUT,
        max_batch_size: int | None = None,
        max_in_flight: int | None = None,
        connection_sharing: bool | None = None,
        **client_kwargs: Any,
    ) -> None:
        settings = settle(
            client_class=self._client_class,
            default_credential=self._default_credential,
            client=client,
            fully_qualified_namespace=fully_qualified_namespace,
            credential=credential,
            connection_string=connection_string,
            profiles=profiles,
            kinds=kinds,
            transport_type=transport_type,
            link_timeout=link_timeout,
            admin_timeout=admin_timeout,
            max_batch_size=max_batch_size,
            max_in_flight=max_in_flight,
            client_kwargs=client_kwargs,
        )
        self._client = settings.client
        self._namespace = settings.namespace
        # OpenTelemetry's server.address / server.port (sendonce._telemetry reads them).
        self.server_address, self.server_port = server_endpoint(settings.namespace, self._client)
        self._credential: Any = settings.credential
        self._link_timeout = settings.link_timeout
        self._admin_timeout = settings.admin_timeout
        self._max_batch_size = settings.max_batch_size
        self._profiles = settings.profiles
        self._kinds = settings.kinds
        self._connection_string = settings.connection_string
        self._emulator = settings.emulator
        self._entity_path = settings.entity_path
        self._admin: Any = admin_client
        self._closed = False
        self._sharing = self._sharing_wanted(connection_sharing)
        self.capabilities = Capabilities(
            max_in_flight=settings.max_in_flight,
            messaging_system="servicebus",
            native_submit=self._native_submit,
        )
        self._start()
        logger.debug("created %r", self)

    @staticmethod
    def _default_credential() -> Any:
        """The credential when only a namespace is given (azure-identity's default chain)."""
        raise NotImplementedError

    def _start(self) -> None:
        """Set up the half's own state (its lanes, its lock)."""

    def _sharing_wanted(self, option: bool | None) -> bool:
        """Whether lanes are links on the process's shared connection (``_sharing``)."""
        del option
        return False

    @classmethod
    def from_connection_string(cls, conn_str: str, **options: Any) -> Self:
        """A backend for a connection string (``UseDevelopmentEmulator=true`` for the emulator)."""
        return cls(connection_string=conn_str, **options)

    def __repr__(self) -> str:
        extra = ", emulator=True" if self._emulator else ""
        return f"{self._repr_name}(namespace={self._namespace!r}{extra})"

    @property
    def namespace(self) -> str:
        """The fully qualified namespace (host, and port for the emulator); never a credential."""
        return self._namespace

    def _check_open(self, entity: str) -> None:
        """Refuse a closed backend, and an entity the connection string is not scoped to."""
        if self._closed:
            raise ConfigurationError("the backend is closed", field="backend")
        if self._entity_path is not None and name_key(entity) != name_key(self._entity_path):
            raise ConfigurationError(
                f"the connection string is scoped to entity {self._entity_path!r}, not {entity!r}",
                field="entity",
            )

    def _build_admin(self, admin_class: Any, entity: str) -> Any:
        """The administration client, from the connection string or a token credential."""
        if self._admin is not None:
            return self._admin
        try:
            if self._connection_string is not None:
                self._admin = admin_class.from_connection_string(self._connection_string)
            elif self._credential is not None:
                if not callable(getattr(self._credential, "get_token", None)):
                    raise needs_profile(
                        entity,
                        "the administration API needs a token credential such as "
                        "DefaultAzureCredential, or a connection string",
                    )
                self._admin = admin_class(self._namespace, self._credential)
            else:
                raise needs_profile(entity, "no credential for the administration API")
        except (ValueError, TypeError) as exc:
            raise needs_profile(entity, redact(str(exc))) from None
        return self._admin

    def _no_such_entity(self, entity: str, missing: int) -> ConfigurationError:
        """After both kinds were asked for: the entity is not there, or unreadable."""
        if missing == 2:
            return ConfigurationError(
                f"entity {entity!r} does not exist in namespace {self._namespace!r} "
                "(neither a queue nor a topic)",
                field="entity",
            )
        return needs_profile(entity, "the administration API returned no description")

    def _send_checks(
        self, entity: str, messages: Sequence[Message], timeout: float, atomic: bool
    ) -> tuple[str, float, list[Message]]:
        """The checks before a send: the entity, the timeout, no atomic group, the key rules."""
        entity = check_entity(entity)
        timeout = _check_timeout(timeout)
        if atomic:
            raise ConfigurationError(
                "Service Bus has no transactions in the Python client: an all-or-nothing group "
                "cannot be sent (use the local broker for transactional groups)",
                field="atomic",
            )
        batch = list(messages)
        if batch:
            self._check_transfer(entity, batch)
        return entity, timeout, batch

    def _schedule_checks(
        self, entity: str, messages: Sequence[Message], at: datetime, timeout: float
    ) -> tuple[str, float, list[Message]]:
        """The checks before a schedule: the entity, the timeout, an aware ``at``."""
        entity = check_entity(entity)
        timeout = _check_timeout(timeout)
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValidationError("at must be a timezone-aware datetime", field="at")
        return entity, timeout, list(messages)

    def _check_transfer(self, entity: str, messages: list[Message]) -> None:
        """Refuse a transfer the service would reject, when the entity's profile is known.

        The sender never builds one; this guards direct callers of ``send``.
        """
        profile = self._profiles.get(entity)
        if profile is None or len(messages) < 2:
            return
        if profile.partitioned and profile.duplicate_detection:
            raise KeyRuleError(
                f"entity {entity!r} is partitioned with duplicate detection: the service rejects "
                f"a batch of {len(messages)} messages there (azure-sdk-for-python #21955, "
                "#36333); send one message per transfer. Nothing was sent.",
                field="messages",
            )
        if profile.partitioned or profile.sessions:
            keys = {(m.partition_key, m.session_id) for m in messages}
            if len(keys) > 1:
                raise KeyRuleError(
                    f"one transfer to {entity!r} mixes partition keys or session ids "
                    f"({len(keys)} distinct); the service rejects such a batch. Nothing was sent.",
                    field="messages",
                )

    def _batch_size(self) -> dict[str, int]:
        """The keyword for ``create_message_batch``: the link's limit unless one was set."""
        return {} if self._max_batch_size is None else {"max_size_in_bytes": self._max_batch_size}

    _connect_hint = "sendonce.backends.connect(url) on the executor"

    def __getstate__(self) -> Any:
        raise TypeError(
            "AzureServiceBusBackend holds live connections and cannot be pickled: ship the "
            f"connection string and call {self._connect_hint}"
        )
