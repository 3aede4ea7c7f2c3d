"""ArtemisBackend against the real broker: what arrives, what is refused, what is in doubt.

What the broker holds is read back with a hand-written proton receiver (``artemis.raw``),
not through sendonce.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from artemis.raw import drain, raw_send
from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy
from sendonce.backends import ArtemisBackend, connect
from sendonce.errors import (
    ConfigurationError,
    InDoubtError,
    NotStoredError,
    PermanentSendError,
)

FAST = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05, attempt_timeout=10)


def profile(name: str, **options: object) -> EntityProfile:
    return EntityProfile(name, id_cache_size=20_000, **options)  # type: ignore[arg-type]


def test_connect_opens_an_artemis_backend_that_hides_its_password(artemis_broker):
    with connect(artemis_broker.url()) as backend:
        assert isinstance(backend, ArtemisBackend)
        assert backend.messaging_system == "activemq"
        assert backend.max_in_flight == 16
        assert artemis_broker.password not in repr(backend)
        assert repr(backend) == f"ArtemisBackend(amqp://sendonce@127.0.0.1:{artemis_broker.port})"


def test_a_message_carries_its_id_as_amqp_message_id_and_string_duplicate_id(
    artemis_broker, artemis_address
):
    with IdempotentSender(artemis_broker.url(), profile(artemis_address), retry=FAST) as sender:
        result = sender.send(
            Message(
                b"\x00binary",
                message_id="order-1",
                session_id="customer-7",
                subject="paid",
                content_type="application/octet-stream",
                correlation_id="c-1",
                application_properties={"region": "eu", "amount": 12},
            )
        )
        sender.send(Message("text body", message_id="order-2"))
    assert result.outcome == "sent" and result.attempts == 1
    first, second = drain(artemis_broker.url(), artemis_address)
    assert first.id == "order-1"
    assert first.properties == {"_AMQ_DUPL_ID": "order-1", "region": "eu", "amount": 12}
    assert isinstance(first.properties["_AMQ_DUPL_ID"], str)
    assert first.body == b"\x00binary" and first.durable
    assert (first.group_id, first.subject, first.correlation_id) == ("customer-7", "paid", "c-1")
    assert first.content_type == "application/octet-stream"
    assert (second.id, second.body) == ("order-2", "text body")


def test_a_resend_is_accepted_and_dropped_by_the_broker(artemis_broker, artemis_address):
    messages = [Message(f"body {i}", message_id=f"id-{i}") for i in range(50)]
    with IdempotentSender(artemis_broker.url(), profile(artemis_address), retry=FAST) as sender:
        first = sender.send_many(messages)
    # A second producer (a restarted process) sends the same business messages again.
    with IdempotentSender(artemis_broker.url(), profile(artemis_address), retry=FAST) as sender:
        again = sender.send_many(messages)
    assert (first.sent, again.sent, again.failed) == (50, 50, 0)  # Artemis does not say
    assert sorted(m.id for m in drain(artemis_broker.url(), artemis_address)) == sorted(
        m.message_id for m in messages
    )


def test_many_transfers_in_flight_keep_the_order_of_each_key(artemis_broker, artemis_address):
    messages = [
        Message(f"{i}", message_id=f"k{i % 8}-{i}", partition_key=f"k{i % 8}") for i in range(800)
    ]
    with IdempotentSender(
        artemis_broker.url(), profile(artemis_address), retry=FAST, max_batch_messages=10
    ) as sender:
        report = sender.send_many(messages)
    assert report.sent == 800 and not report.failures
    got = drain(artemis_broker.url(), artemis_address)
    assert len(got) == 800
    for key in range(8):
        ids = [m.id for m in got if m.id.startswith(f"k{key}-")]
        assert ids == [m.message_id for m in messages if m.partition_key == f"k{key}"]


def test_describe_reads_the_address_from_the_broker(artemis_broker, artemis_address):
    url = artemis_broker.url()
    raw_send(url, artemis_address, [("x", "made by a first send")])
    raw_send(url, f"small-cache.{artemis_address}", [("x", 1)])
    raw_send(url, f"{artemis_address}-events", [("x", 1)], capability="topic")
    with connect(url) as backend:
        queue = backend.describe(artemis_address)
        small = backend.describe(f"small-cache.{artemis_address}")
        topic = backend.describe(f"{artemis_address}-events")
        with pytest.raises(ConfigurationError, match="does not exist") as missing:
            backend.describe(f"{artemis_address}-missing")
    assert (queue.kind, queue.id_cache_size, queue.persist_id_cache) == ("queue", 20_000, True)
    assert queue.duplicate_detection and queue.count_bounded
    assert small.id_cache_size == 3  # the address setting of "small-cache.#"
    assert topic.kind == "topic"
    assert missing.value.field == "entity"


def test_the_broker_keeps_answering_management_past_the_first_hundred_replies(
    artemis_broker, artemis_address
):
    # Every answer (the resend checks' queue readings, describe) spends a credit of the
    # reply link: the backend tops it up, or the 99th question on a connection went
    # unanswered until management_timeout.
    url = artemis_broker.url()
    raw_send(url, artemis_address, [("x", "made by a first send")])
    with ArtemisBackend.from_url(url, management_timeout=10) as backend:
        for i in range(120):
            with pytest.raises(ConfigurationError, match="does not exist"):
                backend.describe(f"{artemis_address}-missing-{i}")
        assert backend.describe(artemis_address).kind == "queue"


def test_a_multicast_address_gives_every_subscription_a_copy(artemis_broker, artemis_address):
    url = artemis_broker.url()
    topic = f"{artemis_address}-topic"
    # Two subscription queues on a multicast address (FQQN: address::queue).
    for queue in ("a", "b"):
        assert drain(url, f"{topic}::{queue}", capability="topic") == []
    with IdempotentSender(url, profile(topic, kind="topic"), retry=FAST) as sender:
        sender.send_many([Message("event", message_id="e1"), Message("event", message_id="e1")])
        sender.send(Message("event", message_id="e1"))
    for queue in ("a", "b"):
        assert [m.id for m in drain(url, f"{topic}::{queue}", capability="topic")] == ["e1"]


def test_a_resend_beyond_the_safe_part_of_the_id_cache_is_in_doubt_not_sent(
    artemis_broker, artemis_address
):
    # id-cache-size 3 on "small-cache.#": with resend_reach 1.0 a resend may reach back over
    # 2 of this backend's messages.
    address = f"small-cache.{artemis_address}"
    url = artemis_broker.url()
    with ArtemisBackend(
        "127.0.0.1",
        artemis_broker.port,
        user=artemis_broker.user,
        password=artemis_broker.password,
        resend_reach=1.0,
    ) as backend:
        backend.declare(EntityProfile(address, id_cache_size=3))
        one = [Message("1", message_id="one")]
        backend.send(address, one, timeout=10)
        backend.send(address, [Message("2", message_id="two")], timeout=10)
        backend.send(address, one, timeout=10)  # 1 message later: still in reach, dropped
        backend.send(address, [Message("3", message_id="three")], timeout=10)
        with pytest.raises(InDoubtError, match="not resent") as beyond:
            backend.send(address, one, timeout=10)  # 3 later: the broker may have forgotten
    assert beyond.value.message_id == "one"
    assert [m.id for m in drain(url, address)] == ["one", "two", "three"]


def test_a_peer_that_is_not_artemis_is_refused_before_anything_is_sent(tmp_path: Path):
    from sendonce.emulator import Emulator

    with Emulator(tmp_path / "broker.db") as emulator:
        with pytest.raises(ConfigurationError, match="not Apache ActiveMQ Artemis") as refused:
            IdempotentSender(
                f"amqp://127.0.0.1:{emulator.port}", EntityProfile("orders", id_cache_size=100)
            )
    assert refused.value.field == "url"


def test_an_acceptor_without_duplicate_detection_is_refused(artemis_broker, artemis_address):
    url = artemis_broker.url(port=artemis_broker.nodedup_port)
    with pytest.raises(ConfigurationError, match="amqpDuplicateDetection=false") as refused:
        IdempotentSender(url, profile(artemis_address))
    assert refused.value.field == "url"
    with pytest.raises(ConfigurationError, match="amqpDuplicateDetection=false"):
        IdempotentSender(url, artemis_address)
    # Accepting at-least-once is an explicit choice.
    backend = ArtemisBackend(
        "127.0.0.1",
        artemis_broker.nodedup_port,
        user=artemis_broker.user,
        password=artemis_broker.password,
        require_duplicate_detection=False,
    )
    with (
        backend,
        IdempotentSender(
            backend, profile(artemis_address), retry=FAST, require_duplicate_detection=False
        ) as sender,
    ):
        sender.send(Message("x", message_id="a"))
    assert [m.id for m in drain(artemis_broker.url(), artemis_address)] == ["a"]


def test_refused_credentials_are_a_configuration_error_naming_the_password(
    artemis_broker, artemis_address
):
    url = artemis_broker.url(password="not-the-password")
    with pytest.raises(ConfigurationError, match="refused the credentials") as refused:
        IdempotentSender(url, profile(artemis_address))
    assert refused.value.field == "password"
    assert "not-the-password" not in str(refused.value)
    # A send (the profile given: nothing asked of the broker first) is refused for good.
    with connect(url, profiles={artemis_address: profile(artemis_address)}) as backend:
        with pytest.raises(PermanentSendError) as direct:
            backend.send(artemis_address, [Message("x", message_id="a")], timeout=10)
    assert direct.value.condition == "amqp:unauthorized-access"
    assert drain(artemis_broker.url(), artemis_address) == []


def test_no_broker_listening_is_not_stored_after_the_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        IdempotentSender(
            f"amqp://u:p@127.0.0.1:{port}", EntityProfile("orders", id_cache_size=100), retry=FAST
        ) as sender,
        pytest.raises(NotStoredError) as failed,
    ):
        sender.send(Message("x", message_id="a"))
    assert failed.value.attempts == 3


def test_threads_share_one_backend_and_sender(artemis_broker, artemis_address):
    from concurrent.futures import ThreadPoolExecutor

    def work(thread: int) -> int:
        messages = [
            Message(f"{thread}-{i}", message_id=f"t{thread}-{i}", partition_key=f"t{thread}")
            for i in range(100)
        ]
        report = sender.send_many(messages)
        for message in messages[:10]:
            assert sender.send(message).outcome == "sent"  # a repeat: dropped by the broker
        return report.sent

    with IdempotentSender(artemis_broker.url(), profile(artemis_address), retry=FAST) as sender:
        with ThreadPoolExecutor(8) as pool:
            assert sum(pool.map(work, range(8))) == 800
    got = drain(artemis_broker.url(), artemis_address)
    assert len(got) == 800
    for thread in range(8):
        assert [m.id for m in got if m.id.startswith(f"t{thread}-")] == [
            f"t{thread}-{i}" for i in range(100)
        ]


def test_a_peer_that_never_answers_times_out_with_nothing_in_doubt():
    import threading

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts TCP, never speaks AMQP
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            silent.settimeout(0.1)
            while not stop.is_set():
                try:
                    held.append(silent.accept()[0])
                except OSError:
                    continue

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        retry = RetryPolicy(max_attempts=2, initial_backoff=0.01, attempt_timeout=0.5)
        url = f"amqp://u:p@127.0.0.1:{silent.getsockname()[1]}?connect_timeout=0.5"
        try:
            with IdempotentSender(url, EntityProfile("q", id_cache_size=10), retry=retry) as s:
                with pytest.raises(NotStoredError) as failed:
                    s.send(Message("x", message_id="a"))
        finally:
            stop.set()
            acceptor.join()
            for conn in held:
                conn.close()
    assert failed.value.attempts == 2
    assert len(held) >= 2  # each attempt gave up on its connection and opened a new one


def test_a_user_who_may_not_manage_sends_with_a_profile(artemis_broker, artemis_address, caplog):
    caplog.set_level(logging.INFO, logger="sendonce")
    url = artemis_broker.send_only_url()
    raw_send(artemis_broker.url(), artemis_address, [("x", "made by a first send")])
    with pytest.raises(ConfigurationError, match="pass an explicit profile") as refused:
        IdempotentSender(url, artemis_address)
    assert refused.value.field == "entity"
    assert "may lack the 'manage' permission" in str(refused.value)
    with IdempotentSender(url, profile(artemis_address), retry=FAST) as sender:
        assert sender.send(Message("y", message_id="y")).outcome == "sent"
    # The acceptor's duplicate detection could not be read: said, not silently assumed.
    assert "amqpDuplicateDetection is not checked" in caplog.text
    assert [m.id for m in drain(artemis_broker.url(), artemis_address)] == ["x", "y"]


def test_a_scheduled_message_arrives_at_its_time_and_shares_the_id_space(
    artemis_broker, artemis_address
):
    from datetime import UTC, datetime, timedelta

    at = datetime.now(UTC) + timedelta(seconds=4)
    with IdempotentSender(artemis_broker.url(), profile(artemis_address), retry=FAST) as sender:
        result = sender.schedule(Message("later", message_id="s-1"), at)
        sender.send(Message("later", message_id="s-1"))  # the same id, sent now: dropped
    assert (result.outcome, result.sequence_number) == ("scheduled", None)
    assert drain(artemis_broker.url(), artemis_address) == []  # not yet
    remaining = (at - datetime.now(UTC)).total_seconds()
    got = drain(artemis_broker.url(), artemis_address, idle=max(remaining, 0) + 2.0)
    assert [(m.id, m.body) for m in got] == [("s-1", "later")]
    assert datetime.now(UTC) >= at
