"""``ArtemisBackend.submit``: transfers pipelined from the event loop on one connection,
each future completed by its own settlement (docs/engine.md), against the real broker.

The tests stand in for the engine: they keep many submissions outstanding from one
thread, resend (same ids) what came back in doubt or not sent, and read what the broker
holds with a hand-written proton receiver (``artemis.raw``): every id exactly once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from artemis.broker import ArtemisBroker
from artemis.faultproxy import FaultProxy
from artemis.raw import drain, message_count
from sendonce import EntityProfile, Message
from sendonce.aio import connect as aio_connect
from sendonce.backends import ArtemisBackend, capabilities_of, connect, submit_of
from sendonce.backends.artemis._shared import shared_loops
from sendonce.errors import AttemptNotSentError, ConfigurationError, TransientSendError

Future = concurrent.futures.Future


def profile(name: str) -> EntityProfile:
    return EntityProfile(name, id_cache_size=20_000)


def business(n: int, prefix: str) -> list[Message]:
    return [Message(f"body {prefix} {i}", message_id=f"{prefix}-{i}") for i in range(n)]


def pipeline(
    backend: ArtemisBackend,
    work: list[tuple[str, Message]],
    *,
    window: int,
    timeout: float = 30.0,
    during: Callable[[], None] | None = None,
) -> dict[str, BaseException | None]:
    """Submit ``(address, message)`` transfers from this thread with up to ``window``
    outstanding; each id's outcome (None: accepted)."""
    outcomes: dict[str, BaseException | None] = {}
    outstanding: dict[Future[list[object]], str] = {}
    pending = list(reversed(work))
    quiet_since = time.monotonic()
    while pending or outstanding:
        while pending and len(outstanding) < window:
            address, message = pending.pop()
            future = backend.submit(address, [message], timeout=timeout)
            outstanding[future] = message.message_id  # type: ignore[index]
        if during is not None:
            during()
        done, _ = concurrent.futures.wait(
            outstanding, timeout=0.2, return_when=concurrent.futures.FIRST_COMPLETED
        )
        if not done:  # ``during`` may have to act while nothing completes (a cut)
            assert time.monotonic() < quiet_since + timeout + 30, "a future outlived its timeout"
            continue
        quiet_since = time.monotonic()
        for future in done:
            message_id = outstanding.pop(future)
            error = future.exception()
            if error is None:
                assert [a.outcome for a in future.result()] == ["accepted"]  # type: ignore[attr-defined]
            outcomes[message_id] = error
    return outcomes


def resend_until_stored(
    backend: ArtemisBackend,
    work: list[tuple[str, Message]],
    outcomes: dict[str, BaseException | None],
    *,
    rounds: int = 20,
) -> Counter[str]:
    """Resend (same ids) every transfer whose outcome was an error; how each ended."""
    kinds: Counter[str] = Counter()
    for error in outcomes.values():
        kinds[_kind(error)] += 1
    by_id = {m.message_id: (a, m) for a, m in work}
    for _ in range(rounds):
        failed = [by_id[i] for i, e in outcomes.items() if e is not None]
        if not failed:
            return kinds
        for error in (outcomes[m.message_id] for _, m in failed):
            assert isinstance(error, TransientSendError), repr(error)  # retryable, never lost
        outcomes.update(pipeline(backend, failed, window=16))
    raise AssertionError(f"still failing after {rounds} rounds: {kinds}")


def _kind(error: BaseException | None) -> str:
    if error is None:
        return "accepted"
    if isinstance(error, AttemptNotSentError):
        return "not sent"
    if isinstance(error, TransientSendError):
        return "in doubt"
    return type(error).__name__


def test_submissions_pipeline_on_one_connection_without_a_thread_each(
    artemis_broker, artemis_address
):
    url = artemis_broker.url()
    work = [(artemis_address, m) for m in business(1500, "order")]
    with ArtemisBackend.from_url(url, profiles={artemis_address: profile(artemis_address)}) as b:
        caps = capabilities_of(b)
        assert caps.native_submit and submit_of(b) is not None
        assert b.send(artemis_address, [Message("warm", message_id="warm")], timeout=30)
        connections = b._loop._connections
        before = set(threading.enumerate())  # the loop thread runs already
        peak = [0]  # threads started meanwhile (a thread another test left may end)
        outcomes = pipeline(
            b,
            work,
            window=256,
            during=lambda: peak.__setitem__(
                0, max(peak[0], len(set(threading.enumerate()) - before))
            ),
        )
        assert peak[0] == 0  # 256 transfers in flight, not one thread more
        assert b._loop._connections == connections  # one connection carried everything
    assert set(outcomes.values()) == {None}
    got = Counter(m.id for m in drain(url, artemis_address))
    assert got == Counter(["warm", *(m.message_id for _, m in work)])


def test_backends_for_one_broker_share_one_connection_until_the_last_closes(
    artemis_broker, artemis_address
):
    url = artemis_broker.url()
    before = shared_loops()
    profiles = {artemis_address: profile(artemis_address)}
    first = connect(url, profiles=profiles)
    second = ArtemisBackend.from_url(url, profiles=profiles)
    other_user = ArtemisBackend.from_url(artemis_broker.send_only_url(), profiles=profiles)
    assert first._loop is second._loop and other_user._loop is not first._loop
    assert shared_loops() == before + 2
    first.send(artemis_address, [Message("a", message_id="a")], timeout=30)
    first.close()  # the other backend's connection stays
    second.send(artemis_address, [Message("b", message_id="b")], timeout=30)
    assert second._loop._connections == 1 and shared_loops() == before + 2
    second.close()
    other_user.close()
    assert shared_loops() == before
    with pytest.raises(ConfigurationError):
        second.submit(artemis_address, [Message("c", message_id="c")], timeout=30)
    assert sorted(m.id for m in drain(url, artemis_address)) == ["a", "b"]


def test_a_submission_cancels_only_before_its_first_delivery(artemis_broker, artemis_address):
    """Against a peer that accepts the TCP connection and never answers, a submission
    waits for the connection: ``cancel()`` succeeds (nothing can have been sent). Once a
    transfer's delivery was written, ``cancel()`` is refused."""
    with socket.create_server(("127.0.0.1", 0)) as mute:
        port = mute.getsockname()[1]
        with ArtemisBackend(
            "127.0.0.1", port, profiles={"orders": profile("orders")}, connect_timeout=1
        ) as silent:
            future = silent.submit("orders", [Message("x", message_id="x")], timeout=2)
            assert future.cancel() is True and future.cancelled()
    url = artemis_broker.url()
    with ArtemisBackend.from_url(url, profiles={artemis_address: profile(artemis_address)}) as b:
        sent = b.submit(artemis_address, [Message("y", message_id="y")], timeout=30)
        assert [a.outcome for a in sent.result(60)] == ["accepted"]
        assert sent.cancel() is False
    assert [m.id for m in drain(url, artemis_address)] == ["y"]


def test_the_connection_cut_with_16_links_in_flight_each_transfer_keeps_its_own_outcome(
    artemis_broker, artemis_address
):
    """Sixteen addresses (a sender link each) with transfers in flight on one connection;
    the broker's answers are swallowed, then the connection is cut. Every transfer ends on
    its own: accepted before the cut, or in doubt / not sent and resent with its id; the
    broker holds each id once."""
    direct = artemis_broker.url()
    addresses = [f"{artemis_address}-{i}" for i in range(16)]
    work = [(addresses[i % 16], m) for i, m in enumerate(business(960, "cut"))]
    profiles = {a: profile(a) for a in addresses}
    with FaultProxy("127.0.0.1", artemis_broker.port) as proxy:
        url = artemis_broker.url(port=proxy.port)
        with ArtemisBackend.from_url(url, profiles=profiles) as b:
            for address in addresses:  # every link attached, each address created
                b.send(address, [Message("warm", message_id=f"warm-{address}")], timeout=30)
            proxy.cut_after(b"body cut 400", settle=None)

            def cut_once_stored() -> None:
                if proxy.fired.is_set() and not cut.is_set():
                    held = sum(message_count(direct, a) for a in addresses)
                    if held >= 16 + 401:
                        cut.set()
                        proxy.cut()

            cut = threading.Event()
            outcomes = pipeline(b, work, window=64, timeout=60, during=cut_once_stored)
            assert cut.is_set() and proxy.connections >= 2
            conditions = {getattr(e, "condition", None) for e in outcomes.values() if e}
            assert conditions - {"amqp:timeout"}, conditions  # failed by the cut, not a clock
            kinds = resend_until_stored(b, work, outcomes)
    assert kinds["accepted"] >= 1 and kinds["in doubt"] >= 1, kinds  # each its own outcome
    for address in addresses:
        got = Counter(m.id for m in drain(direct, address))
        wanted = [f"warm-{address}", *(m.message_id for a, m in work if a == address)]
        assert got == Counter(wanted), address


class _Both:
    """Two backends behind one ``submit``: each address goes to the backend that owns it."""

    def __init__(self, owners: dict[str, ArtemisBackend]) -> None:
        self.owners = owners

    def submit(self, address: str, messages: list[Message], *, timeout: float) -> Future[list]:
        return self.owners[address].submit(address, messages, timeout=timeout)


def test_the_shared_connection_cut_mid_flight_fails_each_backends_transfers_on_their_own(
    artemis_broker, artemis_address
):
    """Two backends for one broker (a Spark task's sender and an outbox relay in one
    process) share one connection; both have transfers in flight, on their own addresses,
    when the connection is cut. Every transfer of both ends on its own (accepted, or in
    doubt / not sent and resent with its id through its own backend), both go on over the
    one new connection, and the broker holds each id once."""
    direct = artemis_broker.url()
    mine = [f"{artemis_address}-a{i}" for i in range(4)]
    theirs = [f"{artemis_address}-b{i}" for i in range(4)]
    profiles = {a: profile(a) for a in mine + theirs}
    work = [
        ((mine if i % 2 else theirs)[(i // 2) % 4], m)
        for i, m in enumerate(business(800, "shared"))
    ]
    with FaultProxy("127.0.0.1", artemis_broker.port) as proxy:
        url = artemis_broker.url(port=proxy.port)
        with (
            ArtemisBackend.from_url(url, profiles=profiles) as a,
            connect(url, profiles=profiles) as b,
        ):
            assert a._loop is b._loop  # one connection for both
            owners = {**dict.fromkeys(mine, a), **dict.fromkeys(theirs, b)}
            for address, backend in owners.items():
                backend.send(address, [Message("warm", message_id=f"warm-{address}")], timeout=30)
            connections = a._loop._connections
            proxy.cut_after(b"body shared 300", settle=None)
            cut = threading.Event()

            def cut_once_stored() -> None:
                if proxy.fired.is_set() and not cut.is_set():
                    held = sum(message_count(direct, x) for x in owners)
                    if held >= 8 + 301:
                        cut.set()
                        proxy.cut()

            outcomes = pipeline(
                _Both(owners),  # type: ignore[arg-type]
                work,
                window=64,
                timeout=60,
                during=cut_once_stored,
            )
            assert cut.is_set()
            failed = {getattr(e, "condition", None) for e in outcomes.values() if e}
            assert failed - {"amqp:timeout"}, failed  # failed by the cut, not a clock
            kinds = {}
            for backend, addresses in ((a, mine), (b, theirs)):
                own = [(x, m) for x, m in work if x in addresses]
                kinds[backend] = resend_until_stored(
                    backend, own, {m.message_id: outcomes[m.message_id] for _, m in own}
                )
            assert a._loop._connections == b._loop._connections > connections  # reopened
    for backend in (a, b):  # each backend's transfers were failed by the cut, on their own
        assert kinds[backend]["in doubt"] + kinds[backend]["not sent"] >= 1, kinds
    assert sum(k["accepted"] for k in kinds.values()) >= 1, kinds
    for address in owners:
        got = Counter(m.id for m in drain(direct, address))
        wanted = [f"warm-{address}", *(m.message_id for x, m in work if x == address)]
        assert got == Counter(wanted), address


@pytest.mark.slow
def test_the_broker_killed_with_thousands_in_flight_on_one_connection():
    """4,000 transfers submitted at once on one connection, then ``kill -9`` of the
    broker's JVM while they are in flight; a restart. Every future ends on its own:
    accepted, or in doubt / not sent and resent with its id, dropped where the first
    attempt was stored (the id cache is persisted): each id once."""
    with ArtemisBroker(persist_id_cache=True) as broker:
        url = broker.url()
        assert drain(url, "orders") == []  # a receiver's attach makes the queue
        work = [("orders", m) for m in business(4000, "kill")]
        with ArtemisBackend.from_url(url, profiles={"orders": profile("orders")}) as b:
            b.send("orders", [Message("warm", message_id="warm")], timeout=30)
            futures = [b.submit(a, [m], timeout=60) for a, m in work]
            broker.kill()
            in_flight = sum(not f.done() for f in futures)
            broker.start()
            outcomes: dict[str, BaseException | None] = {}
            for (_, m), future in zip(work, futures, strict=True):
                outcomes[m.message_id] = future.exception(timeout=120)
            kinds = resend_until_stored(b, work, outcomes)
        assert in_flight >= 1 and kinds["in doubt"] + kinds["not sent"] >= 1, (in_flight, kinds)
        got = Counter(m.id for m in drain(url, "orders"))
    assert got == Counter(["warm", *(m.message_id for _, m in work)])


def adapter_threads(before: set[threading.Thread]) -> list[str]:
    """The worker threads of the thread adapters (the aio one and the default ``submit``)
    started since ``before`` (an earlier test's adapter may still be ending in this process)."""
    return [
        t.name
        for t in set(threading.enumerate()) - before
        if t.name.startswith(("sendonce-aio", "sendonce-submit"))
    ]


def test_the_aio_connect_submits_to_the_loop_without_a_worker_thread(
    artemis_broker, artemis_address
):
    """``sendonce.aio.connect(amqp://...)``: its ``submit`` follows the Artemis loop's
    futures on the event loop; 200 in flight take none of the adapter's worker threads."""
    url = artemis_broker.url()
    messages = business(200, "aio")

    async def main() -> list[list[str]]:
        before = set(threading.enumerate())
        async with aio_connect(url, profiles={artemis_address: profile(artemis_address)}) as b:
            assert capabilities_of(b).native_submit
            futures = [b.submit(artemis_address, [m], timeout=30) for m in messages]
            # Only the adapters' own workers started here count: threads of earlier tests
            # may still be ending in this process, so the process-wide count is not this one's.
            assert adapter_threads(before) == []
            acks = await asyncio.gather(*futures)
            return [[a.outcome for a in each] for each in acks]

    assert asyncio.run(main()) == [["accepted"]] * 200
    got = Counter(m.id for m in drain(url, artemis_address))
    assert got == Counter(m.message_id for m in messages)
