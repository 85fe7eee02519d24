"""`outbox.enqueue` on plain DB-API connections (psycopg 3, psycopg2, sqlite3, PyMySQL) and
`enqueue_async` on asyncpg's and psycopg's async connections, against the real databases: the row
joins the caller's transaction (a rollback drops it, the connection stays the caller's, open and
in its transaction), autocommit is refused, the inbox and the testing helpers take the same
handles, and a relay publishes what a plain connection wrote. Also the scoped sessions, and the
error naming a wrong object.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import psycopg
import psycopg2  # type: ignore[import-untyped]
import pymysql
import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import scoped_session, sessionmaker

import outbox
from outbox import testing
from outbox.plain import driver_of
from tests.docs_blocks import block
from tests.support.broker import Broker
from tests.support.db import make_app_engine
from tests.support.relays import RelayFactory
from tests.support.templates import Templates

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ARGS: dict[str, Any] = {"exchange": "orders", "routing_key": "order.created", "payload": {"n": 1}}
SYNC = ["psycopg", "psycopg2", "sqlite3", "pymysql"]
URL_OF = {
    "psycopg": "pg_url",
    "psycopg2": "pg_url",
    "sqlite3": "sqlite_url",
    "pymysql": "mysql_url",
}


def _connect(driver: str, url: str) -> Any:
    """A plain connection of `driver` to where the SQLAlchemy `url` points, in its default mode."""
    u = make_url(url)
    if driver == "sqlite3":
        return sqlite3.connect(str(u.database))
    if driver == "pymysql":
        return pymysql.connect(
            host=u.host, port=u.port or 3306, user=u.username, database=u.database
        )
    options = str(u.query["options"])
    if driver == "psycopg":
        return psycopg.connect(
            host=u.host, port=u.port, user=u.username, dbname=u.database, options=options
        )
    return psycopg2.connect(
        host=u.host, port=u.port, user=u.username, dbname=u.database, options=options
    )


def _count(conn: Any) -> int:
    cur = conn.cursor()
    cur.execute("SELECT count(*) FROM outbox_message")
    (n,) = cur.fetchone()
    cur.close()
    return int(n)


def _autocommit(driver: str, conn: Any) -> None:
    if driver == "sqlite3":
        conn.isolation_level = None
    elif driver == "pymysql":
        conn.autocommit(True)
    else:
        conn.autocommit = True


@pytest.fixture
def place(request: pytest.FixtureRequest, templates: Templates) -> Iterator[tuple[str, Engine]]:
    """(driver, an engine on a database of this test's own with the outbox schema)."""
    driver = request.param
    url = str(request.getfixturevalue(URL_OF[driver]))
    engine = make_app_engine(url)
    templates.migrate(engine)
    yield driver, engine
    engine.dispose()


@pytest.mark.parametrize("place", SYNC, indirect=True)
def test_a_plain_connection_writes_in_its_transaction_and_never_ends_it(
    place: tuple[str, Engine],
) -> None:
    driver, engine = place
    conn = _connect(driver, str(engine.url.render_as_string(hide_password=False)))
    try:
        first = outbox.enqueue(conn, **ARGS, key="k")
        again = outbox.enqueue(conn, **ARGS, idempotency_key="once")
        assert outbox.enqueue(conn, **ARGS, idempotency_key="once") == again
        (found,) = testing.assert_enqueued(conn, key="k")
        assert found.id == first
        assert outbox.process_once(conn, consumer="c", message_id=str(first))
        assert not outbox.process_once(conn, consumer="c", message_id=str(first))
        assert _count(conn) == 2  # seen inside the transaction ...
        with engine.connect() as other:  # ... and nowhere else: nothing was committed
            assert other.execute(text("SELECT count(*) FROM outbox_message")).scalar() == 0
        conn.rollback()
        assert _count(conn) == 0
        kept = outbox.enqueue(conn, **ARGS)
        conn.commit()  # the caller's commit, on the connection that is still open
        with engine.connect() as other:
            ids = other.execute(text("SELECT id FROM outbox_message")).scalars().all()
        assert [uuid.UUID(str(i)) for i in ids] == [kept]
    finally:
        conn.close()


@pytest.mark.parametrize("place", SYNC, indirect=True)
def test_autocommit_is_refused_before_anything_is_written(place: tuple[str, Engine]) -> None:
    driver, engine = place
    conn = _connect(driver, str(engine.url.render_as_string(hide_password=False)))
    try:
        _autocommit(driver, conn)
        with pytest.raises(outbox.NotInTransaction, match=r"autocommit mode.*commit on its own"):
            outbox.enqueue(conn, **ARGS)
        with pytest.raises(outbox.OutboxError, match="autocommit"):
            outbox.process_once(conn, consumer="c", message_id="m")
        assert testing.enqueued(conn) == []  # reading needs no transaction
        assert _count(conn) == 0
        cur = conn.cursor()
        cur.execute("BEGIN")  # a transaction opened explicitly, in autocommit mode, is taken
        outbox.enqueue(conn, **ARGS)
        cur.execute("ROLLBACK")
        cur.close()
        assert _count(conn) == 0
    finally:
        conn.close()


def test_a_transaction_opened_in_autocommit_mode_is_the_callers(
    pg_url: str, templates: Templates
) -> None:
    engine = make_app_engine(pg_url)
    templates.migrate(engine)
    conn = _connect("psycopg", pg_url)
    conn.autocommit = True
    try:
        with conn.transaction():
            outbox.enqueue(conn, **ARGS)
            with contextlib.suppress(psycopg.Rollback), conn.transaction():  # a savepoint
                outbox.enqueue(conn, **ARGS, key="gone")
                raise psycopg.Rollback
        assert [m.key for m in testing.enqueued(conn)] == [None]  # committed, without "gone"
    finally:
        conn.close()
        engine.dispose()


def test_a_call_costs_one_statement_and_changes_nothing_on_the_connection(
    pg_url: str, sqlite_url: str, templates: Templates
) -> None:
    from outbox.borrowed import _engine

    engines = [make_app_engine(pg_url), make_app_engine(sqlite_url)]
    for engine in engines:
        templates.migrate(engine)
    pg = _connect("psycopg", pg_url)
    lite = _connect("sqlite3", sqlite_url)
    try:
        for conn in (pg, lite):
            outbox.enqueue(conn, **ARGS)  # the driver's engine made, the dialect initialised
            statements: list[str] = []
            borrowed = _engine(driver_of(conn))  # type: ignore[arg-type]

            def count(*args: Any) -> None:
                statements.append(args[2])

            event.listen(borrowed, "before_cursor_execute", count)
            try:
                outbox.enqueue(conn, **ARGS)
            finally:
                event.remove(borrowed, "before_cursor_execute", count)
            assert len(statements) == 1, statements
        assert pg._notice_handlers == []  # no handler of SQLAlchemy's left on it
        with pytest.raises(
            sqlite3.OperationalError, match=r"(?i)no such function: regexp"
        ):  # nor SQL function
            lite.execute("SELECT 'a' REGEXP 'a'")
        assert lite.in_transaction
        assert pg.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    finally:
        pg.close()
        lite.close()
        for engine in engines:
            engine.dispose()


def test_a_relay_publishes_what_a_plain_connection_wrote(
    pg_url: str, templates: Templates, broker: Broker, relay_factory: RelayFactory
) -> None:
    engine = make_app_engine(pg_url)
    templates.migrate(engine)
    conn = _connect("psycopg", pg_url)
    try:
        sent = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="order.created", payload={"n": 7}
        )
        conn.commit()
    finally:
        conn.close()
        engine.dispose()
    relay_factory(pg_url)
    (delivery,) = broker.collect_ids([sent])
    assert delivery.body == b'{"n":7}'


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg_async"])
def test_async_plain_connections(driver: str, pg_url: str, templates: Templates) -> None:
    engine = make_app_engine(pg_url)
    templates.migrate(engine)
    u = make_url(pg_url)
    options = str(u.query["options"])

    async def body() -> None:
        conn: Any
        if driver == "asyncpg":
            conn = await asyncpg.connect(
                host=u.host,
                port=u.port,
                user=u.username,
                database=u.database,
                server_settings={"search_path": options.removeprefix("-csearch_path=")},
            )
        else:
            conn = await psycopg.AsyncConnection.connect(
                host=u.host, port=u.port, user=u.username, dbname=u.database, options=options
            )
            await conn.set_autocommit(True)
        try:
            with pytest.raises(
                outbox.NotInTransaction, match=r"outside any transaction|autocommit"
            ):
                await outbox.enqueue_async(conn, **ARGS)
            with pytest.raises(outbox.InvalidSession, match=r"await outbox\.enqueue_async"):
                outbox.enqueue(conn, **ARGS)
            async with conn.transaction():
                sent = await outbox.enqueue_async(conn, **ARGS, key="a")
                (found,) = await testing.assert_enqueued_async(conn, key="a")
                assert found.id == sent
                assert found.headers == {}
                assert await outbox.process_once_async(conn, consumer="c", message_id=str(sent))
                assert not await outbox.process_once_async(conn, consumer="c", message_id=str(sent))
                await outbox.enqueue_async(conn, **ARGS, key="b")  # a second call, same statement
            assert len(await testing.enqueued_async(conn)) == 2  # committed by the caller
        finally:
            await conn.close()

    try:
        asyncio.run(body())
    finally:
        engine.dispose()


def test_scoped_sessions_are_taken_wherever_a_session_is(pg_url: str, templates: Templates) -> None:
    engine = make_app_engine(pg_url)
    templates.migrate(engine)
    scoped = scoped_session(sessionmaker(engine))
    try:
        sent = outbox.enqueue(scoped, **ARGS)
        assert outbox.process_once(scoped, consumer="c", message_id=str(sent))
        (found,) = testing.assert_enqueued(scoped)
        assert found.id == sent
        scoped.rollback()
        testing.assert_not_enqueued(scoped)
    finally:
        scoped.remove()

    async def body() -> None:
        async_engine = create_async_engine(pg_url.replace("+psycopg", "+psycopg_async"))
        ascoped = async_scoped_session(
            async_sessionmaker(async_engine), scopefunc=asyncio.current_task
        )
        try:
            sent = await outbox.enqueue_async(ascoped, **ARGS)
            assert await outbox.process_once_async(ascoped, consumer="c", message_id=str(sent))
            await testing.assert_enqueued_async(ascoped, count=1)
            await ascoped.rollback()
        finally:
            await ascoped.remove()
            await async_engine.dispose()

    try:
        asyncio.run(body())
    finally:
        engine.dispose()


WRONG: list[tuple[Callable[[Any], Any], str]] = [
    (lambda c: c.cursor(), "psycopg.Cursor (a cursor: pass the connection it belongs to)"),
    (lambda c: sessionmaker(), "sqlalchemy.orm.sessionmaker (a sessionmaker makes sessions"),
    (lambda c: object(), "needs a SQLAlchemy Session or Connection"),  # ... not an object
]


@pytest.mark.parametrize(("make", "says"), WRONG, ids=["cursor", "sessionmaker", "object"])
def test_a_wrong_object_is_named_with_its_module(
    make: Callable[[Any], Any], says: str, pg_url: str
) -> None:
    conn = _connect("psycopg", pg_url)
    try:
        wrong = make(conn)
        with pytest.raises(outbox.InvalidSession, match=r"not an? ") as raised:
            outbox.enqueue(wrong, **ARGS)
        assert says in str(raised.value)
        with pytest.raises(outbox.InvalidSession):
            outbox.process_once(wrong, consumer="c", message_id="m")
        with pytest.raises(outbox.InvalidSession):
            asyncio.run(outbox.enqueue_async(wrong, **ARGS))
        with pytest.raises(outbox.InvalidSession, match="which is synchronous"):
            asyncio.run(outbox.enqueue_async(conn, **ARGS))
    finally:
        conn.close()


def test_an_async_session_is_not_taken_by_process_once() -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(outbox.InvalidSession, match=r"await outbox\.process_once_async"):
        outbox.process_once(AsyncSession(engine), consumer="c", message_id="m")  # type: ignore[arg-type]


def test_the_plain_connection_example_of_the_writing_page(
    pg_url: str, templates: Templates
) -> None:
    engine = make_app_engine(pg_url)
    templates.migrate(engine)
    code = block("guides/writing.md", "writing-plain")
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code, "writing.md (writing-plain)", "exec", dont_inherit=True), namespace)
    conn = _connect("psycopg", pg_url)
    try:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.commit()
        namespace["place_order"](conn, 5)
        with pytest.raises(psycopg.errors.UniqueViolation):  # the order again: nothing commits
            namespace["place_order"](conn, 5)
        conn.rollback()
        (sent,) = testing.assert_enqueued(conn, key="order-5")
        assert sent.payload == {"order_id": 5}
    finally:
        conn.close()
        engine.dispose()
