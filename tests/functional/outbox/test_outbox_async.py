"""aenqueue: the outbox from asyncio applications (psycopg AsyncConnection, SQLAlchemy
AsyncSession), in the caller's transaction."""

from __future__ import annotations

import asyncio

import pytest

from sendonce import EntityProfile, Message
from sendonce.backends import LocalBackend
from sendonce.errors import ConfigurationError
from sendonce.outbox import Relay, aenqueue, install

pytestmark = pytest.mark.postgres


def test_aenqueue_joins_the_callers_async_transaction(
    outbox_url: str, broker: LocalBackend
) -> None:
    import psycopg

    install(outbox_url)

    async def produce() -> None:
        async with await psycopg.AsyncConnection.connect(outbox_url) as conn:
            await aenqueue(
                conn, [Message("a", message_id="a-1", partition_key="a")], entity="orders"
            )
            await conn.commit()
            await aenqueue(
                conn, [Message("a", message_id="a-2", partition_key="a")], entity="orders"
            )
            await conn.rollback()
        async with await psycopg.AsyncConnection.connect(outbox_url, autocommit=True) as conn:
            with pytest.raises(ConfigurationError, match="autocommit"):
                await aenqueue(conn, [Message("x", message_id="x")], entity="orders")
            async with conn.transaction():
                await aenqueue(
                    conn, [Message("a", message_id="a-3", partition_key="a")], entity="orders"
                )

    asyncio.run(produce())
    with Relay(outbox_url, broker, [EntityProfile("orders")]) as relay:
        relay.drain()
    assert broker.message_ids("orders") == ["a-1", "a-3"]


def test_aenqueue_with_a_sqlalchemy_async_session(outbox_url: str, broker: LocalBackend) -> None:
    pytest.importorskip("greenlet")
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    install(outbox_url)

    async def produce() -> None:
        engine = create_async_engine(outbox_url.replace("postgresql://", "postgresql+psycopg://"))
        try:
            async with AsyncSession(engine) as session:
                await session.execute(text("CREATE TABLE orders (id int PRIMARY KEY)"))
                await session.commit()
                await session.execute(text("INSERT INTO orders VALUES (1)"))
                await aenqueue(session, [Message("1", message_id="o-1")], entity="orders")
                await session.commit()
                await session.execute(text("INSERT INTO orders VALUES (2)"))
                await aenqueue(session, [Message("2", message_id="o-2")], entity="orders")
                await session.rollback()
        finally:
            await engine.dispose()

    asyncio.run(produce())
    with Relay(outbox_url, broker, [EntityProfile("orders")]) as relay:
        relay.drain()
    assert broker.message_ids("orders") == ["o-1"]
