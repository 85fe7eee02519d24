"""`outbox.enqueue_async` on every async driver (asyncpg, psycopg's async mode, aiosqlite) against
real databases; `outbox.enqueue` on psycopg2; a relay publishing what async code enqueued.

Each test runs its coroutine with `asyncio.run` and disposes its async engine inside that loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine, String, create_engine, func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import outbox
from outbox.schema import message as outbox_message
from outbox.testing import (
    assert_enqueued_async,
    assert_not_enqueued_async,
    enqueued,
    enqueued_async,
)
from tests.support.broker import Broker
from tests.support.db import make_app_engine, pg_schema, row_count
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

T = TypeVar("T")
DRIVERS = ["asyncpg", "psycopg", "asyncmy", "aiosqlite"]
PG_DRIVERS = ["asyncpg", "psycopg"]


class Base(DeclarativeBase):
    pass


class Order(Base):
    """The caller's business row, written in the same transaction as the message."""

    __tablename__ = "test_async_order"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(50))


@dataclass
class Target:
    """One database reached through one async driver; `url` is the sync URL of the same place."""

    driver: str
    url: str
    async_url: str
    connect_args: dict[str, Any] = field(default_factory=dict)

    def async_engine(self) -> AsyncEngine:
        return create_async_engine(self.async_url, connect_args=self.connect_args)

    def run(self, body: Callable[[AsyncEngine], Awaitable[T]]) -> T:
        """Run `body(engine)` in a fresh event loop, disposing the engine inside it."""

        async def main() -> T:
            engine = self.async_engine()
            try:
                return await body(engine)
            finally:
                await engine.dispose()

        return asyncio.run(main())


def async_target(driver: str, url: str) -> Target:
    if driver == "aiosqlite":
        return Target(driver, url, url.replace("sqlite://", "sqlite+aiosqlite://", 1))
    if driver == "psycopg":  # psycopg 3 is sync and async: create_async_engine picks async mode
        return Target(driver, url, url)
    if driver == "asyncmy":  # mysql+ on a MariaDB URL: one schema, either dialect name
        return Target(
            driver,
            url,
            make_url(url).set(drivername="mysql+asyncmy").render_as_string(hide_password=False),
        )
    # asyncpg does not take libpq's `options`: the schema goes in as a server setting.
    plain = make_url(url).difference_update_query(["options"]).set(drivername="postgresql+asyncpg")
    server_settings = {"search_path": pg_schema(url)}
    return Target(
        driver,
        url,
        plain.render_as_string(hide_password=False),
        {"server_settings": server_settings},
    )


@pytest.fixture(params=DRIVERS)
def bare(request: pytest.FixtureRequest) -> Target:
    """A database of this test's own without the outbox schema, through each async driver."""
    driver = str(request.param)
    fixture = {"aiosqlite": "sqlite_url", "asyncmy": "mysql_url"}.get(driver, "pg_url")
    url = str(request.getfixturevalue(fixture))
    return async_target(driver, url)


@pytest.fixture
def target(bare: Target) -> Target:
    """`bare` with the outbox schema and the test's business table."""
    engine = make_app_engine(bare.url)
    outbox.create_schema(engine)
    Base.metadata.create_all(engine)
    engine.dispose()
    return bare


@pytest.fixture
def sync_engine(target: Target) -> Iterator[Engine]:
    """The same database through the sync driver, to look at what was committed."""
    engine = make_app_engine(target.url)
    yield engine
    engine.dispose()


def message(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "exchange": "orders",
        "routing_key": "order.created",
        "payload": {"order_id": 42},
    }
    args.update(overrides)
    return args


def order_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Order)).scalar_one())


# --------------------------------------------------------------------------- commit / rollback


FULL = message(
    key="order-42",
    headers={"tenant": "acme", "version": 2, "ratio": 0.5, "vip": True},
    delay=dt.timedelta(seconds=30),
    priority=5,
    max_attempts=3,
    content_type="application/vnd.acme+json",
)


@pytest.mark.parametrize("form", ["session", "connection"])
def test_commit_writes_the_row_and_the_business_row(
    target: Target, sync_engine: Engine, form: str
) -> None:
    async def body(engine: AsyncEngine) -> uuid.UUID:
        if form == "session":
            async with AsyncSession(engine) as session, session.begin():
                order = Order(id=42, customer="acme")
                session.add(order)
                message_id = await outbox.enqueue_async(session, **FULL)
                # Joined the session's transaction without flushing the caller's objects.
                assert order in session.new
                # The transaction sees its own uncommitted row, through the async test helpers.
                await assert_enqueued_async(session, count=1, key="order-42")
                with pytest.raises(AssertionError, match=r"(?s)1 found.*key='order-42'"):
                    await assert_not_enqueued_async(session, exchange="orders")
            return message_id
        async with engine.connect() as conn, conn.begin():
            await conn.execute(insert(Order).values(id=42, customer="acme"))
            return await outbox.enqueue_async(conn, **FULL)

    message_id = target.run(body)
    with sync_engine.connect() as conn:
        [row] = enqueued(conn)
    assert row.id == message_id
    assert (row.exchange, row.routing_key, row.key) == ("orders", "order.created", "order-42")
    assert row.payload == {"order_id": 42}
    assert row.body == json.dumps({"order_id": 42}, separators=(",", ":")).encode()
    assert row.content_type == "application/vnd.acme+json"
    assert row.headers == {"tenant": "acme", "version": 2, "ratio": 0.5, "vip": True}
    assert (row.priority, row.max_attempts, row.state) == (5, 3, "pending")
    assert row.idempotency_key is None
    assert row.available_at - row.created_at == dt.timedelta(seconds=30)
    assert order_count(sync_engine) == 1


@pytest.mark.parametrize("form", ["session", "connection"])
def test_rollback_leaves_no_row(target: Target, sync_engine: Engine, form: str) -> None:
    async def body(engine: AsyncEngine) -> uuid.UUID:
        if form == "session":
            async with AsyncSession(engine) as session:
                await session.begin()
                session.add(Order(id=1, customer="rolled back"))
                lost = await outbox.enqueue_async(session, **message())
                await session.rollback()
                return lost
        async with engine.connect() as conn:
            tx = await conn.begin()
            lost = await outbox.enqueue_async(conn, **message())
            await tx.rollback()
            return lost

    lost = target.run(body)
    assert row_count(sync_engine) == 0
    assert row_count(sync_engine, id=lost) == 0
    assert order_count(sync_engine) == 0


def test_a_rolled_back_savepoint_takes_only_its_own_message(
    target: Target, sync_engine: Engine
) -> None:
    async def body(engine: AsyncEngine) -> tuple[uuid.UUID, uuid.UUID]:
        async with AsyncSession(engine) as session, session.begin():
            kept = await outbox.enqueue_async(session, **message(routing_key="outer"))
            savepoint = await session.begin_nested()
            lost = await outbox.enqueue_async(session, **message(routing_key="inner"))
            await savepoint.rollback()
            assert [m.id for m in await enqueued_async(session)] == [kept]
            async with session.begin_nested():  # released: its message commits with the rest
                also = await outbox.enqueue_async(session, **message(routing_key="released"))
        assert lost not in (kept, also)
        return kept, also

    kept, also = target.run(body)
    with sync_engine.connect() as conn:
        assert [m.id for m in enqueued(conn)] == [kept, also]


# --------------------------------------------------------------------------- idempotency


def test_a_repeated_idempotency_key_returns_the_first_id_and_writes_nothing(
    target: Target, sync_engine: Engine
) -> None:
    keyed = message(idempotency_key="order-42/created")

    async def body(engine: AsyncEngine) -> list[uuid.UUID]:
        async with engine.begin() as conn:
            first = await outbox.enqueue_async(conn, **keyed)
            same_transaction = await outbox.enqueue_async(conn, **keyed)
        async with AsyncSession(engine) as session, session.begin():
            later = await outbox.enqueue_async(session, **keyed)
            other = await outbox.enqueue_async(session, **message(idempotency_key="another"))
        return [first, same_transaction, later, other]

    first, same_transaction, later, other = target.run(body)
    assert same_transaction == first
    assert later == first
    assert other != first
    assert row_count(sync_engine) == 2
    assert row_count(sync_engine, idempotency_key="order-42/created") == 1


def backend_pid_blocked(admin: Engine, pid: int) -> bool:
    with admin.connect() as conn:
        event = conn.execute(
            text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar()
    return event == "Lock"


@pytest.mark.parametrize("bare", PG_DRIVERS, indirect=True)
def test_racing_idempotency_keys_give_the_second_caller_the_first_id(
    target: Target, sync_engine: Engine, pg_admin: Engine
) -> None:
    keyed = message(idempotency_key="raced")

    async def body(engine: AsyncEngine) -> tuple[uuid.UUID, uuid.UUID]:
        async with engine.connect() as first, engine.connect() as second:
            await first.begin()
            first_id = await outbox.enqueue_async(first, **keyed)  # holds the key, uncommitted
            await second.begin()
            pid = int((await second.execute(text("SELECT pg_backend_pid()"))).scalar_one())
            racer = asyncio.create_task(outbox.enqueue_async(second, **keyed))
            # The second INSERT waits on the first transaction's unique-index entry...
            await asyncio.to_thread(
                wait_until,
                lambda: backend_pid_blocked(pg_admin, pid),
                what=f"backend {pid} to wait on a lock",
            )
            assert not racer.done()
            # ...and sees the winner's row once that transaction commits.
            await first.commit()
            second_id = await asyncio.wait_for(racer, 10)
            await second.commit()
        return first_id, second_id

    first_id, second_id = target.run(body)
    assert second_id == first_id
    assert row_count(sync_engine) == 1


# --------------------------------------------------------------------------- refusals


REFUSED: list[tuple[dict[str, Any], type[outbox.OutboxError], str]] = [
    (message(payload={"tags": {1, 2}}), outbox.PayloadEncodingError, "JSON"),
    (message(headers={"h": None}), outbox.InvalidHeader, "'h'"),
    (message(exchange="", routing_key=""), outbox.InvalidDestination, "empty"),
    (message(delay=-1), outbox.InvalidOption, "negative"),
    (message(key="k\x00"), outbox.InvalidOption, "NUL"),
]


def test_a_refused_call_writes_nothing_and_the_transaction_goes_on(
    target: Target, sync_engine: Engine
) -> None:
    """Refusals happen before any SQL: even PostgreSQL has not aborted the transaction."""

    async def body(engine: AsyncEngine) -> uuid.UUID:
        async with AsyncSession(engine) as session, session.begin():
            for args, error, says in REFUSED:
                with pytest.raises(error, match=says):
                    await outbox.enqueue_async(session, **args)
            return await outbox.enqueue_async(session, **message(payload={"after": "refusals"}))

    kept = target.run(body)
    assert row_count(sync_engine) == 1
    assert row_count(sync_engine, id=kept) == 1


def test_a_database_without_the_schema_raises_schema_missing(bare: Target) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with engine.connect() as conn:
            with pytest.raises(outbox.SchemaMissing, match="outbox-relay migrate") as raised:
                await outbox.enqueue_async(conn, **message(idempotency_key="k"))
            await conn.rollback()
            # Both paths (with and without an idempotency key) translate the error.
            with pytest.raises(outbox.SchemaMissing):
                await outbox.enqueue_async(conn, **message())
            await conn.rollback()
        assert raised.value.__cause__ is not None  # the driver's error is kept as the cause

    bare.run(body)


@pytest.mark.parametrize("bare", ["aiosqlite"], indirect=True)
def test_the_wrong_kind_of_session_names_the_right_call(target: Target) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session, session.begin():
            with pytest.raises(outbox.InvalidSession, match=r"await outbox\.enqueue_async\("):
                outbox.enqueue(session, **message())  # type: ignore[arg-type]
            conn = await session.connection()
            with pytest.raises(TypeError, match=r"await outbox\.enqueue_async\("):
                outbox.enqueue(conn, **message())  # type: ignore[arg-type]
            with pytest.raises(outbox.InvalidSession, match="AsyncSession or AsyncConnection"):
                await outbox.enqueue_async(engine, **message())  # type: ignore[arg-type]
            assert await enqueued_async(session) == []

    target.run(body)


# --------------------------------------------------------------------------- trace context


@pytest.mark.parametrize("bare", ["asyncpg"], indirect=True)
def test_each_task_stores_its_own_trace_context(target: Target, sync_engine: Engine) -> None:
    """The context is read in the calling task (contextvars): a task running while another task
    is inside a span stores no trace, and the traced task stores its own span's."""
    tracer = TracerProvider().get_tracer("test")
    span_ids: dict[str, str] = {}

    async def body(engine: AsyncEngine) -> dict[str, uuid.UUID]:
        entered, other_done = asyncio.Event(), asyncio.Event()

        async def traced() -> uuid.UUID:
            with tracer.start_as_current_span("POST /orders") as span:
                context = span.get_span_context()
                span_ids["traced"] = f"{context.trace_id:032x}-{context.span_id:016x}"
                entered.set()
                await other_done.wait()
                async with AsyncSession(engine) as session, session.begin():
                    return await outbox.enqueue_async(session, **message(routing_key="traced"))

        async def untraced() -> uuid.UUID:
            await entered.wait()
            try:
                async with engine.begin() as conn:
                    return await outbox.enqueue_async(conn, **message(routing_key="untraced"))
            finally:
                other_done.set()

        traced_id, untraced_id = await asyncio.gather(traced(), untraced())
        return {"traced": traced_id, "untraced": untraced_id}

    ids = target.run(body)
    with sync_engine.connect() as conn:
        stored = dict(conn.execute(select(outbox_message.c.id, outbox_message.c.traceparent)).all())
    assert set(stored) == {ids["traced"], ids["untraced"]}
    assert stored[ids["untraced"]] is None
    traceparent = stored[ids["traced"]]
    assert traceparent is not None
    assert traceparent[3:-3] == span_ids["traced"]  # 00-<trace id>-<span id>-<flags>


# --------------------------------------------------------------------------- psycopg2


def test_enqueue_works_on_a_psycopg2_engine(pg_url: str, pg_admin: Engine) -> None:
    url = make_url(pg_url).set(drivername="postgresql+psycopg2").render_as_string(False)
    engine = create_engine(url)
    try:
        with engine.connect() as conn, pytest.raises(outbox.SchemaMissing):
            outbox.enqueue(conn, **message())  # psycopg2 names the SQLSTATE `pgcode`
        outbox.create_schema(engine)
        with engine.begin() as conn:
            first = outbox.enqueue(conn, **FULL, idempotency_key="once")
            assert outbox.enqueue(conn, **message(idempotency_key="once")) == first
        with engine.connect() as conn:
            tx = conn.begin()
            outbox.enqueue(conn, **message())
            tx.rollback()
        with engine.connect() as conn:
            [row] = enqueued(conn)
        assert row.id == first
        assert row.headers == FULL["headers"]
        assert row.available_at - row.created_at == dt.timedelta(seconds=30)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- through a relay


def test_a_relay_publishes_what_async_code_enqueued(
    target: Target, broker: Broker, relay_factory: RelayFactory
) -> None:
    relay_factory(target.url)

    async def body(engine: AsyncEngine) -> uuid.UUID:
        async with AsyncSession(engine) as session, session.begin():
            session.add(Order(id=7, customer="acme"))
            return await outbox.enqueue_async(
                session,
                exchange=broker.exchange,
                routing_key="order.created",
                payload={"order_id": 7},
                key="order-7",
                headers={"tenant": "acme"},
            )

    message_id = target.run(body)
    [delivery] = broker.collect_ids([message_id])
    assert delivery.message_id == str(message_id)
    assert json.loads(delivery.body) == {"order_id": 7}
    assert delivery.properties.content_type == "application/json"
    assert delivery.properties.headers["tenant"] == "acme"
    assert delivery.properties.headers["x-outbox-key"] == "order-7"
    assert delivery.routing_key == "order.created"
