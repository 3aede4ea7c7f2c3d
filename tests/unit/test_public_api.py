"""The public names of DESIGN.md §3 are a contract: code outside the package uses them."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

import sendonce
import sendonce.backends.local
import sendonce.spark

CONTRACT = {
    "sendonce": [
        "MessageIdTemplate",
        "content_message_id",
        "Message",
        "MessageSpec",
        "EntityProfile",
        "RetryPolicy",
        "IdempotentSender",
        "SendResult",
        "SendReport",
        "SendOnceError",
        "ValidationError",
        "MessageIdError",
        "KeyRuleError",
        "MessageSizeError",
        "ConfigurationError",
        "SendError",
        "TransientSendError",
        "PermanentSendError",
        "InDoubtError",
        "PayloadConflictError",
        "LockLostError",
        "SessionCannotBeLockedError",
        "SessionLockLostError",
        "NoSessionAvailableError",
        "NotSentError",
        "NotStoredError",
        "AttemptNotSentError",
        "NeverSentError",
        "LedgerError",
        "PublishFailedError",
        "Ledger",
    ],
    "sendonce.errors": [
        "SendOnceError",
        "ValidationError",
        "MessageIdError",
        "KeyRuleError",
        "MessageSizeError",
        "ConfigurationError",
        "SendError",
        "TransientSendError",
        "PermanentSendError",
        "InDoubtError",
        "PayloadConflictError",
        "LockLostError",
        "SessionCannotBeLockedError",
        "SessionLockLostError",
        "NoSessionAvailableError",
        "NotSentError",
        "NotStoredError",
        "AttemptNotSentError",
        "NeverSentError",
        "LedgerError",
        "PublishFailedError",
        "redact",
    ],
    "sendonce.backends": [
        "Backend",
        "Ack",
        "connect",
        "LocalBackend",
        "LocalSession",
        "AzureServiceBusBackend",
    ],
    "sendonce.backends.local": [
        "LocalBackend",
        "LocalSession",
        "BrokerFileError",
        "BrokerStorageError",
        "MessageNotFoundError",
        "LockLostError",
        "SessionLockLostError",
        "SessionCannotBeLockedError",
        "NoSessionAvailableError",
    ],
    "sendonce.testing": ["FaultyBackend", "Fault"],
    "sendonce.telemetry": ["configure", "use", "reset", "Exporting"],
    "sendonce.emulator": ["Emulator"],
    "sendonce.spark": [
        "publish",
        "partition_publisher",
        "batch_publisher",
        "PublishReport",
        "PublishFailedError",
        "SchemaError",
        "ConflictingRowsError",
        "LateReexecutionError",
        "PartitionFailedError",
    ],
}


# DESIGN.md §3 names that moved or were renamed: they still work, with a DeprecationWarning.
DEPRECATED = {
    (module, name)
    for module in ("sendonce", "sendonce.errors")
    for name in (
        "NotSentError",
        "NotStoredError",
        "LockLostError",
        "SessionLockLostError",
        "SessionCannotBeLockedError",
        "NoSessionAvailableError",
    )
}

# The short list a producer needs (DESIGN.md §4: ``__init__.py``'s sorted ``__all__``).
SHORT_LIST = [
    "EntityProfile",
    "IdempotentSender",
    "InDoubtError",
    "Ledger",
    "LedgerError",
    "Message",
    "MessageIdTemplate",
    "MessageSpec",
    "NeverSentError",
    "PayloadConflictError",
    "PermanentSendError",
    "RetryPolicy",
    "SendError",
    "SendOnceError",
    "SendReport",
    "SendResult",
    "TransientSendError",
    "ValidationError",
    "content_message_id",
]


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, ns in CONTRACT.items() for n in ns])
def test_contract_name_is_importable(module: str, name: str) -> None:
    if (module, name) in DEPRECATED:
        with pytest.warns(DeprecationWarning, match=rf"{module}\.{name} is deprecated"):
            assert getattr(importlib.import_module(module), name) is not None
    else:
        assert getattr(importlib.import_module(module), name) is not None


def test_the_top_level_all_is_the_short_list() -> None:
    assert sendonce.__all__ == SHORT_LIST


def test_all_is_sorted_and_complete() -> None:
    assert list(sendonce.__all__) == sorted(sendonce.__all__)
    for name in sendonce.__all__:
        assert hasattr(sendonce, name)


def test_the_version_is_a_pep_440_release_number() -> None:
    # The one place the version is set: the build reads this attribute (pyproject.toml).
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?",
                        sendonce.__version__)  # fmt: skip


def test_an_error_exported_from_two_modules_is_one_class() -> None:
    assert sendonce.spark.PublishFailedError is sendonce.PublishFailedError
    with pytest.warns(DeprecationWarning):
        assert sendonce.backends.local.LockLostError is sendonce.LockLostError


def test_error_tree_matches_the_design() -> None:
    e = sendonce
    assert issubclass(e.ValidationError, e.SendOnceError) and issubclass(
        e.ValidationError, ValueError
    )
    for sub in (e.MessageIdError, e.KeyRuleError, e.MessageSizeError, e.ConfigurationError):
        assert issubclass(sub, e.ValidationError)
    for sub in (e.TransientSendError, e.PermanentSendError, e.InDoubtError, e.PayloadConflictError):
        assert issubclass(sub, e.SendError) and not issubclass(sub, e.ValidationError)


@pytest.mark.parametrize(
    ("factory", "keyword_only"),
    [
        (sendonce.MessageIdTemplate, {"max_length", "overflow"}),
        (
            sendonce.Message,
            {
                "message_id",
                "partition_key",
                "session_id",
                "scheduled_enqueue_time",
                "subject",
                "content_type",
                "correlation_id",
                "application_properties",
                "time_to_live",
            },
        ),
        (
            sendonce.MessageSpec,
            {
                "body",
                "partition_key",
                "session_id",
                "subject",
                "content_type",
                "application_properties",
            },
        ),
        (
            sendonce.EntityProfile,
            {
                "kind",
                "duplicate_detection",
                "duplicate_detection_window",
                "partitioned",
                "sessions",
                "max_message_size",
                "id_cache_size",
                "persist_id_cache",
            },
        ),
        (
            sendonce.RetryPolicy,
            {
                "max_attempts",
                "initial_backoff",
                "max_backoff",
                "jitter",
                "attempt_timeout",
                "safety_margin",
                "sleep",
                "clock",
            },
        ),
        (sendonce.IdempotentSender, {"retry"}),
    ],
)
def test_options_are_keyword_only(factory: object, keyword_only: set[str]) -> None:
    params = inspect.signature(factory).parameters  # type: ignore[arg-type]
    kinds = {name: p.kind for name, p in params.items()}
    for name in keyword_only:
        assert kinds[name] is inspect.Parameter.KEYWORD_ONLY, name


def test_send_result_fields() -> None:
    assert sendonce.SendResult._fields == (
        "message_id",
        "partition_key",
        "outcome",
        "attempts",
        "sequence_number",
    )
    report = sendonce.SendReport()
    assert (report.sent, report.duplicates, report.failed, report.results, report.failures) == (
        0,
        0,
        0,
        [],
        [],
    )
    report.raise_for_failures()
