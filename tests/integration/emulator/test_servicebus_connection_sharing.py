"""Connection sharing: the client's own path (broken) and ours beneath it (one connection).

docs/servicebus.md (Connections): ``ServiceBusClient._connection_sharing`` (off, "pending
fix") fails before a link opens, in both halves. The first two tests pin that finding to the
installed client: when an azure-servicebus release repairs the path, they fail, and the
section is to be revisited. The rest prove the backend's own sharing, built beneath the
client on its pyamqp layer: one AMQP connection per namespace and credential per process,
lanes as links on it, each transfer's outcome its own when the connection or a link is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from _emulator_helpers import emulated

pytest.importorskip("proton")
pytest.importorskip("azure.servicebus")

from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from sendonce import EntityProfile, IdempotentSender, Message, RetryPolicy, aio
from sendonce.backends import connect
from sendonce.backends.local import LocalBackend
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.emulator import Emulator, Fault, FaultAction
from sendonce.errors import ConfigurationError, PermanentSendError

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def test_the_aio_clients_sharing_path_never_opens_its_connection(emulator: object) -> None:
    """``_create_connection`` does not await ``create_connection_async``: the senders get a
    coroutine where the connection should be, and nothing reaches the broker."""
    from azure.servicebus.aio import ServiceBusClient

    async def attempt() -> BaseException | None:
        client = ServiceBusClient.from_connection_string(
            emulator.connection_string,  # type: ignore[attr-defined]
            retry_total=0,
        )
        client._connection_sharing = True
        await client.__aenter__()
        sender = client.get_queue_sender("orders")
        try:
            await sender.send_messages(ServiceBusMessage("x", message_id="shared-1"), timeout=10)
        except ServiceBusError as exc:
            return exc
        finally:
            client._connection_sharing = False  # its close would await the coroutine's None
            if asyncio.iscoroutine(client._connection):
                client._connection.close()  # the coroutine the client never awaited
            await sender.close()
            await client.close()
        return None

    error = asyncio.run(attempt())
    assert isinstance(error, ServiceBusError)
    assert "'coroutine' object has no attribute 'create_session'" in str(error)
    assert emulator.transfers("orders") == 0  # type: ignore[attr-defined]


def test_the_sync_clients_sharing_path_fails_before_connecting(emulator: object) -> None:
    """The sync path reads ``.sasl`` from a credential object that has none."""
    from azure.servicebus import ServiceBusClient

    client = ServiceBusClient.from_connection_string(
        emulator.connection_string,  # type: ignore[attr-defined]
        retry_total=0,
    )
    client._connection_sharing = True
    with pytest.raises(AttributeError, match="sasl"):
        client.__enter__()
    client._connection_sharing = False
    client.close()
    assert emulator.connections_accepted == 0  # type: ignore[attr-defined]


# -- ours: one connection per namespace and credential per process, beneath the client ------

PARTS = EntityProfile("parts", partitioned=True, duplicate_detection_window=timedelta(minutes=5))
ORDERS = EntityProfile("orders", duplicate_detection_window=timedelta(minutes=5))
SECRET = "sharing-Secret-Key-0123456789abcdef="


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[Emulator, LocalBackend]]:
    with emulated(tmp_path, PARTS, ORDERS) as both:
        yield both


def keyed(n: int, keys: int, tag: str = "m") -> list[Message]:
    return [
        Message(f"body {i}", message_id=f"{tag}{i % keys}-{i}", partition_key=f"k{i % keys}")
        for i in range(n)
    ]


def policy() -> RetryPolicy:
    return RetryPolicy(initial_backoff=0.01, max_backoff=0.05, jitter=False, max_attempts=20)


def stored_once(store: LocalBackend, entity: str, sent: list[Message]) -> None:
    assert Counter(store.message_ids(entity)) == {m.message_id: 1 for m in sent}


def closed_soon(emulator: Emulator) -> bool:
    """The broker sees the client's connections go (a moment after close returns)."""
    deadline = time.monotonic() + 30
    while emulator.open_connections and time.monotonic() < deadline:
        time.sleep(0.02)
    return emulator.open_connections == 0


@pytest.mark.parametrize(("sharing", "connections"), [(True, 1), (False, 16)])
def test_3000_keyed_messages_on_a_partitioned_entity_take_one_connection(
    broker: tuple[Emulator, LocalBackend], sharing: bool, connections: int
) -> None:
    """16 lanes are 16 links on one connection; the fallback (the control) is 16 connections."""
    emulator, store = broker
    sent = keyed(3000, 32)
    with (
        AzureServiceBusBackend.from_connection_string(
            emulator.connection_string,
            profiles={"parts": PARTS},
            max_in_flight=16,
            connection_sharing=sharing,
        ) as backend,
        IdempotentSender(backend, PARTS) as sender,
    ):
        assert backend.connection_sharing is sharing
        report = sender.send_many(sent)
    assert report.failed == 0, report.failures
    assert emulator.connections_accepted == connections
    assert closed_soon(emulator)
    stored_once(store, "parts", sent)


def test_the_environment_variable_turns_sharing_off(
    broker: tuple[Emulator, LocalBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator, _ = broker
    monkeypatch.setenv("SENDONCE_SERVICEBUS_CONNECTION_SHARING", "0")
    with AzureServiceBusBackend.from_connection_string(emulator.connection_string) as backend:
        assert backend.connection_sharing is False
    monkeypatch.setenv("SENDONCE_SERVICEBUS_CONNECTION_SHARING", "maybe")
    with pytest.raises(ConfigurationError, match="SENDONCE_SERVICEBUS_CONNECTION_SHARING") as err:
        AzureServiceBusBackend.from_connection_string(emulator.connection_string)
    assert err.value.field == "connection_sharing"


def test_two_backends_in_one_process_share_the_connection_until_the_last_closes(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    first_batch, second_batch = keyed(200, 8, "a"), keyed(200, 8, "b")
    first = connect(emulator.connection_string + ";MaxInFlight=8")
    second = connect(emulator.connection_string + ";MaxInFlight=8")
    late = Message("late", message_id="late-1")
    try:
        with (
            IdempotentSender(first, PARTS) as one,
            IdempotentSender(second, PARTS) as two,
            ThreadPoolExecutor(2) as pool,
        ):
            jobs = [
                pool.submit(one.send_many, first_batch),
                pool.submit(two.send_many, second_batch),
            ]
            assert [job.result().failed for job in jobs] == [0, 0]
        assert emulator.connections_accepted == 1
        first.close()
        assert emulator.open_connections == 1  # the second backend still holds it
        with IdempotentSender(second, PARTS) as again:
            assert again.send(late).outcome == "sent"
        second.close()
        assert closed_soon(emulator)  # closed with its last user
        assert emulator.connections_accepted == 1
    finally:
        first.close()
        second.close()
    stored_once(store, "parts", [*first_batch, *second_batch, late])


def test_the_shared_connection_cut_with_16_links_in_flight(
    broker: tuple[Emulator, LocalBackend], caplog: pytest.LogCaptureFixture
) -> None:
    """15 transfers stored and unanswered, the 16th stored and the socket dropped: each of
    the 16 is in doubt on its own, resent with its id; one reconnect serves every lane."""
    emulator, store = broker
    sent = keyed(64, 16, "cut")
    emulator.faults.add(
        *[Fault(FaultAction.WITHHOLD, entity="parts")] * 15,
        Fault(FaultAction.DROP_AFTER_COMMIT, entity="parts"),
    )
    caplog.set_level(logging.INFO, logger="sendonce")
    with (
        AzureServiceBusBackend.from_connection_string(
            emulator.connection_string, profiles={"parts": PARTS}, max_in_flight=16
        ) as backend,
        IdempotentSender(backend, PARTS, retry=policy()) as sender,
    ):
        report = sender.send_many(sent)
    assert report.failed == 0, report.failures
    assert emulator.faults.pending == 0
    lost = [r.getMessage() for r in caplog.records if "was lost" in r.getMessage()]
    assert len(lost) == 1 and "16 transfer(s) in flight end now" in lost[0], lost
    resent = [r for r in report.results if r.attempts > 1]
    assert len(resent) == 16  # each of the 16 in doubt was resent, the rest went once
    assert emulator.connections_accepted == 2  # the next use reconnected, once for all
    stored_once(store, "parts", sent)


def test_a_link_detached_by_the_broker_while_its_siblings_carry_on(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    sent = keyed(120, 8, "det")
    emulator.faults.add(
        *[Fault(FaultAction.NONE, entity="parts")] * 20,
        Fault(FaultAction.DETACH_AFTER_COMMIT, entity="parts"),
    )
    with (
        AzureServiceBusBackend.from_connection_string(
            emulator.connection_string, profiles={"parts": PARTS}, max_in_flight=8
        ) as backend,
        IdempotentSender(backend, PARTS, retry=policy()) as sender,
    ):
        report = sender.send_many(sent)
    assert report.failed == 0, report.failures
    assert emulator.faults.pending == 0
    assert [r.attempts for r in report.results].count(2) == 1  # only the detached one again
    assert emulator.connections_accepted == 1  # the connection and the other links stayed
    stored_once(store, "parts", sent)


def test_the_key_and_token_are_never_in_logs_reprs_or_errors(
    broker: tuple[Emulator, LocalBackend], caplog: pytest.LogCaptureFixture
) -> None:
    from sendonce.backends.servicebus._connection import registered

    emulator, _ = broker
    conn = emulator.connection_string.replace("SAS_KEY_VALUE", SECRET)
    emulator.faults.add(Fault(FaultAction.UNAUTHORIZED, entity="orders"))
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    with AzureServiceBusBackend.from_connection_string(
        conn, profiles={"orders": ORDERS}
    ) as backend:
        with pytest.raises(PermanentSendError) as refused:
            backend.send("orders", [Message("x", message_id="secret-1")], timeout=10)
        backend.send("orders", [Message("x", message_id="secret-2")], timeout=10)
        [shared] = [c for c in registered() if c.key.host == backend.namespace]
        texts += [
            repr(backend),
            repr(shared),
            repr(shared.key),
            str(shared.key),
            str(refused.value),
        ]
        texts += [repr(shared._tokens), repr(vars(refused.value))]
    texts += [record.getMessage() for record in caplog.records]
    blob = "\n".join(texts)
    assert "authorised sb://" in blob  # the token put was logged, without the token
    assert SECRET not in blob
    assert "sig=" not in blob and "SharedAccessSignature" not in blob


def test_an_untested_client_release_falls_back_to_a_connection_per_lane(
    broker: tuple[Emulator, LocalBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sendonce.backends.servicebus import _sharing

    emulator, store = broker
    monkeypatch.setattr(_sharing, "_release", lambda: (7, 99))
    sent = keyed(64, 8, "old")
    with (
        AzureServiceBusBackend.from_connection_string(
            emulator.connection_string, profiles={"parts": PARTS}, max_in_flight=4
        ) as backend,
        IdempotentSender(backend, PARTS) as sender,
    ):
        assert backend.connection_sharing is False
        assert sender.send_many(sent).failed == 0
    assert emulator.connections_accepted > 1
    stored_once(store, "parts", sent)


def test_an_idle_shared_connection_outlives_the_brokers_idle_timeout(tmp_path: Path) -> None:
    """The reader waits on the socket without a timeout; a keep-alive task sends the empty
    frames the broker's idle timeout asks for, so an idle connection is not dropped."""
    path = tmp_path / "broker.db"
    with LocalBackend(path) as store:
        store.create_entity(ORDERS)
        with (
            Emulator(path, poll_interval=0.02, idle_timeout=2.0) as emulator,
            AzureServiceBusBackend.from_connection_string(
                emulator.connection_string, profiles={"orders": ORDERS}
            ) as backend,
        ):
            backend.send("orders", [Message("a", message_id="idle-1")], timeout=10)
            quiet_until = time.monotonic() + 3 * 2.0  # three idle timeouts with no transfer
            while time.monotonic() < quiet_until:
                assert emulator.open_connections == 1
                time.sleep(0.1)
            backend.send("orders", [Message("b", message_id="idle-2")], timeout=10)
            assert emulator.connections_accepted == 1
        assert Counter(store.message_ids("orders")) == {"idle-1": 1, "idle-2": 1}


def test_each_audiences_token_is_put_again_before_it_expires(
    broker: tuple[Emulator, LocalBackend],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refresh margin widened to all but ~2 s of the token's hour: the one ``$cbs`` link
    puts each entity's token again on its own, and the links carry on with it."""
    from sendonce.backends.servicebus import _cbs

    emulator, store = broker
    monkeypatch.setattr(_cbs, "_REFRESH_SHARE", 1 - 2 / 3600)
    caplog.set_level(logging.DEBUG, logger="sendonce.servicebus")

    def puts(entity: str) -> int:
        return sum(
            1
            for r in caplog.records
            if r.getMessage().startswith("authorised sb://")
            and r.getMessage().split()[1].endswith(f"/{entity}")
        )

    with AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles={"orders": ORDERS, "parts": PARTS}
    ) as backend:
        backend.send("orders", [Message("a", message_id="tok-1")], timeout=10)
        backend.send("parts", [Message("b", message_id="tok-2", partition_key="p")], timeout=10)
        assert (puts("orders"), puts("parts")) == (1, 1)
        deadline = time.monotonic() + 60
        while (puts("orders") < 2 or puts("parts") < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert puts("orders") >= 2 and puts("parts") >= 2
        backend.send("orders", [Message("c", message_id="tok-3")], timeout=10)
        assert emulator.connections_accepted == 1
    assert Counter(store.message_ids("orders")) == {"tok-1": 1, "tok-3": 1}


# -- the aio backend: the same connection, awaited from the caller's loop --------------------


def aio_send_many(conn_str: str, sent: list[Message], **options: object) -> tuple[object, bool]:
    async def main() -> tuple[object, bool]:
        async with (
            aio.AzureServiceBusBackend.from_connection_string(
                conn_str, profiles={"parts": PARTS}, **options
            ) as backend,
            aio.IdempotentSender(backend, PARTS, retry=policy()) as sender,
        ):
            return await sender.send_many(sent), backend.connection_sharing

    return asyncio.run(main())


@pytest.mark.parametrize(("sharing", "connections"), [(True, 1), (False, 16)])
def test_aio_3000_keyed_messages_take_one_connection(
    broker: tuple[Emulator, LocalBackend], sharing: bool, connections: int
) -> None:
    emulator, store = broker
    sent = keyed(3000, 32, "aio")
    report, shared = aio_send_many(
        emulator.connection_string, sent, max_in_flight=16, connection_sharing=sharing
    )
    assert shared is sharing
    assert report.failed == 0, report.failures  # type: ignore[attr-defined]
    assert emulator.connections_accepted == connections
    assert closed_soon(emulator)
    stored_once(store, "parts", sent)


def test_aio_the_shared_connection_cut_with_16_links_in_flight(
    broker: tuple[Emulator, LocalBackend], caplog: pytest.LogCaptureFixture
) -> None:
    emulator, store = broker
    sent = keyed(64, 16, "acut")
    emulator.faults.add(
        *[Fault(FaultAction.WITHHOLD, entity="parts")] * 15,
        Fault(FaultAction.DROP_AFTER_COMMIT, entity="parts"),
    )
    caplog.set_level(logging.INFO, logger="sendonce")
    report, _ = aio_send_many(emulator.connection_string, sent, max_in_flight=16)
    assert report.failed == 0, report.failures  # type: ignore[attr-defined]
    assert emulator.faults.pending == 0
    lost = [r.getMessage() for r in caplog.records if "was lost" in r.getMessage()]
    assert len(lost) == 1 and "16 transfer(s) in flight end now" in lost[0], lost
    assert len([r for r in report.results if r.attempts > 1]) == 16  # type: ignore[attr-defined]
    assert emulator.connections_accepted == 2
    stored_once(store, "parts", sent)


def test_aio_a_link_detached_by_the_broker_while_its_siblings_carry_on(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    sent = keyed(120, 8, "adet")
    emulator.faults.add(
        *[Fault(FaultAction.NONE, entity="parts")] * 20,
        Fault(FaultAction.DETACH_AFTER_COMMIT, entity="parts"),
    )
    report, _ = aio_send_many(emulator.connection_string, sent, max_in_flight=8)
    assert report.failed == 0, report.failures  # type: ignore[attr-defined]
    assert emulator.faults.pending == 0
    assert [r.attempts for r in report.results].count(2) == 1  # type: ignore[attr-defined]
    assert emulator.connections_accepted == 1
    stored_once(store, "parts", sent)


def test_a_sync_and_an_aio_backend_share_one_connection(
    broker: tuple[Emulator, LocalBackend],
) -> None:
    emulator, store = broker
    sent_sync, sent_aio = keyed(100, 8, "s"), keyed(100, 8, "a")
    with (
        AzureServiceBusBackend.from_connection_string(
            emulator.connection_string, profiles={"parts": PARTS}, max_in_flight=8
        ) as backend,
        IdempotentSender(backend, PARTS) as sender,
    ):
        assert sender.send_many(sent_sync).failed == 0
        report, shared = aio_send_many(emulator.connection_string, sent_aio, max_in_flight=8)
        assert shared and report.failed == 0  # type: ignore[attr-defined]
    assert emulator.connections_accepted == 1
    assert closed_soon(emulator)
    stored_once(store, "parts", [*sent_sync, *sent_aio])


def _send_in_child(conn_str: str) -> None:
    with AzureServiceBusBackend.from_connection_string(
        conn_str, profiles={"orders": ORDERS}
    ) as backend:
        backend.send("orders", [Message("child", message_id="fork-2")], timeout=20)


def test_a_forked_child_opens_its_own_connection(broker: tuple[Emulator, LocalBackend]) -> None:
    """The child inherits the loop object and the registry but not their thread or socket."""
    import multiprocessing

    emulator, store = broker
    with AzureServiceBusBackend.from_connection_string(
        emulator.connection_string, profiles={"orders": ORDERS}
    ) as backend:
        backend.send("orders", [Message("parent", message_id="fork-1")], timeout=10)
        child = multiprocessing.get_context("fork").Process(
            target=_send_in_child, args=(emulator.connection_string,)
        )
        child.start()
        child.join(60)
        assert child.exitcode == 0
        backend.send("orders", [Message("parent", message_id="fork-3")], timeout=10)
    assert emulator.connections_accepted == 2
    assert Counter(store.message_ids("orders")) == {"fork-1": 1, "fork-2": 1, "fork-3": 1}
