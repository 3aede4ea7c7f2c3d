"""Bad input and failure against the real broker: each a specific error naming the field or
the broker's condition, nothing stored, no traceback from the CLI, and the password never in
an error, a repr or a log line (sendonce's or proton's)."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from artemis.raw import drain, raw_send
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends import connect
from sendonce.cli import main
from sendonce.errors import (
    ConfigurationError,
    MessageSizeError,
    PermanentSendError,
    SendOnceError,
    ValidationError,
)

FAST = RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.05, attempt_timeout=10)


def test_a_send_to_an_address_the_broker_does_not_create_is_refused(
    artemis_broker, artemis_address
):
    address = f"noauto.{artemis_address}"  # auto-create is off for "noauto.#"
    with (
        IdempotentSender(
            artemis_broker.url(), EntityProfile(address, id_cache_size=100), retry=FAST
        ) as sender,
        pytest.raises(PermanentSendError, match="does not exist") as refused,
    ):
        sender.send(Message("x", message_id="a"))
    assert refused.value.condition == "amqp:not-found"
    assert refused.value.message_id == "a"
    with connect(artemis_broker.url()) as backend, pytest.raises(ConfigurationError) as missing:
        backend.describe(address)
    assert missing.value.field == "entity"


def test_a_message_over_the_address_limit_is_refused_before_sending(
    artemis_broker, artemis_address
):
    # "tiny.#": max-size-bytes 64 KB under the FAIL policy: a larger message never fits.
    address = f"tiny.{artemis_address}"
    raw_send(artemis_broker.url(), address, [("first", "made by a first send")])
    with IdempotentSender(artemis_broker.url(), address, retry=FAST) as sender:
        assert sender.profile.max_message_size == 65536
        with pytest.raises(MessageSizeError, match="65536-byte limit") as refused:
            sender.send_many(
                [Message("small", message_id="ok"), Message(b"x" * 70_000, message_id="big")]
            )
    assert refused.value.field == "body"
    assert [m.id for m in drain(artemis_broker.url(), address)] == ["first"]


def test_a_message_with_another_duplicate_id_property_is_refused(artemis_broker, artemis_address):
    message = Message("x", message_id="a", application_properties={"_AMQ_DUPL_ID": "b"})
    with (
        IdempotentSender(
            artemis_broker.url(), EntityProfile(artemis_address, id_cache_size=100), retry=FAST
        ) as sender,
        pytest.raises(ValidationError, match="_AMQ_DUPL_ID") as refused,
    ):
        sender.send(message)
    assert refused.value.field == "application_properties"
    assert drain(artemis_broker.url(), artemis_address) == []


def test_the_password_is_never_shown(artemis_broker, artemis_address, caplog):
    caplog.set_level(logging.DEBUG)  # sendonce's loggers and proton's
    secret = artemis_broker.password
    shown: list[str] = []

    def attempt(call) -> None:
        try:
            call()
        except SendOnceError as exc:
            shown.extend([str(exc), repr(exc), repr(exc.args)])

    good, bad = artemis_broker.url(), artemis_broker.url(password=secret + "-wrong")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"amqp://{artemis_broker.user}:{secret}@127.0.0.1:{s.getsockname()[1]}"
    profile = EntityProfile(artemis_address, id_cache_size=100)

    def open_backend(url: str) -> None:
        with connect(url) as backend:
            shown.append(repr(backend))

    def send(url: str) -> None:
        with IdempotentSender(url, profile, retry=FAST) as sender:
            shown.append(repr(sender))
            sender.send(Message("x", message_id="a"))

    def describe(url: str) -> None:
        with IdempotentSender(url, artemis_address, retry=FAST) as sender:
            shown.append(repr(sender))

    for url in (good, bad, nowhere, good + "?bogus=1", good.replace("@127", "@:127")):
        for call in (open_backend, send, describe):
            attempt(lambda call=call, url=url: call(url))
    assert shown and caplog.text
    assert not [text for text in shown if secret in text]
    assert secret not in caplog.text


def test_the_cli_says_what_is_wrong_without_a_traceback(
    artemis_broker, artemis_address, tmp_path: Path
):
    records = tmp_path / "orders.jsonl"
    records.write_text("".join(json.dumps({"order_id": i}) + "\n" for i in range(3)))
    secret = artemis_broker.password

    def publish(url: str, entity: str) -> tuple[int, str]:
        result = CliRunner().invoke(
            main,
            ["publish", str(records), "--to", url, "--entity", entity, "--id", "{order_id}"],
        )
        assert result.exception is None or isinstance(result.exception, SystemExit)
        return result.exit_code, result.output

    raw_send(artemis_broker.url(), artemis_address, [("seed", "made by a first send")])
    cases = {
        "refused credentials": (artemis_broker.url(password="wrong-" + secret), artemis_address),
        "no such address": (artemis_broker.url(), f"{artemis_address}-missing"),
        "bad url": (artemis_broker.url() + "/orders", artemis_address),
        "not artemis": (artemis_broker.url(port=artemis_broker.nodedup_port), artemis_address),
    }
    said = {name: publish(url, entity) for name, (url, entity) in cases.items()}
    for name, (code, output) in said.items():
        assert code != 0, (name, output)
        assert "Traceback" not in output and secret not in output, (name, output)
    assert "refused the credentials" in said["refused credentials"][1]
    assert "does not exist" in said["no such address"][1]
    assert "has a path" in said["bad url"][1]
    assert "amqpDuplicateDetection=false" in said["not artemis"][1]
    assert [m.id for m in drain(artemis_broker.url(), artemis_address)] == ["seed"]
    # And a good run publishes.
    code, output = publish(artemis_broker.url(), artemis_address)
    assert code == 0, output
    assert sorted(m.id for m in drain(artemis_broker.url(), artemis_address)) == ["0", "1", "2"]
