"""`outbox.enqueue_many` against real databases (PostgreSQL, MariaDB, SQLite): ids in the items'
order, rows numbered in list order, every item checked before anything is written, idempotency
keys as `enqueue` treats them, chunks past every parameter limit, one NOTIFY per call, plain
DB-API connections; `enqueue_many_async` on the async drivers."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import psycopg
import pymysql
import pytest
from sqlalchemy import Engine, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox.schema import message
from tests.integration.test_enqueue_async import async_target
from tests.support.db import make_app_engine, pg_schema, row_count
from tests.support.templates import Templates

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def item(n: int, **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "exchange": "orders",
        "routing_key": "order.created",
        "payload": {"n": n},
    }
    args.update(overrides)
    return args


def by_seq(engine: Engine) -> list[dict[str, Any]]:
    """Every outbox row, in seq order, as a dict of its columns."""
    with engine.connect() as conn:
        rows = conn.execute(select(message).order_by(message.c.seq)).mappings().all()
    return [dict(row) for row in rows]


class Statements:
    """The SQL an engine sends while the block runs."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sent: list[str] = []

    def _count(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.sent.append(statement)

    def __enter__(self) -> list[str]:
        event.listen(self.engine, "before_cursor_execute", self._count)
        return self.sent

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._count)


# --------------------------------------------------------------------------- order and ids


def test_ids_come_back_in_the_items_order_and_rows_are_numbered_in_list_order(
    app_engine: Engine,
) -> None:
    items = [item(n, key=f"k{n % 3}", priority=n % 2) for n in range(30)]
    with Session(app_engine) as session, session.begin():
        ids = outbox.enqueue_many(session, items)
    assert len(ids) == len(set(ids)) == 30
    rows = by_seq(app_engine)
    assert [uuid.UUID(str(row["id"])) for row in rows] == ids
    assert [row["key"] for row in rows] == [f"k{n % 3}" for n in range(30)]
    assert [row["payload"] for row in rows] == [f'{{"n":{n}}}'.encode() for n in range(30)]


def test_a_row_is_the_row_enqueue_writes(app_engine: Engine) -> None:
    args = item(
        1,
        key="order-1",
        headers={"tenant": "acme", "version": 2, "ratio": 0.5, "on": True},
        delay=dt.timedelta(seconds=30),
        priority=7,
        max_attempts=3,
        content_type="application/vnd.acme+json",
    )
    with app_engine.begin() as conn:
        one = outbox.enqueue(conn, **args)
        (many,) = outbox.enqueue_many(conn, [args])
    single, batch = by_seq(app_engine)
    assert (uuid.UUID(str(single["id"])), uuid.UUID(str(batch["id"]))) == (one, many)
    differs = {"seq", "id", "created_at", "available_at"}
    assert {k: v for k, v in single.items() if k not in differs} == {
        k: v for k, v in batch.items() if k not in differs
    }
    for row in (single, batch):
        waited = row["available_at"] - row["created_at"]
        assert dt.timedelta(seconds=29) < waited < dt.timedelta(seconds=31)


def test_rolling_back_takes_every_message(app_engine: Engine) -> None:
    with app_engine.connect() as conn, conn.begin() as tx:
        outbox.enqueue_many(conn, [item(n) for n in range(50)])
        tx.rollback()
    assert row_count(app_engine) == 0


def test_an_empty_list_returns_nothing_and_sends_no_sql(app_engine: Engine) -> None:
    with Statements(app_engine) as sent, Session(app_engine) as session:
        assert outbox.enqueue_many(session, []) == []
        assert outbox.enqueue_many(session, iter(())) == []
        assert not session.in_transaction()  # not even a transaction begun
    assert sent == []


# --------------------------------------------------------------------------- checked first


BAD: list[tuple[dict[str, Any] | object, type[outbox.OutboxError], str]] = [
    ({"routing_key": "r", "payload": {}}, outbox.InvalidMessage, "exchange missing"),
    ({"exchange": "x", "routing_key": "r"}, outbox.InvalidMessage, "payload missing"),
    (item(0, colour="red"), outbox.InvalidMessage, "no argument 'colour'"),
    (item(0, payload={"tags": {1, 2}}), outbox.PayloadEncodingError, "JSON"),
    (item(0, headers={"h": None}), outbox.InvalidHeader, "'h'"),
    (item(0, exchange="", routing_key=""), outbox.InvalidDestination, "empty"),
    (item(0, delay=-1), outbox.InvalidOption, "negative"),
    ("exchange=x", outbox.InvalidMessage, "must be a mapping"),
]


@pytest.mark.parametrize(("bad", "error", "says"), BAD)
def test_one_invalid_item_raises_naming_its_index_and_writes_none(
    app_engine: Engine, bad: object, error: type[outbox.OutboxError], says: str
) -> None:
    items: list[Any] = [item(n) for n in range(5)]
    items.insert(3, bad)
    with Session(app_engine) as session, session.begin():
        with pytest.raises(error, match=r"^messages\[3\]") as raised:
            outbox.enqueue_many(session, items)
        assert says in str(raised.value)
        # Nothing reached the database: even PostgreSQL's transaction goes on.
        outbox.enqueue(session, **item(99))
    assert row_count(app_engine) == 1


def test_a_mapping_in_place_of_the_list_is_refused(app_engine: Engine) -> None:
    with app_engine.begin() as conn, pytest.raises(outbox.InvalidMessage, match="a list of"):
        outbox.enqueue_many(conn, item(0))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- idempotency keys


def test_idempotency_keys_behave_as_in_enqueue(app_engine: Engine) -> None:
    with app_engine.begin() as conn:
        earlier = outbox.enqueue(conn, **item(0), idempotency_key="taken")
    items = [
        item(1, key="k"),
        item(2, key="k", idempotency_key="taken"),  # an earlier row holds it
        item(3, key="k", idempotency_key="new"),
        item(4, key="k"),
        item(5, key="k", idempotency_key="new"),  # an earlier item of the list holds it
        item(6, key="k"),
    ]
    with Session(app_engine) as session, session.begin():
        ids = outbox.enqueue_many(session, items)
    assert ids[1] == earlier
    assert ids[4] == ids[2]
    assert len(set(ids)) == 5
    rows = by_seq(app_engine)[1:]  # after the earlier row
    assert [uuid.UUID(str(row["id"])) for row in rows] == [ids[0], ids[2], ids[3], ids[5]]
    assert [row["payload"] for row in rows] == [b'{"n":1}', b'{"n":3}', b'{"n":4}', b'{"n":6}']


# --------------------------------------------------------------------------- chunks


def test_twenty_thousand_messages_on_postgresql(pg_engine: Engine) -> None:
    """Past PostgreSQL's 65,535 bind parameters had they been one VALUES list, and many chunks."""
    items = [item(n, key=f"k{n % 7}") for n in range(20_000)]
    with pg_engine.begin() as conn:
        ids = outbox.enqueue_many(conn, items)
    with pg_engine.connect() as conn:
        found = conn.execute(select(message.c.id).order_by(message.c.seq)).scalars().all()
    assert [uuid.UUID(str(i)) for i in found] == ids


@pytest.mark.parametrize("url", ["mysql_url", "sqlite_url"])
def test_more_messages_than_a_chunk_elsewhere(
    request: pytest.FixtureRequest, templates: Templates, url: str
) -> None:
    engine = make_app_engine(str(request.getfixturevalue(url)))
    templates.migrate(engine)
    try:
        items = [item(n, key=f"k{n % 7}", delay=n % 2) for n in range(2_500)]
        with Statements(engine) as sent, engine.begin() as conn:
            ids = outbox.enqueue_many(conn, items)
        assert len(sent) == 3  # MariaDB: three INSERTs of many rows; SQLite: three executemany
        with engine.connect() as conn:
            found = conn.execute(select(message.c.id).order_by(message.c.seq)).scalars().all()
        assert [uuid.UUID(str(i)) for i in found] == ids
    finally:
        engine.dispose()


def test_a_call_notifies_the_relay_once_on_postgresql(pg_engine: Engine) -> None:
    before = outbox.configure(notify_rate=float("inf"))
    try:
        with Statements(pg_engine) as sent, pg_engine.begin() as conn:
            outbox.enqueue_many(conn, [item(n) for n in range(2_500)])
    finally:
        outbox.configure(notify_rate=before.notify_rate)
    assert sum("pg_notify" in statement for statement in sent) == 1
    assert len(sent) == 4  # three chunks of rows, one NOTIFY


def test_a_call_with_a_listener_delivers_one_notification(pg_engine: Engine) -> None:
    url = pg_engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    listener = psycopg.connect(url, autocommit=True)
    try:
        listener.execute("LISTEN outbox_relay")
        before = outbox.configure(notify_rate=float("inf"))
        try:
            with pg_engine.begin() as conn:
                pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                outbox.enqueue_many(conn, [item(n) for n in range(10)])
        finally:
            outbox.configure(notify_rate=before.notify_rate)
        # Other tests' writers share the database and the channel: this call's carry its pid.
        got = [n for n in listener.notifies(timeout=2) if n.pid == pid]
        assert [n.channel for n in got] == ["outbox_relay"]
    finally:
        listener.close()


# --------------------------------------------------------------------------- plain connections


def _plain(driver: str, url: str) -> Any:
    u = make_url(url)
    if driver == "sqlite3":
        return sqlite3.connect(str(u.database))
    if driver == "pymysql":
        return pymysql.connect(
            host=u.host, port=u.port or 3306, user=u.username, database=u.database
        )
    return psycopg.connect(
        host=u.host,
        port=u.port,
        user=u.username,
        dbname=u.database,
        options=str(u.query["options"]),
    )


@pytest.fixture(params=["psycopg", "sqlite3", "pymysql"])
def plain(request: pytest.FixtureRequest, templates: Templates) -> Iterator[tuple[Any, Engine]]:
    """(a plain DB-API connection of each driver in its default mode, an engine on its database)."""
    driver = str(request.param)
    fixture = {"psycopg": "pg_url", "sqlite3": "sqlite_url", "pymysql": "mysql_url"}[driver]
    url = str(request.getfixturevalue(fixture))
    engine = make_app_engine(url)
    templates.migrate(engine)
    conn = _plain(driver, url)
    yield conn, engine
    conn.close()
    engine.dispose()


def test_a_plain_connection_takes_the_messages_in_its_transaction(
    plain: tuple[Any, Engine],
) -> None:
    conn, engine = plain
    ids = outbox.enqueue_many(conn, [item(n, key="k") for n in range(1_500)])
    assert row_count(engine) == 0  # not committed
    conn.commit()
    assert [uuid.UUID(str(row["id"])) for row in by_seq(engine)] == ids


def test_autocommit_is_refused_before_anything_is_written(plain: tuple[Any, Engine]) -> None:
    conn, engine = plain
    if isinstance(conn, sqlite3.Connection):
        conn.isolation_level = None
    elif isinstance(conn, pymysql.Connection):
        conn.autocommit(True)
    else:
        conn.autocommit = True
    with pytest.raises(outbox.NotInTransaction, match=r"outbox\.enqueue_many"):
        outbox.enqueue_many(conn, [item(0)])
    assert row_count(engine) == 0


def test_an_async_handle_is_sent_to_the_async_call(app_engine: Engine) -> None:
    with pytest.raises(outbox.InvalidSession, match=r"await outbox\.enqueue_many_async"):
        outbox.enqueue_many(AsyncSession(), [item(0)])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- async


ASYNC = ["asyncpg", "psycopg", "aiosqlite", "asyncmy"]


@pytest.fixture(params=ASYNC)
def async_place(request: pytest.FixtureRequest, templates: Templates) -> Iterator[Any]:
    driver = str(request.param)
    fixture = {"aiosqlite": "sqlite_url", "asyncmy": "mysql_url"}.get(driver, "pg_url")
    target = async_target(driver, str(request.getfixturevalue(fixture)))
    engine = make_app_engine(target.url)
    templates.migrate(engine)
    yield target, engine
    engine.dispose()


def test_enqueue_many_async_on_each_async_driver(async_place: Any) -> None:
    target, engine = async_place
    items = [item(n, key=f"k{n % 3}") for n in range(2_500)]
    bad = [*items[:3], item(3, headers={"h": [1]})]

    async def main() -> list[uuid.UUID]:
        async_engine = target.async_engine()
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                with pytest.raises(outbox.InvalidHeader, match=r"^messages\[3\]"):
                    await outbox.enqueue_many_async(session, bad)
                assert await outbox.enqueue_many_async(session, []) == []
                ids = await outbox.enqueue_many_async(session, items)
            async with async_engine.connect() as conn, conn.begin() as tx:
                await outbox.enqueue_many_async(conn, items[:10])
                await tx.rollback()
            return ids
        finally:
            await async_engine.dispose()

    ids = asyncio.run(main())
    assert [uuid.UUID(str(row["id"])) for row in by_seq(engine)] == ids


def test_enqueue_many_async_on_a_plain_asyncpg_connection(
    pg_url: str, templates: Templates
) -> None:
    engine = make_app_engine(pg_url)
    templates.migrate(engine)
    u = make_url(pg_url)

    async def main() -> list[uuid.UUID]:
        conn = await asyncpg.connect(
            host=u.host,
            port=u.port,
            user=u.username,
            database=u.database,
            server_settings={"search_path": pg_schema(pg_url)},
        )
        try:
            with pytest.raises(outbox.NotInTransaction):
                await outbox.enqueue_many_async(conn, [item(0)])
            async with conn.transaction():
                return await outbox.enqueue_many_async(conn, [item(n) for n in range(1_200)])
        finally:
            await conn.close()

    try:
        ids = asyncio.run(main())
        assert [uuid.UUID(str(row["id"])) for row in by_seq(engine)] == ids
    finally:
        engine.dispose()


def test_enqueue_many_async_on_an_async_connection_with_psycopg(
    pg_url: str, templates: Templates
) -> None:
    engine = make_app_engine(pg_url)
    templates.migrate(engine)
    url = make_url(pg_url).set(drivername="postgresql+psycopg")

    async def main() -> list[uuid.UUID]:
        async_engine = create_async_engine(url)
        try:
            async with async_engine.begin() as conn:
                ids = await outbox.enqueue_many_async(conn, [item(n) for n in range(1_200)])
                assert await _count(conn) == 1_200
                return ids
        finally:
            await async_engine.dispose()

    try:
        ids = asyncio.run(main())
        assert [uuid.UUID(str(row["id"])) for row in by_seq(engine)] == ids
    finally:
        engine.dispose()


async def _count(conn: Any) -> int:
    return int((await conn.execute(text("SELECT count(*) FROM outbox_message"))).scalar_one())


def test_the_example_of_the_writing_page(pg_engine: Engine) -> None:
    from tests.docs_blocks import block

    code = block("guides/writing.md", "writing-many")
    namespace: dict[str, Any] = {"__name__": "docs_example", "engine": pg_engine}
    exec(compile(code, "writing.md (writing-many)", "exec", dont_inherit=True), namespace)
    rows = by_seq(pg_engine)
    assert [uuid.UUID(str(row["id"])) for row in rows] == namespace["ids"]
    assert [row["key"] for row in rows] == [f"order-{n}" for n in range(1000)]


@pytest.mark.parametrize("url", ["pg_url", "mysql_url", "sqlite_url"])
def test_without_the_outbox_tables_it_raises_schema_missing(
    request: pytest.FixtureRequest, url: str
) -> None:
    engine = make_app_engine(str(request.getfixturevalue(url)))
    try:
        with engine.connect() as conn, pytest.raises(outbox.SchemaMissing):
            outbox.enqueue_many(conn, [item(0), item(1)])
    finally:
        engine.dispose()
