"""The bytes a consumer receives for a payload of dataclasses, enums, UUIDs, Decimals and datetimes
(docs/guides/payloads.md, blocks "payloads-example" and "payloads-body"), written by `enqueue`,
`enqueue_async` and `celery_task_message`, through a real relay and RabbitMQ."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox.encoding import JSON_TYPE
from tests.docs_blocks import block
from tests.support.broker import Broker
from tests.support.relays import RelayFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_the_consumer_receives_the_documented_bytes(
    pg_url: str, pg_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    namespace: dict[str, Any] = {}
    code = block("guides/payloads.md", "payloads-example")
    exec(compile(code, "docs/guides/payloads.md (payloads-example)", "exec"), namespace)
    expected = block("guides/payloads.md", "payloads-body").strip().encode()

    with Session(pg_engine) as session, session.begin():
        sync_id = namespace["place_order"](session, broker.exchange)

    async def enqueue_async() -> uuid.UUID:
        engine = create_async_engine(pg_url)  # psycopg 3 in its async mode
        try:
            async with engine.begin() as conn:
                event = namespace["OrderPlaced"](
                    order_id=uuid.UUID("0190a5d4-8f3e-7c41-9d2b-5e6f7a8b9c0d"),
                    status=namespace["Status"].PLACED,
                    placed_at=dt.datetime(2030, 1, 2, 3, 4, 5, 120000, tzinfo=dt.UTC),
                    lines=[
                        namespace["Line"]("A-1", Decimal("19.90")),
                        namespace["Line"]("B-2", Decimal("5")),
                    ],
                )
                return await outbox.enqueue_async(
                    conn, exchange=broker.exchange, routing_key="order.placed", payload=event
                )
        finally:
            await engine.dispose()

    async_id = asyncio.run(enqueue_async())
    with Session(pg_engine) as session, session.begin():
        task_id = outbox.enqueue(
            session,
            **outbox.celery_task_message(
                "shop.refund",
                args=[Decimal("19.90"), dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)],
                exchange=broker.exchange,
                routing_key="refund",
                task_id="t-1",
            ),
        )
    relay_factory(pg_url)

    received = {d.message_id: d for d in broker.collect_ids([sync_id, async_id, task_id])}
    for message_id in (sync_id, async_id):
        delivery = received[str(message_id)]
        assert delivery.body == expected
        assert delivery.properties.content_type == JSON_TYPE
    assert received[str(task_id)].body == (
        b'[["19.90","2030-01-02T03:04:05+00:00"],{},'
        b'{"callbacks":null,"errbacks":null,"chain":null,"chord":null}]'
    )
