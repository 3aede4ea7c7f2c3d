"""The producer's trace context through the outbox: stored with the row, forwarded on the
message, linked from the relay's span; nothing with telemetry off; the size rule kept; and
schema 4 migrated to 5 in place with nothing lost.

Real PostgreSQL (a throwaway cluster), the real local broker, the OpenTelemetry SDK with its
in-memory exporter (``otel``: sendonce's telemetry sent to it through ``telemetry.use``; the
"web request" span comes from the same provider, never a global one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sendonce import EntityProfile, Message
from sendonce.backends import LocalBackend
from sendonce.errors import ConfigurationError
from sendonce.outbox import SCHEMA_VERSION, Outbox, Relay, enqueue, install

pytestmark = pytest.mark.postgres

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402


def traceparent_of(span: Any) -> str:
    ctx = span.get_span_context() if hasattr(span, "get_span_context") else span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def stored_contexts(url: str, table: str = "sendonce_outbox") -> dict[str, str | None]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT message_id, trace_context FROM {table}").fetchall()
    return dict(rows)


def test_the_web_requests_context_is_stored_forwarded_and_linked(
    outbox_url: str, broker: LocalBackend, otel: Any
) -> None:
    install(outbox_url)
    web = otel.tracer_provider.get_tracer("web")
    requests = []
    for n in range(2):
        with web.start_as_current_span(f"POST /orders/{n}", kind=SpanKind.SERVER) as request:
            with psycopg.connect(outbox_url) as conn:
                batch = [Message(f"o{n}.{i}", message_id=f"o{n}.{i}") for i in range(2)]
                enqueue(conn, batch, entity="orders")
                conn.commit()
        requests.append(request)
    with psycopg.connect(outbox_url) as conn:  # outside any span: no context stored
        enqueue(conn, [Message("bare", message_id="bare")], entity="orders")
        conn.commit()
    stored = stored_contexts(outbox_url)
    for n, request in enumerate(requests):
        for i in range(2):
            assert json.loads(stored[f"o{n}.{i}"] or "") == {"traceparent": traceparent_of(request)}
    assert stored["bare"] is None
    # The message as enqueued: no trace property was added to what the table holds.
    with psycopg.connect(outbox_url) as conn:
        assert conn.execute("SELECT count(properties) FROM sendonce_outbox").fetchone() == (0,)

    with Relay(outbox_url, broker, [EntityProfile("orders")]) as relay:
        assert relay.drain().published == 5
    got = {m.message_id: dict(m.application_properties or {}) for m in
           broker.receive("orders", max_messages=10, mode="receive_and_delete")}  # fmt: skip
    relay_span = otel.one("relay orders")
    [transfer] = otel.named("send orders")
    for n, request in enumerate(requests):
        for i in range(2):  # the producer's context, as the sender stamps its own
            props = got[f"o{n}.{i}"]
            assert props == {
                "traceparent": traceparent_of(request),
                "Diagnostic-Id": traceparent_of(request),
            }
    # A row with no stored context carries the relay's transfer context, as any send does.
    assert got["bare"]["traceparent"] == traceparent_of(transfer)
    # One link per distinct producer context; the relay's span is not their child.
    linked = sorted((link.context.trace_id, link.context.span_id) for link in relay_span.links)
    produced = sorted((r.get_span_context().trace_id, r.get_span_context().span_id)
                      for r in requests)  # fmt: skip
    assert linked == produced
    assert relay_span.parent is None
    assert relay_span.context.trace_id not in {t for t, _ in produced}
    assert relay_span.attributes["sendonce.rows"] == 5
    assert "sendonce.untraced" not in relay_span.attributes
    # The sender's call is still the relay span's child.
    assert [c.name for c in otel.children(relay_span)] == ["send_many orders"]


def test_aenqueue_stores_the_context_current_in_its_task(outbox_url: str, otel: Any) -> None:
    """asyncio: the span current in the task (a contextvar) is the one stored."""
    import asyncio

    from sendonce.outbox import aenqueue

    install(outbox_url)
    web = otel.tracer_provider.get_tracer("web")

    async def handler(n: int) -> str:
        with web.start_as_current_span(f"POST /orders/{n}") as request:
            await asyncio.sleep(0)  # the other handler runs meanwhile, in its own span
            async with await psycopg.AsyncConnection.connect(outbox_url) as conn:
                await aenqueue(conn, [Message("o", message_id=f"o-{n}")], entity="orders")
                await conn.commit()
        return traceparent_of(request)

    async def both() -> list[str]:
        return list(await asyncio.gather(handler(1), handler(2)))

    first, second = asyncio.run(both())
    stored = stored_contexts(outbox_url)
    assert json.loads(stored["o-1"] or "") == {"traceparent": first}
    assert json.loads(stored["o-2"] or "") == {"traceparent": second}


def test_with_telemetry_off_nothing_is_stored_nor_added(
    outbox_url: str, broker: LocalBackend
) -> None:
    """Off (no provider given to sendonce): even inside an application's span, the row has
    no context and the message goes as enqueued, with no trace property."""
    install(outbox_url)
    app = TracerProvider().get_tracer("app")  # the application's, never given to sendonce
    with app.start_as_current_span("POST /orders"):
        with psycopg.connect(outbox_url) as conn:
            enqueue(conn, [Message("o", message_id="o-1")], entity="orders")
            conn.commit()
    assert stored_contexts(outbox_url) == {"o-1": None}
    with Relay(outbox_url, broker, [EntityProfile("orders")]) as relay:
        assert relay.drain().published == 1
    [message] = broker.receive("orders", max_messages=5, mode="receive_and_delete")
    assert message.application_properties is None


def test_an_untraced_relay_still_forwards_the_producers_context(
    outbox_url: str, broker: LocalBackend, otel: Any
) -> None:
    """The context is the producer's: a relay without telemetry passes it on unchanged."""
    install(outbox_url)
    with otel.tracer_provider.get_tracer("web").start_as_current_span("POST /orders") as request:
        with psycopg.connect(outbox_url) as conn:
            props = {"tenant": "t-1"}
            enqueue(conn, [Message("o", message_id="o-1", application_properties=props)],
                    entity="orders")  # fmt: skip
            conn.commit()
    from sendonce import telemetry

    telemetry.use(tracer_provider=None, meter_provider=None)  # the relay's process: off
    with Relay(outbox_url, broker, [EntityProfile("orders")]) as relay:
        assert relay.drain().published == 1
    [message] = broker.receive("orders", max_messages=5, mode="receive_and_delete")
    assert dict(message.application_properties or {}) == {
        "tenant": "t-1",
        "traceparent": traceparent_of(request),
        "Diagnostic-Id": traceparent_of(request),
    }
    assert otel.named("relay orders") == []


def test_a_context_that_would_push_a_message_over_the_limit_is_left_off_not_fatal(
    outbox_url: str, broker: LocalBackend, otel: Any
) -> None:
    """The size rule: a message that fits the entity as enqueued is published as enqueued
    when its producer's context would push it over the limit (never moved aside for it);
    the relay's span still links to the context and counts it ``sendonce.untraced``."""
    limit = 1024
    entity = EntityProfile("orders", max_message_size=limit)
    install(outbox_url)
    near = Message("x", message_id="near")
    near = Message("x" * (limit - near.size - 20), message_id="near")  # 20 bytes to spare
    small = Message("small", message_id="small")
    assert near.size <= limit
    with otel.tracer_provider.get_tracer("web").start_as_current_span("POST /orders") as request:
        with psycopg.connect(outbox_url) as conn:
            enqueue(conn, [near, small], entity=entity)  # checked as given: both fit
            conn.commit()
    with Relay(outbox_url, broker, [entity]) as relay:
        totals = relay.drain()
    assert (totals.published, totals.dead) == (2, 0)
    got = {m.message_id: m for m in broker.receive("orders", max_messages=5,
                                                   mode="receive_and_delete")}  # fmt: skip
    assert got["near"].application_properties is None  # as enqueued, byte for byte
    assert got["near"].body == near.body_bytes
    assert dict(got["small"].application_properties or {})["traceparent"] == traceparent_of(request)
    relay_span = otel.one("relay orders")
    assert relay_span.attributes["sendonce.untraced"] == 1
    assert [link.context.span_id for link in relay_span.links] == [
        request.get_span_context().span_id
    ]


def tiny_relay_drain(outbox_url: str, tmp_path: Path) -> Any:
    """A relay whose entity takes 1 KiB at most (its own broker file: the local broker keeps
    an entity's first profile), so a larger row is moved aside as invalid."""
    with LocalBackend(tmp_path / "tiny.db") as tiny:
        with Relay(outbox_url, tiny, [EntityProfile("orders", max_message_size=1024)]) as relay:
            return relay.drain()


def test_a_dead_row_keeps_its_context_and_a_requeue_carries_it_back(
    outbox_url: str, broker: LocalBackend, otel: Any, tmp_path: Path
) -> None:
    install(outbox_url)
    with otel.tracer_provider.get_tracer("web").start_as_current_span("POST /orders") as request:
        with psycopg.connect(outbox_url) as conn:
            enqueue(conn, [Message("x" * 2000, message_id="big")], entity="orders")
            conn.commit()
    assert tiny_relay_drain(outbox_url, tmp_path).dead == 1  # invalid there: moved aside
    expected = json.dumps({"traceparent": traceparent_of(request)}, separators=(",", ":"))
    assert stored_contexts(outbox_url, "sendonce_outbox_dead") == {"big": expected}
    with Outbox(outbox_url) as outbox:
        assert outbox.requeue("orders") == ["big"]
    assert stored_contexts(outbox_url) == {"big": expected}
    with Relay(outbox_url, broker, [EntityProfile("orders")]) as relay:
        assert relay.drain().published == 1
    [message] = broker.receive("orders", max_messages=5, mode="receive_and_delete")
    assert dict(message.application_properties or {})["traceparent"] == traceparent_of(request)


def test_schema_4_is_migrated_to_5_in_place_with_nothing_lost(
    outbox_url: str, broker: LocalBackend, otel: Any, tmp_path: Path
) -> None:
    """An outbox as version 4 left it (no ``trace_context`` in either table), with pending,
    published and dead rows: a relay (or install) adds the column; every row is still there,
    the old ones with no context, and they publish as before."""
    assert SCHEMA_VERSION == 5
    install(outbox_url)
    with psycopg.connect(outbox_url) as conn:
        enqueue(conn, [Message(f"p{n}", message_id=f"p-{n}") for n in range(3)], entity="orders")
        enqueue(conn, [Message("x" * 2000, message_id="big")], entity="orders")
        conn.commit()
    assert tiny_relay_drain(outbox_url, tmp_path).published == 3  # big: moved aside
    with psycopg.connect(outbox_url) as conn:
        enqueue(conn, [Message(f"q{n}", message_id=f"q-{n}") for n in range(2)], entity="orders")
        conn.commit()
    with psycopg.connect(outbox_url, autocommit=True) as conn:  # as version 4 left it
        conn.execute("ALTER TABLE sendonce_outbox DROP COLUMN trace_context")
        conn.execute("ALTER TABLE sendonce_outbox_dead DROP COLUMN trace_context")
        conn.execute("UPDATE sendonce_outbox_meta SET value = '4'")
        before = conn.execute(
            "SELECT id, message_id, body, published_at FROM sendonce_outbox ORDER BY id"
        ).fetchall()
        dead_before = conn.execute(
            "SELECT id, message_id, body FROM sendonce_outbox_dead"
        ).fetchall()
    with psycopg.connect(outbox_url) as conn:
        with pytest.raises(ConfigurationError, match="older"):
            enqueue(conn, [Message("r", message_id="r")], entity="orders")
        conn.rollback()
    assert install(outbox_url) == 4
    with psycopg.connect(outbox_url) as conn:
        after = conn.execute(
            "SELECT id, message_id, body, published_at FROM sendonce_outbox ORDER BY id"
        ).fetchall()
        dead_after = conn.execute(
            "SELECT id, message_id, body FROM sendonce_outbox_dead"
        ).fetchall()
        contexts = conn.execute(
            "SELECT count(*) FILTER (WHERE trace_context IS NOT NULL) FROM sendonce_outbox"
        ).fetchone()
        version = conn.execute("SELECT value FROM sendonce_outbox_meta").fetchone()
    assert (after, dead_after) == (before, dead_before)
    assert contexts == (0,) and version == ("5",)
    with otel.tracer_provider.get_tracer("web").start_as_current_span("POST /orders"):
        with psycopg.connect(outbox_url) as conn:  # a new row has its context
            enqueue(conn, [Message("r", message_id="r-1")], entity="orders")
            conn.commit()
    with Relay(outbox_url, broker, [EntityProfile("orders")]) as relay:
        assert relay.drain().published == 3  # the two old pending rows and the new one
    got = {m.message_id: m for m in broker.receive("orders", max_messages=20,
                                                   mode="receive_and_delete")}  # fmt: skip
    assert sorted(got) == ["q-0", "q-1", "r-1"]  # p-*: published before, elsewhere
    assert "traceparent" in dict(got["r-1"].application_properties or {})
    relay_span = otel.named("relay orders")[-1]
    assert len(relay_span.links) == 1  # the old rows link nothing


def test_a_batch_of_more_producers_than_the_link_limit_links_the_first_and_counts_the_rest(
    outbox_url: str, broker: LocalBackend, otel: Any
) -> None:
    from sendonce.outbox._telemetry import MAX_LINKS

    install(outbox_url)
    web = otel.tracer_provider.get_tracer("web")
    requests = MAX_LINKS + 3
    with psycopg.connect(outbox_url) as conn:
        for n in range(requests):  # each its own request, committed in one transaction
            with web.start_as_current_span(f"POST /orders/{n}"):
                enqueue(conn, [Message("o", message_id=f"o-{n}")], entity="orders")
        with web.start_as_current_span("POST /orders/again"):  # one request, two rows
            enqueue(
                conn, [Message("o", message_id=f"again-{n}") for n in range(2)], entity="orders"
            )
        conn.commit()
    with Relay(
        outbox_url, broker, [EntityProfile("orders")], batch_size=2000
    ) as relay:  # one round: its first claim takes a tenth, 200 rows
        assert relay.drain().published == requests + 2
    [relay_span] = otel.named("relay orders")
    assert relay_span.attributes["sendonce.rows"] == requests + 2
    assert len(relay_span.links) == MAX_LINKS
    assert relay_span.attributes["sendonce.links_dropped"] == requests + 1 - MAX_LINKS
    assert len({link.context.span_id for link in relay_span.links}) == MAX_LINKS


def test_a_context_sendonce_did_not_write_is_ignored_never_fatal(
    outbox_url: str, broker: LocalBackend, otel: Any
) -> None:
    """A ``trace_context`` someone else wrote (not the propagator's JSON, or an invalid
    traceparent): the row is published as enqueued; nothing is linked from it."""
    install(outbox_url)
    with psycopg.connect(outbox_url) as conn:
        enqueue(conn, [Message(f"o{n}", message_id=f"o-{n}") for n in range(3)], entity="orders")
        conn.execute(
            "UPDATE sendonce_outbox SET trace_context = (ARRAY['not json', '[1, 2]', "
            """'{"traceparent": "00-zz-yy-01"}'])[id]"""
        )
        conn.commit()
    with Relay(outbox_url, broker, [EntityProfile("orders")]) as relay:
        assert relay.drain().published == 3
    got = broker.receive("orders", max_messages=5, mode="receive_and_delete")
    [transfer] = otel.named("send orders")
    assert sorted(m.message_id for m in got) == ["o-0", "o-1", "o-2"]
    for message in got:  # the sender's own context, as on any send
        assert dict(message.application_properties or {}) == {
            "traceparent": traceparent_of(transfer),
            "Diagnostic-Id": traceparent_of(transfer),
        }
    assert otel.one("relay orders").links == ()
