"""Logical capture (`outbox.configure(capture="logical")`) against a real PostgreSQL: every enqueue
path writes one transactional message into the transaction's WAL and no row; a message with an
idempotency key or a delay gets a held row as well (`available_at` = `logged.HELD_UNTIL`); a
rollback emits nothing; without the relay's slot nothing is written; MySQL/MariaDB and SQLite write
rows as before; the testing helpers refuse to report on a table they cannot see.

What was emitted is read back as the relay reads it: through a pgoutput slot of the module's own
database (`pg_logical_slot_get_binary_changes`, messages on). That needs `wal_level = logical`:
the tests that read the log are skipped, saying so, on a server with another level.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import struct
import subprocess
import sys
import textwrap
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import psycopg
import psycopg2  # type: ignore[import-untyped]
import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox import config, logged, pg_emit, testing
from outbox.logged import Logged
from tests.support.db import PG_ADMIN_URL, make_app_engine, row_count
from tests.support.templates import Templates

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ARGS: dict[str, Any] = {"exchange": "orders", "routing_key": "order.created", "payload": {"n": 1}}
_MESSAGE = ord("M")
_TRANSACTIONAL = 1


@dataclass
class Log:
    """The module's database, with a pgoutput slot and an empty publication to read it by."""

    url: str  # psycopg 3, the database's own
    engine: Engine  # the application's
    admin: Engine  # autocommit: reads the slot and the rows
    slot: str

    def emitted(self) -> list[Logged]:
        """The outbox messages committed since the last call, in log order (consumed); each
        must be transactional."""
        with self.admin.connect() as conn:
            changes = conn.execute(
                text(
                    "SELECT data FROM pg_logical_slot_get_binary_changes(CAST(:slot AS name), "
                    "NULL, NULL, 'proto_version', '1', 'publication_names', CAST(:slot AS text), "
                    "'messages', 'true')"
                ),
                {"slot": self.slot},
            ).scalars()
            found = []
            for data in changes:
                data = bytes(data)
                if data[0] != _MESSAGE:
                    continue
                # 'M', flags, LSN (8 bytes), the prefix (NUL-terminated), length, content.
                end = data.index(b"\0", 10)
                assert data[1] & _TRANSACTIONAL, "a non-transactional message was emitted"
                if data[10:end] != logged.PREFIX.encode():
                    continue
                (size,) = struct.unpack_from("!i", data, end + 1)
                found.append(logged.unpack(data[end + 5 : end + 5 + size]))
            return found

    def rows(self) -> list[dict[str, Any]]:
        """outbox_message's rows, oldest first; available_at as whether it is held."""
        with self.admin.connect() as conn:
            result = conn.exec_driver_sql(
                "SELECT id, exchange, routing_key, payload, content_type, "
                "headers::text AS headers, key, held, idempotency_key, priority, max_attempts, "
                f"state, attempts, available_at = '{logged.HELD_UNTIL}' AS available_at, "
                "created_at, published_at, "
                "traceparent, tracestate FROM outbox_message ORDER BY seq"
            )
            return [dict(row) for row in result.mappings()]

    def now(self) -> dt.datetime:
        with self.admin.connect() as conn:
            return conn.exec_driver_sql("SELECT clock_timestamp()").scalar_one()  # type: ignore[no-any-return]


def _wal_level(admin: Engine) -> str:
    with admin.connect() as conn:
        return str(conn.exec_driver_sql("SHOW wal_level").scalar_one())


@pytest.fixture(scope="module")
def log_db(pg_admin: Engine, templates: Templates) -> Iterator[Log]:
    """A database of the module's own, with the outbox schema, a pgoutput slot and an empty
    publication of the same name; dropped (slot first) after."""
    level = _wal_level(pg_admin)
    if level != "logical":
        pytest.skip(
            f"logical capture needs wal_level = logical; this PostgreSQL has {level} "
            "(scripts/ensure-services.sh sets it)"
        )
    name = f"lg_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    admin = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1)
    engine = make_app_engine(url)
    try:
        templates.migrate(engine)
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE PUBLICATION {name}")
            conn.exec_driver_sql(f"SELECT pg_create_logical_replication_slot('{name}', 'pgoutput')")
        yield Log(url, engine, admin, name)
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                f"WHERE slot_name = '{name}'"
            )
        admin.dispose()
        with pg_admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def log(log_db: Log) -> Iterator[Log]:
    """`log_db` empty (no row, nothing unread in the slot), with logical capture on for the test."""
    log_db.emitted()
    with log_db.admin.connect() as conn:
        conn.exec_driver_sql("TRUNCATE outbox_message")
    outbox.configure(capture="logical", capture_slot=log_db.slot)
    yield log_db
    config.reset()


def statements(engine: Engine) -> list[str]:
    """The SQL `engine` runs from now on (the list grows as it runs)."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    return seen


# ------------------------------------------------------------------------ one message, no row


@pytest.mark.parametrize("form", ["session", "connection"])
def test_enqueue_emits_one_message_with_every_field_and_writes_no_row(log: Log, form: str) -> None:
    sent = statements(log.engine)
    tracer = TracerProvider().get_tracer("test")
    args: dict[str, Any] = {
        "exchange": "orders",
        "routing_key": "order.créée",
        "payload": {"id": 17, "note": "naïve ☃"},
        "key": "order-17",
        "headers": {"tenant": "acme", "n": 3, "ratio": 0.5, "ok": True},
        "priority": -3,
        "max_attempts": 5,
        "content_type": "application/vnd.shop+json",
    }
    before = log.now()
    with tracer.start_as_current_span("handler") as span:
        if form == "session":
            with Session(log.engine) as session, session.begin():
                message_id = outbox.enqueue(session, **args)
        else:
            with log.engine.begin() as conn:
                message_id = outbox.enqueue(conn, **args)
    after = log.now()
    [got] = log.emitted()
    assert uuid.UUID(got.id) == message_id
    assert message_id.version == 7
    assert (got.exchange, got.routing_key, got.key) == ("orders", "order.créée", "order-17")
    assert json.loads(got.payload) == {"id": 17, "note": "naïve ☃"}
    assert got.content_type == "application/vnd.shop+json"
    assert got.headers == {"tenant": "acme", "n": 3, "ratio": 0.5, "ok": True}
    assert (got.priority, got.max_attempts, got.delay, got.has_row) == (-3, 5, None, False)
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert got.traceparent is not None
    assert trace_id in got.traceparent
    assert got.tracestate is None
    assert before <= got.created_at <= after
    assert got.available_at == got.created_at
    assert log.rows() == []
    assert not any("pg_notify" in s or "outbox_message" in s for s in sent)


def test_a_message_without_options_leaves_them_absent(log: Log) -> None:
    with log.engine.begin() as conn:
        outbox.enqueue(conn, **ARGS)
    [got] = log.emitted()
    assert (got.key, got.headers, got.traceparent, got.tracestate) == (None, None, None, None)
    assert (got.priority, got.max_attempts) == (0, None)
    assert (got.payload, got.content_type) == (b'{"n":1}', "application/json")


def test_a_rolled_back_transaction_emits_nothing(log: Log) -> None:
    with log.engine.connect() as conn:
        with conn.begin() as transaction:
            outbox.enqueue(conn, **ARGS)
            transaction.rollback()
        with conn.begin():
            kept = outbox.enqueue(conn, **ARGS)
            with conn.begin_nested() as savepoint:
                outbox.enqueue(conn, **{**ARGS, "routing_key": "dropped"})
                savepoint.rollback()
    assert [uuid.UUID(m.id) for m in log.emitted()] == [kept]
    assert log.rows() == []


def test_an_invalid_call_writes_nothing_and_the_transaction_goes_on(log: Log) -> None:
    with log.engine.begin() as conn:
        with pytest.raises(outbox.InvalidHeader):
            outbox.enqueue(conn, **ARGS, headers={"h": None})  # type: ignore[dict-item]
        kept = outbox.enqueue(conn, **ARGS)
    assert [uuid.UUID(m.id) for m in log.emitted()] == [kept]


# ------------------------------------------------------------------------ messages with a row


def test_an_idempotency_key_gets_a_held_row_and_one_message(log: Log) -> None:
    with log.engine.begin() as conn:
        first = outbox.enqueue(conn, **ARGS, idempotency_key="order-17")
        again = outbox.enqueue(conn, **{**ARGS, "payload": {"n": 2}}, idempotency_key="order-17")
    with log.engine.begin() as conn:
        later = outbox.enqueue(conn, **ARGS, idempotency_key="order-17")
    assert first == again == later
    [got] = log.emitted()
    assert (uuid.UUID(got.id), got.has_row, got.delay) == (first, True, None)
    [row] = log.rows()
    assert (row["id"], row["idempotency_key"]) == (first, "order-17")
    assert (row["available_at"], row["state"], row["held"]) == (True, "pending", False)
    assert row["created_at"] == got.created_at  # one statement: one statement_timestamp()
    assert log.emitted() == []  # the second transaction committed, and emitted nothing


def test_a_delay_gets_a_held_row_and_a_message_with_its_delay(log: Log) -> None:
    with log.engine.begin() as conn:
        message_id = outbox.enqueue(conn, **ARGS, delay=dt.timedelta(seconds=90, microseconds=5))
    [got] = log.emitted()
    assert (uuid.UUID(got.id), got.has_row) == (message_id, True)
    assert got.delay == dt.timedelta(seconds=90, microseconds=5)
    assert got.available_at == got.created_at + got.delay
    [row] = log.rows()
    assert (row["id"], row["available_at"], row["created_at"]) == (
        message_id,
        True,
        got.created_at,
    )


def test_the_held_row_is_the_tables_row_but_for_its_time(log: Log) -> None:
    args = {**ARGS, "key": "k", "headers": {"h": 1}, "priority": 2, "max_attempts": 3}
    with log.engine.begin() as conn:
        outbox.enqueue(conn, **args, idempotency_key="logical")
    outbox.configure(capture="table")
    with log.engine.begin() as conn:
        outbox.enqueue(conn, **args, idempotency_key="table")
    held, plain = log.rows()
    differ = {"id", "idempotency_key", "available_at", "created_at"}
    assert {k: v for k, v in held.items() if k not in differ} == {
        k: v for k, v in plain.items() if k not in differ
    }
    assert held["available_at"] is True
    assert plain["available_at"] is False


def test_a_key_taken_after_a_repeatable_read_snapshot_raises_idempotency_conflict(
    log: Log,
) -> None:
    with log.engine.connect() as late:
        late.execution_options(isolation_level="REPEATABLE READ")
        with late.begin():
            late.exec_driver_sql("SELECT 1")  # the snapshot is taken
            with log.engine.begin() as early:
                outbox.enqueue(early, **ARGS, idempotency_key="raced")
            with pytest.raises(outbox.IdempotencyConflict, match="retry the transaction"):
                outbox.enqueue(late, **ARGS, idempotency_key="raced")
    assert len(log.emitted()) == 1


# ------------------------------------------------------------------------ enqueue_many


def test_enqueue_many_keeps_the_lists_order_in_the_log(log: Log) -> None:
    items: list[dict[str, Any]] = [
        {**ARGS, "routing_key": f"r{n}", "key": str(n % 7)} for n in range(2500)
    ]
    items[700] = {**items[700], "idempotency_key": "seven-hundred"}
    items[1800] = {**items[1800], "delay": 30}
    items[2000] = {**items[2000], "idempotency_key": "seven-hundred"}  # taken by item 700
    sent = statements(log.engine)
    with log.engine.begin() as conn:
        ids = outbox.enqueue_many(conn, items)
    assert ids[2000] == ids[700]
    got = log.emitted()
    assert [uuid.UUID(m.id) for m in got] == ids[:2000] + ids[2001:]
    assert [m.routing_key for m in got] == [
        i["routing_key"] for n, i in enumerate(items) if n != 2000
    ]
    assert [n for n, m in enumerate(got) if m.has_row] == [700, 1800]
    assert got[1800].delay == dt.timedelta(seconds=30)
    assert [row["id"] for row in log.rows()] == [ids[700], ids[1800]]
    emits = [s for s in sent if "pg_logical_emit_message" in s]
    # Runs of 700, 1099, 199 and 499 in chunks of at most 1,000, and one statement per held row
    # (the taken key's included, which emits nothing).
    assert len(emits) == (1 + 2 + 1 + 1) + 3


def test_enqueue_many_of_nothing_runs_no_sql(log: Log) -> None:
    sent = statements(log.engine)
    with log.engine.begin() as conn:
        assert outbox.enqueue_many(conn, []) == []
    assert sent == []


# ------------------------------------------------------------------------ the slot


def test_without_the_slot_nothing_is_written_and_capture_not_set_up_is_raised(log: Log) -> None:
    outbox.configure(capture_slot=f"absent_{uuid.uuid4().hex[:8]}")
    with log.engine.begin() as conn:
        with pytest.raises(outbox.CaptureNotSetUp, match="no replication slot 'absent_"):
            outbox.enqueue(conn, **ARGS)
        with pytest.raises(outbox.CaptureNotSetUp):
            outbox.enqueue(conn, **ARGS, idempotency_key="held")
        with pytest.raises(outbox.CaptureNotSetUp):
            outbox.enqueue_many(conn, [ARGS, ARGS])
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1  # the transaction goes on
    assert log.emitted() == []
    assert log.rows() == []


def test_the_slot_is_asked_for_once_per_process_and_database(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_emit, "_ready", set())
    monkeypatch.setattr(pg_emit, "_databases", weakref.WeakKeyDictionary())
    sent = statements(log.engine)
    for _ in range(3):  # a connection of its own each time (the pool's first one is disposed)
        log.engine.dispose()
        with log.engine.begin() as conn:
            outbox.enqueue(conn, **ARGS)
    assert sum("pg_replication_slots" in s for s in sent) == 1
    assert len(log.emitted()) == 3


# ------------------------------------------------------------------------ every path


# Each enqueues `args` and a list of it (and, on an AsyncSession's engine, `args` again on an
# AsyncConnection), in one transaction; returns the first id.
Path = Callable[["Log", dict[str, Any]], uuid.UUID]


def _libpq_url(log: Log) -> str:
    return log.url.replace("postgresql+psycopg", "postgresql")


def _plain_psycopg(log: Log, args: dict[str, Any]) -> uuid.UUID:
    with psycopg.connect(_libpq_url(log)) as conn:
        message_id = outbox.enqueue(conn, **args)
        outbox.enqueue_many(conn, [args])
        conn.commit()
    return message_id


def _plain_psycopg2(log: Log, args: dict[str, Any]) -> uuid.UUID:
    conn = psycopg2.connect(_libpq_url(log))
    try:
        message_id = outbox.enqueue(conn, **args)
        outbox.enqueue_many(conn, [args])
        conn.commit()
    finally:
        conn.close()
    return message_id


def _psycopg2_engine(log: Log, args: dict[str, Any]) -> uuid.UUID:
    engine = create_engine(log.url.replace("postgresql+psycopg", "postgresql+psycopg2"))
    try:
        with Session(engine) as session, session.begin():
            message_id = outbox.enqueue(session, **args)
            outbox.enqueue_many(session, [args])
    finally:
        engine.dispose()
    return message_id


def _async_session(driver: str) -> Path:
    def run(log: Log, args: dict[str, Any]) -> uuid.UUID:
        async def main() -> uuid.UUID:
            engine = create_async_engine(log.url.replace("+psycopg", f"+{driver}"))
            try:
                async with AsyncSession(engine) as session, session.begin():
                    message_id = await outbox.enqueue_async(session, **args)
                    await outbox.enqueue_many_async(session, [args])
                    connection = await session.connection()
                    await outbox.enqueue_async(connection, **args)
                return message_id
            finally:
                await engine.dispose()

        return asyncio.run(main())

    return run


def _plain_asyncpg(log: Log, args: dict[str, Any]) -> uuid.UUID:
    async def main() -> uuid.UUID:
        conn = await asyncpg.connect(_libpq_url(log))
        try:
            async with conn.transaction():
                message_id = await outbox.enqueue_async(conn, **args)
                await outbox.enqueue_many_async(conn, [args])
            return message_id
        finally:
            await conn.close()

    return asyncio.run(main())


def _plain_psycopg_async(log: Log, args: dict[str, Any]) -> uuid.UUID:
    async def main() -> uuid.UUID:
        async with await psycopg.AsyncConnection.connect(_libpq_url(log)) as conn:
            message_id = await outbox.enqueue_async(conn, **args)
            await outbox.enqueue_many_async(conn, [args])
            await conn.commit()
        return message_id

    return asyncio.run(main())


PATHS: dict[str, Path] = {
    "psycopg": _plain_psycopg,
    "psycopg2": _plain_psycopg2,
    "psycopg2-engine": _psycopg2_engine,
    "asyncpg-session": _async_session("asyncpg"),
    "psycopg-async-session": _async_session("psycopg"),
    "asyncpg": _plain_asyncpg,
    "psycopg-async": _plain_psycopg_async,
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_enqueue_path_emits_its_messages_and_writes_no_row(log: Log, path: str) -> None:
    message_id = PATHS[path](log, ARGS)
    got = log.emitted()
    assert uuid.UUID(got[0].id) == message_id
    assert len(got) == (3 if "session" in path else 2)
    assert {m.routing_key for m in got} == {"order.created"}
    assert not any(m.has_row for m in got)
    assert log.rows() == []


@pytest.mark.parametrize("path", list(PATHS))
def test_every_enqueue_path_gives_a_delayed_message_its_held_row(log: Log, path: str) -> None:
    PATHS[path](log, {**ARGS, "delay": 5})
    got = log.emitted()
    assert all(m.has_row and m.delay == dt.timedelta(seconds=5) for m in got)
    rows = log.rows()
    assert [row["id"] for row in rows] == [uuid.UUID(m.id) for m in got]
    assert [row["created_at"] for row in rows] == [m.created_at for m in got]
    assert {row["available_at"] for row in rows} == {True}


def test_a_connection_with_a_schema_translate_map_goes_through_core(log: Log) -> None:
    """Driver SQL would not translate the table's name: such a connection takes Core's path,
    with the same result."""
    sent = statements(log.engine)
    with log.engine.connect() as plain:
        conn = plain.execution_options(schema_translate_map={None: None})
        with conn.begin():
            first = outbox.enqueue(conn, **ARGS)
            held = outbox.enqueue(conn, **ARGS, idempotency_key="core", delay=1)
            assert outbox.enqueue(conn, **ARGS, idempotency_key="core") == held
            many = outbox.enqueue_many(conn, [ARGS, ARGS])
    got = log.emitted()
    assert [uuid.UUID(m.id) for m in got] == [first, held, *many]
    assert [m.has_row for m in got] == [False, True, False, False]
    assert [row["id"] for row in log.rows()] == [held]
    assert any("WITH held AS" in s for s in sent)


# ------------------------------------------------------------------------ the testing helpers


def test_the_testing_helpers_refuse_to_read_the_table(log: Log) -> None:
    with Session(log.engine) as session, session.begin():
        outbox.enqueue(session, **ARGS)
        for helper in (testing.enqueued, testing.assert_enqueued, testing.assert_not_enqueued):
            with pytest.raises(outbox.OutboxError, match=r"capture='table'"):
                helper(session)

    async def main() -> None:
        engine = create_async_engine(log.url.replace("+psycopg", "+asyncpg"))
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(outbox.OutboxError, match="logical capture"):
                    await testing.assert_enqueued_async(session)
        finally:
            await engine.dispose()

    asyncio.run(main())
    outbox.configure(capture="table")
    with log.engine.begin() as conn:
        outbox.enqueue(conn, **ARGS)
        testing.assert_enqueued(conn, count=1)


# ------------------------------------------------------------------------ the other databases


@pytest.mark.parametrize("url_fixture", ["sqlite_url", "mysql_url"])
def test_other_databases_write_rows_in_logical_mode(
    request: pytest.FixtureRequest, templates: Templates, url_fixture: str
) -> None:
    engine = make_app_engine(str(request.getfixturevalue(url_fixture)))
    templates.migrate(engine)
    outbox.configure(capture="logical", capture_slot="no_such_slot")
    try:
        with Session(engine) as session, session.begin():
            first = outbox.enqueue(session, **ARGS, idempotency_key="k")
            assert outbox.enqueue(session, **ARGS, idempotency_key="k") == first
            outbox.enqueue(session, **ARGS, delay=60)
            outbox.enqueue_many(session, [ARGS, ARGS])
            testing.assert_enqueued(session, count=4)
        assert row_count(engine, state="pending") == 4
    finally:
        config.reset()
        engine.dispose()


# ------------------------------------------------------------------------ Django

_DJANGO = """
import json, sys
import django
from django.conf import settings

settings.configure(
    DATABASES={"default": json.loads(sys.argv[1])},
    INSTALLED_APPS=["outbox.django"],
    USE_TZ=True,
)
django.setup()
from django.db import transaction
import outbox, outbox.django

args = {"exchange": "orders", "routing_key": "order.created", "payload": {"n": 1}}
with transaction.atomic():
    first = outbox.django.enqueue(**args, key="k")
    try:
        with transaction.atomic():
            outbox.django.enqueue(**{**args, "routing_key": "dropped"})
            raise RuntimeError("roll the savepoint back")
    except RuntimeError:
        pass
    many = outbox.django.enqueue_many([args, {**args, "idempotency_key": "once"}])
try:
    outbox.django.assert_enqueued()
except outbox.OutboxError as exc:
    refused = str(exc)
print(json.dumps({"ids": [str(first), *map(str, many)], "refused": refused}))
"""


def test_django_enqueue_emits_in_its_atomic_block(log: Log) -> None:
    u = make_url(log.url)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": u.database,
        "USER": u.username,
        "HOST": u.host,
        "PORT": u.port,
    }
    env = {**os.environ, "OUTBOX_CAPTURE": "logical", "OUTBOX_CAPTURE_SLOT": log.slot}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_DJANGO), json.dumps(database)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    got = log.emitted()
    assert [m.id for m in got] == report["ids"]
    assert [m.has_row for m in got] == [False, False, True]
    assert [row["idempotency_key"] for row in log.rows()] == ["once"]
    assert "table mode" in report["refused"]


def test_an_enqueue_on_a_connection_outside_this_module_checks_its_own_database(
    log: Log, pg_url: str
) -> None:
    """The slot found in one database says nothing of another (the shared test database)."""
    engine = make_app_engine(pg_url)
    try:
        with engine.begin() as conn, pytest.raises(outbox.CaptureNotSetUp):
            outbox.enqueue(conn, **ARGS)
    finally:
        engine.dispose()


def test_a_connection_reports_its_database(log: Log) -> None:
    with log.engine.connect() as conn:
        where = pg_emit._database(conn)
    u = make_url(log.url)
    assert where == (u.host, u.port, u.database)
