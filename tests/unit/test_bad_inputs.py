"""Every bad id, key, window, body or entity setting raises its specific error, and sends nothing.

The first table is the input layer alone: each case must raise exactly the
documented ``ValidationError`` subclass (which is also a ``ValueError``) with
``.field`` set and the field (or the message id) named in the text.

The second table sends messages that are valid on their own but break the
entity through a real ``IdempotentSender`` over a real local broker file: the
call must raise before anything of it is sent, and the broker must stay empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sendonce import (
    ConfigurationError,
    EntityProfile,
    KeyRuleError,
    Message,
    MessageIdError,
    MessageIdTemplate,
    MessageSizeError,
    MessageSpec,
    PayloadConflictError,
    SendOnceError,
    ValidationError,
    content_message_id,
)


@dataclass(frozen=True)
class Case:
    make: Callable[[], object]
    error: type[ValidationError]
    field: str
    mention: str | None = None  # text the message must contain (default: the field)


def build(template: str, record: dict[str, Any], **kwargs: Any) -> Callable[[], object]:
    return lambda: MessageIdTemplate(template, **kwargs).build(record)


def template(text: Any, **kwargs: Any) -> Callable[[], object]:
    return lambda: MessageIdTemplate(text, **kwargs)


def message(body: Any = b"x", **kwargs: Any) -> Callable[[], object]:
    kwargs.setdefault("message_id", "order-1")
    return lambda: Message(body, **kwargs)


def profile(**kwargs: Any) -> Callable[[], object]:
    name = kwargs.pop("name", "orders")
    return lambda: EntityProfile(name, **kwargs)


def check(entity: dict[str, Any], **kwargs: Any) -> Callable[[], object]:
    return lambda: EntityProfile("orders", **entity).check(Message(**kwargs))


def spec(*args: Any, record: dict[str, Any] | None = None, **kwargs: Any) -> Callable[[], object]:
    def run() -> object:
        s = MessageSpec(*args, **kwargs)
        return s if record is None else s.to_message(record)

    return run


ID = MessageIdError
KEY = KeyRuleError
SIZE = MessageSizeError
CONF = ConfigurationError
VAL = ValidationError
REC = {"order_id": 12345, "year": 2017}

CASES: dict[str, Case] = {
    # --- id templates
    "template-adjacent-fields": Case(template("{a}{b}"), ID, "template"),
    "template-conversion": Case(template("{a!r}"), ID, "template"),
    "template-format-spec": Case(template("{a:>5}"), ID, "template"),
    "template-attribute": Case(template("{a.b}"), ID, "template"),
    "template-index": Case(template("{a[0]}"), ID, "template"),
    "template-positional-empty": Case(template("{}"), ID, "template"),
    "template-positional-number": Case(template("{0}"), ID, "template"),
    "template-no-fields": Case(template("no fields"), ID, "template"),
    "template-letter-separator": Case(template("{a}x{b}"), ID, "template"),
    "template-percent-separator": Case(template("{a}%{b}"), ID, "template"),
    "template-duplicate-field": Case(template("{a}.{a}"), ID, "template"),
    "template-malformed-brace": Case(template("{a}.{b"), ID, "template"),
    "template-stray-close-brace": Case(template("a}.{b}"), ID, "template"),
    "template-empty": Case(template(""), ID, "template"),
    "template-not-str": Case(template(42), ID, "template"),
    "max-length-zero": Case(template("{a}", max_length=0), ID, "max_length"),
    "max-length-over-128": Case(template("{a}", max_length=129), ID, "max_length"),
    "overflow-unknown": Case(template("{a}", overflow="truncate"), ID, "overflow"),
    "overflow-hash-too-short": Case(
        template("{a}", max_length=20, overflow="hash"), ID, "max_length"
    ),
    # --- id values
    "id-field-missing": Case(build("{order_id}.{year}", {"order_id": 1}), ID, "year"),
    "id-field-none": Case(build("{order_id}.{year}", {**REC, "year": None}), ID, "year"),
    "id-field-float": Case(build("{order_id}.{year}", {**REC, "order_id": 1.0}), ID, "order_id"),
    "id-field-bool": Case(build("{order_id}.{year}", {**REC, "year": True}), ID, "year"),
    "id-field-naive-datetime": Case(
        build("{order_id}.{at}", {"order_id": 1, "at": datetime(2017, 1, 1)}), ID, "at"
    ),
    "id-field-bytes": Case(build("{order_id}.{year}", {**REC, "year": b"2017"}), ID, "year"),
    "id-field-nan-decimal": Case(
        build("{order_id}.{amount}", {"order_id": 1, "amount": Decimal("NaN")}), ID, "amount"
    ),
    "id-field-huge-int": Case(build("{n}", {"n": 10**5000}, overflow="hash"), ID, "n"),
    "id-empty": Case(build("{order_id}", {"order_id": ""}), ID, "order_id"),
    "id-too-long": Case(
        build("{order_id}/x", {"order_id": "9" * 200}), ID, "message_id", "{order_id}/x"
    ),
    "content-id-body-type": Case(lambda: content_message_id(123), ID, "body"),  # type: ignore[arg-type]
    "content-id-prefix-too-long": Case(
        lambda: content_message_id(b"x", prefix="p" * 65), ID, "prefix"
    ),
    # --- messages
    "message-id-empty": Case(message(message_id=""), ID, "message_id"),
    "message-id-129": Case(message(message_id="m" * 129), ID, "message_id"),
    "message-id-not-str": Case(message(message_id=12345), ID, "message_id"),
    "message-body-int": Case(message(body=12345), VAL, "body"),
    "message-body-dict": Case(message(body={"order": 1}), VAL, "body"),
    "partition-key-empty": Case(message(partition_key=""), KEY, "partition_key"),
    "partition-key-129": Case(message(partition_key="k" * 129), KEY, "partition_key"),
    "partition-key-not-str": Case(message(partition_key=12345), KEY, "partition_key"),
    "session-id-129": Case(message(session_id="s" * 129), KEY, "session_id"),
    "partition-key-not-session-id": Case(
        message(partition_key="eu", session_id="c-1"), KEY, "partition_key"
    ),
    "scheduled-naive": Case(
        message(scheduled_enqueue_time=datetime(2030, 1, 1)), VAL, "scheduled_enqueue_time"
    ),
    "scheduled-date": Case(
        message(scheduled_enqueue_time=date(2030, 1, 1)), VAL, "scheduled_enqueue_time"
    ),
    "ttl-zero": Case(message(time_to_live=timedelta(0)), VAL, "time_to_live"),
    "subject-not-str": Case(message(subject=1), VAL, "subject"),
    "property-value-list": Case(
        message(application_properties={"tags": ["a"]}),
        VAL,
        "application_properties",
        "application property",
    ),
    # --- specs
    "spec-bad-id-template": Case(spec("{a}{b}"), ID, "message_id"),
    "spec-bad-partition-template": Case(spec("{a}", partition_key="{p!r}"), ID, "partition_key"),
    "spec-bad-session-template": Case(spec("{a}", session_id="{s:x}"), ID, "session_id"),
    "spec-id-not-template": Case(spec(12345), ID, "message_id"),
    "spec-body-not-source": Case(spec("{a}", body=5), VAL, "body"),
    "spec-body-field-missing": Case(spec("{a}", body="payload", record={"a": 1}), VAL, "payload"),
    "spec-body-field-not-bytes": Case(
        spec("{a}", body="payload", record={"a": 1, "payload": 3}), VAL, "payload"
    ),
    "spec-body-callable-returns-int": Case(
        spec("{a}", body=lambda r: 1, record={"a": 1}), VAL, "body"
    ),
    "spec-body-json-unencodable": Case(spec("{a}", record={"a": 1, "o": object()}), VAL, "body"),
    "spec-partition-key-too-long": Case(
        spec("{a}", partition_key="{p}", record={"a": 1, "p": "p" * 200}), KEY, "partition_key"
    ),
    "spec-keys-disagree": Case(
        spec("{a}", partition_key="{p}", session_id="{s}", record={"a": 1, "p": "x", "s": "y"}),
        KEY,
        "partition_key",
    ),
    # --- windows and entity settings
    "window-19s": Case(
        profile(duplicate_detection_window=timedelta(seconds=19)),
        CONF,
        "duplicate_detection_window",
    ),
    "window-over-7d": Case(
        profile(duplicate_detection_window=timedelta(days=8)), CONF, "duplicate_detection_window"
    ),
    "window-not-timedelta": Case(
        profile(duplicate_detection_window=600), CONF, "duplicate_detection_window"
    ),
    "entity-name-empty": Case(profile(name=""), CONF, "name"),
    "entity-kind": Case(profile(kind="exchange"), CONF, "kind"),
    "entity-partitioned-not-bool": Case(profile(partitioned="yes"), CONF, "partitioned"),
    "entity-max-size-tiny": Case(profile(max_message_size=10), CONF, "max_message_size"),
    "entity-id-cache-zero": Case(profile(id_cache_size=0), CONF, "id_cache_size"),
    "entity-no-dedup": Case(
        lambda: EntityProfile("orders", duplicate_detection=False).require_duplicate_detection(),
        CONF,
        "duplicate_detection",
    ),
    # --- message against entity
    "entity-needs-session-id": Case(
        check({"sessions": True}, body=b"x", message_id="order-1"), KEY, "session_id"
    ),
    "entity-size-over-limit": Case(
        check({"max_message_size": 1024}, body=b"x" * 2000, message_id="order-1"),
        SIZE,
        "body",
        "'order-1'",
    ),
}


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 30
    kinds = {c.error for c in CASES.values()}
    assert kinds == {
        MessageIdError,
        KeyRuleError,
        MessageSizeError,
        ConfigurationError,
        ValidationError,
    }


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises_its_specific_error(name: str) -> None:
    case = CASES[name]
    with pytest.raises(SendOnceError) as ei:
        case.make()
    exc = ei.value
    assert type(exc) is case.error, f"{name}: {type(exc).__name__}: {exc}"
    assert isinstance(exc, ValueError)
    assert isinstance(exc, ValidationError)
    assert getattr(exc, "field", None) == case.field
    assert (case.mention or case.field) in str(exc), str(exc)


# ---------------------------------------------------------------- through the sender


def good(n: int, **kwargs: Any) -> Message:
    kwargs.setdefault("body", b"ok")
    body = kwargs.pop("body")
    return Message(body, message_id=f"good-{n}", **kwargs)


@dataclass(frozen=True)
class EntityCase:
    entity: EntityProfile
    bad: Callable[[], Any]
    error: type[SendOnceError]
    field: str | None
    good_kwargs: dict[str, Any]


SESSIONS = EntityProfile("q-sessions", sessions=True)
SMALL = EntityProfile("q-small", max_message_size=1024)
PARTITIONED = EntityProfile("q-partitioned", partitioned=True, max_message_size=1024)
ARTEMIS = EntityProfile("q-artemis", id_cache_size=100, max_message_size=2048)

ENTITY_CASES: dict[str, EntityCase] = {
    "session-id-missing": EntityCase(
        SESSIONS,
        lambda: Message(b"x", message_id="bad-1"),
        KeyRuleError,
        "session_id",
        {"session_id": "s"},
    ),
    "session-id-missing-partition-key-set": EntityCase(
        SESSIONS,
        lambda: Message(b"x", message_id="bad-1", partition_key="s"),
        KeyRuleError,
        "session_id",
        {"session_id": "s"},
    ),
    "body-over-limit": EntityCase(
        SMALL,
        lambda: Message(b"x" * 1500, message_id="bad-1"),
        MessageSizeError,
        "body",
        {},
    ),
    "utf8-body-over-limit": EntityCase(
        SMALL,
        lambda: Message("é" * 600, message_id="bad-1"),
        MessageSizeError,
        "body",
        {},
    ),
    "properties-push-over-limit": EntityCase(
        SMALL,
        lambda: Message(b"x" * 900, message_id="bad-1", application_properties={"k": "v" * 200}),
        MessageSizeError,
        "body",
        {},
    ),
    "partitioned-over-limit": EntityCase(
        PARTITIONED,
        lambda: Message(b"x" * 1100, message_id="bad-1", partition_key="p"),
        MessageSizeError,
        "body",
        {"partition_key": "p"},
    ),
    "artemis-over-limit": EntityCase(
        ARTEMIS,
        lambda: Message(b"x" * 4096, message_id="bad-1"),
        MessageSizeError,
        "body",
        {},
    ),
    "not-a-message": EntityCase(
        SMALL,
        lambda: {"message_id": "bad-1", "body": b"x"},
        ValidationError,
        "message",
        {},
    ),
    "same-id-different-body": EntityCase(
        SMALL,
        lambda: Message(b"different", message_id="good-0"),
        PayloadConflictError,
        None,
        {},
    ),
}


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    from sendonce.backends import LocalBackend

    backend = LocalBackend(tmp_path / "b.db")
    yield backend
    backend.close()


def _count(backend: Any, entity: str) -> int:
    return int(backend.count(entity))


@pytest.mark.parametrize("name", list(ENTITY_CASES))
def test_send_many_raises_before_anything_is_sent(broker: Any, name: str) -> None:
    from sendonce import IdempotentSender

    case = ENTITY_CASES[name]
    batch = [good(0, **case.good_kwargs), good(1, **case.good_kwargs), case.bad()]
    batch += [good(2, **case.good_kwargs), good(3, **case.good_kwargs)]
    with IdempotentSender(broker, case.entity) as sender:
        with pytest.raises(case.error) as ei:
            sender.send_many(batch)
        if isinstance(ei.value, PayloadConflictError):
            assert ei.value.message_id == "good-0"
        if case.field is not None:
            assert getattr(ei.value, "field", None) == case.field
        assert "[2]" in str(ei.value), str(ei.value)  # names the offending position
        if isinstance(ei.value, ValidationError):
            assert "nothing" in str(ei.value)
    assert _count(broker, case.entity.name) == 0


@pytest.mark.parametrize(
    "name", [n for n, c in ENTITY_CASES.items() if c.error is not PayloadConflictError]
)
def test_send_raises_and_sends_nothing(broker: Any, name: str) -> None:
    from sendonce import IdempotentSender

    case = ENTITY_CASES[name]
    with IdempotentSender(broker, case.entity) as sender:
        with pytest.raises(case.error) as ei:
            sender.send(case.bad())
        if case.field is not None:
            assert getattr(ei.value, "field", None) == case.field
    assert _count(broker, case.entity.name) == 0


def test_the_same_sender_still_sends_good_messages_afterwards(broker: Any) -> None:
    """A refused call leaves nothing behind: the good messages of it can be sent next."""
    from sendonce import IdempotentSender

    with IdempotentSender(broker, SESSIONS) as sender:
        batch = [good(0, session_id="s"), Message(b"x", message_id="bad"), good(1, session_id="s")]
        with pytest.raises(KeyRuleError):
            sender.send_many(batch)
        assert _count(broker, SESSIONS.name) == 0
        report = sender.send_many([batch[0], batch[2]])
        assert (report.sent, report.duplicates, report.failed) == (2, 0, 0)
    assert _count(broker, SESSIONS.name) == 2


def test_sender_refuses_entity_without_dedup_and_sends_nothing(broker: Any) -> None:
    from sendonce import IdempotentSender

    basic = EntityProfile("q-basic", duplicate_detection=False)
    with pytest.raises(ConfigurationError) as ei:
        IdempotentSender(broker, basic)
    assert ei.value.field == "duplicate_detection"
    broker.create_entity(basic, exist_ok=True)
    assert _count(broker, basic.name) == 0


@pytest.mark.parametrize("as_generator", [False, True], ids=["list", "generator"])
@pytest.mark.parametrize("position", ["first", "last"])
def test_bad_message_after_many_batches_sends_nothing(
    broker: Any, as_generator: bool, position: str
) -> None:
    """Batches are planned for the whole call first: a bad message at the end of a long,
    multi-transfer call (or a lazy iterable) still stops everything before it."""
    from sendonce import IdempotentSender

    goods = [good(i, body=b"y" * 300) for i in range(60)]  # ~3 per 1 KiB transfer: ~20 transfers
    bad = Message(b"x" * 2000, message_id="bad-1")
    batch = [bad, *goods] if position == "first" else [*goods, bad]
    with IdempotentSender(broker, SMALL, max_batch_messages=3) as sender:
        with pytest.raises(MessageSizeError) as ei:
            sender.send_many(iter(batch) if as_generator else batch)
        assert "bad-1" in str(ei.value)
        assert _count(broker, SMALL.name) == 0
        report = sender.send_many(goods)
        assert (report.sent, report.failed) == (60, 0)
    assert _count(broker, SMALL.name) == 60


@pytest.mark.parametrize(
    "at",
    [datetime(2030, 1, 1), "2030-01-01T00:00:00Z", None],
    ids=["naive", "str", "none"],
)
def test_schedule_with_bad_time_sends_nothing(broker: Any, at: Any) -> None:
    from sendonce import IdempotentSender

    with IdempotentSender(broker, SMALL) as sender:
        with pytest.raises(ValidationError) as ei:
            sender.schedule(good(0), at)
        assert ei.value.field == "at"
    assert _count(broker, SMALL.name) == 0
    assert broker.peek(SMALL.name, max_messages=10) == []


def test_schedule_of_an_entity_breaking_message_sends_nothing(broker: Any) -> None:
    from datetime import UTC

    from sendonce import IdempotentSender

    with IdempotentSender(broker, SESSIONS) as sender:
        with pytest.raises(KeyRuleError) as ei:
            sender.schedule(Message(b"x", message_id="bad-1"), datetime(2030, 1, 1, tzinfo=UTC))
        assert ei.value.field == "session_id"
    assert broker.peek(SESSIONS.name, max_messages=10) == []
