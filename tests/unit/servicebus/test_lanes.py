"""Several sender links per entity (lanes): up to ``max_in_flight`` transfers at once.

The scripted link (conftest ``FakeLink``) stands in for the broker here so that a
transfer can be held open while others start; the real client against the
emulator is in ``test_over_emulator.py`` and ``tests/integration/emulator``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from azure.servicebus.exceptions import ServiceBusConnectionError

from sendonce import Message
from sendonce.backends import connect
from sendonce.backends.servicebus import AzureServiceBusBackend
from sendonce.backends.servicebus._lanes import DEFAULT_MAX_IN_FLIGHT
from sendonce.errors import AttemptNotSentError, ConfigurationError, TransientSendError

from .conftest import CONN_STR, SECRET, FakeLink

Make = Callable[..., AzureServiceBusBackend]


def one(i: int) -> list[Message]:
    return [Message(f"body {i}", message_id=f"m-{i}")]


def test_the_default_is_exposed_for_the_sender(make_backend: Make) -> None:
    backend = make_backend()
    assert backend.max_in_flight == DEFAULT_MAX_IN_FLIGHT
    assert getattr(backend, "max_in_flight", 1) == DEFAULT_MAX_IN_FLIGHT
    assert make_backend(max_in_flight=3).max_in_flight == 3


@pytest.mark.parametrize("bad", [0, -1, 257, 2.5, True, "many", None])
def test_a_bad_max_in_flight_is_refused_naming_the_field(make_backend: Make, bad: Any) -> None:
    if bad is None:
        assert make_backend(max_in_flight=None).max_in_flight == DEFAULT_MAX_IN_FLIGHT
        return
    with pytest.raises(ConfigurationError, match="max_in_flight") as info:
        make_backend(max_in_flight=bad)
    assert info.value.field == "max_in_flight"


def test_the_connection_string_carries_max_in_flight_to_executors(make_backend: Make) -> None:
    backend = make_backend(CONN_STR + ";maxinflight=5")
    assert backend.max_in_flight == 5
    assert "maxinflight" not in (backend._connection_string or "").lower()  # not the client's
    assert connect(CONN_STR + ";MaxInFlight=7").max_in_flight == 7  # type: ignore[attr-defined]
    assert connect(CONN_STR, max_in_flight=9).max_in_flight == 9  # type: ignore[attr-defined]
    assert make_backend(CONN_STR + ";MaxInFlight=4", max_in_flight=4).max_in_flight == 4


@pytest.mark.parametrize(
    ("conn_str", "options", "match"),
    [
        (CONN_STR + ";MaxInFlight=4", {"max_in_flight": 8}, "disagrees"),
        (CONN_STR + ";MaxInFlight=4;MaxInFlight=4", {}, "twice"),
        (CONN_STR + ";MaxInFlight=0", {}, "from 1 to 256"),
        (CONN_STR + ";MaxInFlight=lots", {}, "from 1 to 256"),
    ],
)
def test_a_bad_max_in_flight_in_the_connection_string_is_refused(
    conn_str: str, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match) as info:
        AzureServiceBusBackend.from_connection_string(conn_str, **options)
    assert info.value.field == "max_in_flight"
    assert SECRET not in str(info.value)


class Gate:
    """Holds every transfer until released, counting how many are held at once."""

    def __init__(self, link: FakeLink) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.senders: set[int] = set()
        for sender in link.senders:
            self.hold(sender)

    def hold(self, sender: Any) -> None:
        original = sender.send_messages.side_effect

        def send_messages(payload: Any, *, timeout: float | None = None) -> None:
            with self.lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
                self.senders.add(id(sender))
            try:
                assert self.release.wait(10)
                original(payload, timeout=timeout)
            finally:
                with self.lock:
                    self.inside -= 1

        sender.send_messages.side_effect = send_messages


def gated(link: FakeLink) -> Gate:
    gate = Gate(link)
    make = link.new_sender

    def new_sender(*args: Any, **kwargs: Any) -> Any:
        sender = make(*args, **kwargs)
        gate.hold(sender)
        return sender

    link.new_sender = new_sender  # type: ignore[method-assign]
    return gate


def run_threads(n: int, target: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return errors


def test_threads_carry_up_to_max_in_flight_transfers_on_as_many_links(
    mocker: Any, make_backend: Make
) -> None:
    link = FakeLink()
    gate = gated(link)
    mocker.patch(
        "azure.servicebus.ServiceBusClient.get_queue_sender",
        side_effect=lambda *a, **k: link.new_sender(*a, **k),
    )
    backend = make_backend(max_in_flight=4)
    threading.Timer(0.3, gate.release.set).start()
    errors = run_threads(10, lambda i: backend.send("orders", one(i), timeout=5))
    assert errors == []
    assert gate.most == 4  # four at once, never more
    assert len(link.senders) == 4 and len(gate.senders) == 4  # one transfer per link at a time
    assert sorted(p.message_id for p in link.sent) == sorted(f"m-{i}" for i in range(10))
    backend.close()
    for sender in link.senders:
        sender.close.assert_called()  # closing the backend closes every link


def test_a_caller_waits_for_a_free_link_within_its_timeout(mocker: Any, make_backend: Make) -> None:
    link = FakeLink()
    gate = gated(link)
    mocker.patch(
        "azure.servicebus.ServiceBusClient.get_queue_sender",
        side_effect=lambda *a, **k: link.new_sender(*a, **k),
    )
    backend = make_backend(max_in_flight=1)
    holder = threading.Thread(target=lambda: backend.send("orders", one(0), timeout=5))
    holder.start()
    while gate.inside == 0:
        threading.Event().wait(0.01)
    with pytest.raises(AttemptNotSentError, match="stayed busy") as info:
        backend.send("orders", one(1), timeout=0.2)
    assert info.value.message_id == "m-1"
    gate.release.set()
    holder.join(5)
    assert [p.message_id for p in link.sent] == ["m-0"]  # the refused one was never sent


def test_a_link_lost_on_one_lane_leaves_the_others_in_flight(
    mocker: Any, make_backend: Make
) -> None:
    link = FakeLink()
    gate = gated(link)
    mocker.patch(
        "azure.servicebus.ServiceBusClient.get_queue_sender",
        side_effect=lambda *a, **k: link.new_sender(*a, **k),
    )
    backend = make_backend(max_in_flight=3)
    failing = threading.Event()

    def send(i: int) -> None:
        if i == 2:  # the third lane loses its link while the other two are held
            while gate.inside < 2:
                threading.Event().wait(0.01)
            lane_sender = link.new_sender()
            lane_sender.send_messages.side_effect = ServiceBusConnectionError(message="detached")
            mocker.patch.object(backend._client, "get_queue_sender", side_effect=[lane_sender])
            try:
                backend.send("orders", one(i), timeout=5)
            finally:
                failing.set()
                gate.release.set()
        else:
            backend.send("orders", one(i), timeout=5)

    errors = run_threads(3, send)
    assert [type(e) for e in errors] == [TransientSendError]
    assert sorted(p.message_id for p in link.sent) == ["m-0", "m-1"]  # the others landed
    failed = link.senders[-1]
    failed.close.assert_called_once()  # only the lost lane's sender was closed
    assert all(not s.close.called for s in link.senders[:2])


def test_aio_backend_takes_the_same_option() -> None:
    from sendonce.aio import AzureServiceBusBackend as AsyncBackend
    from sendonce.aio import connect as aio_connect

    async def main() -> None:
        backend = AsyncBackend.from_connection_string(CONN_STR + ";MaxInFlight=6")
        assert backend.max_in_flight == 6
        await backend.close()
        other = aio_connect(CONN_STR, max_in_flight=2)
        assert other.max_in_flight == 2  # type: ignore[attr-defined]
        await other.close()
        with pytest.raises(ConfigurationError) as info:
            AsyncBackend.from_connection_string(CONN_STR, max_in_flight=0)
        assert info.value.field == "max_in_flight"

    asyncio.run(main())


def test_closing_the_backend_closes_its_links_side_by_side(mocker: Any, make_backend: Make) -> None:
    """Each real close waits for the peer (~0.5 s): one after another, 16 lanes took 8 s."""
    link = FakeLink()
    gate = gated(link)
    mocker.patch(
        "azure.servicebus.ServiceBusClient.get_queue_sender",
        side_effect=lambda *a, **k: link.new_sender(*a, **k),
    )
    backend = make_backend(max_in_flight=4)
    threading.Timer(0.3, gate.release.set).start()
    assert run_threads(4, lambda i: backend.send("orders", one(i), timeout=5)) == []
    assert len(link.senders) == 4
    together = threading.Barrier(4)
    for sender in link.senders:
        sender.close.side_effect = lambda: together.wait(5)  # returns once all four close
    backend.close()
    assert not together.broken
    assert all(s.close.call_count == 1 for s in link.senders)


def test_aio_a_lane_that_cannot_be_made_gives_its_place_back(mocker: Any) -> None:
    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    from sendonce.aio import AzureServiceBusBackend as AsyncBackend

    mocker.patch.object(
        AsyncClient,
        "get_queue_sender",
        side_effect=[RuntimeError("first"), RuntimeError("second")],
    )

    async def main() -> None:
        backend = AsyncBackend.from_connection_string(CONN_STR, max_in_flight=1)
        for expected in ("first", "second"):  # the only lane's place was not kept by the first
            with pytest.raises(RuntimeError, match=expected):
                await backend.send("orders", one(0), timeout=0.5)
        await backend.close()

    asyncio.run(main())


def test_aio_declare_outside_a_loop_drops_the_lanes_of_a_changed_kind() -> None:
    from sendonce import EntityProfile
    from sendonce.aio import AzureServiceBusBackend as AsyncBackend

    backend = AsyncBackend.from_connection_string(CONN_STR)
    backend._entity_lanes("events")  # lanes for a queue named events, nothing opened yet
    backend.declare(EntityProfile("events", kind="topic"))  # no event loop runs here
    assert "events" not in backend._lanes
    asyncio.run(backend.close())
