"""Behind PgBouncer in transaction pooling mode, with no extra flag: two relays and an application
deliver everything, the CLI works, the relay leaves nothing of its own on the server connections
others borrow, finds out that LISTEN is not carried and polls, and the application engines that
docs/guides/pgbouncer.md shows work.

One real PgBouncer (tests/pgbouncer.py) serves the module, with small pools so that clients
really share server connections. Each test gets a database of its own behind it: the per-test
schema of `pg_url` is chosen by a startup parameter (`options`) that PgBouncer ignores.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

import outbox
from relay.cli.main import main
from relay.errors import ConfigError, DatabaseUnavailable
from relay.runtime.urls import parse_db_url
from relay.runtime.wakeup import Listener, listener_for
from relay.store.databases import driver_arguments
from relay.store.engines import make_engine
from relay.store.sql_store import SqlStore, open_store
from tests.docs_blocks import block
from tests.pgbouncer import Databases, PgBouncer, running
from tests.support.broker import AMQP_URL, Broker
from tests.support.cli import environment
from tests.support.db import PG_ADMIN_URL, pg_schema
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# What psycopg's automatic prepared statements meet behind a transaction pooler, by SQLSTATE: a
# name another client prepared on that server connection (duplicate_prepared_statement), a
# statement prepared on another server connection (invalid_sql_statement_name), or a name that
# another client used for another statement ("bind message supplies 1 parameters, but prepared
# statement ... requires 13": protocol_violation).
PREPARED_STATEMENT_ERRORS = {"42P05", "26000", "08P01"}


def sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a driver error, through SQLAlchemy's and the relay's wrappers."""
    while exc is not None:
        code = getattr(getattr(exc, "orig", None), "sqlstate", None)
        if code is not None:
            return str(code)
        exc = exc.__cause__
    return None


@pytest.fixture(scope="module")
def bouncer(pg_admin: Engine) -> Iterator[PgBouncer]:
    with running(PG_ADMIN_URL) as started:
        yield started


@dataclass(frozen=True)
class Pooled:
    """A database of the test's own: `url` through PgBouncer, `direct` to PostgreSQL itself."""

    name: str
    url: str
    direct: str

    def on(self, driver: str) -> str:
        """`url` with another driver (psycopg2, asyncpg)."""
        return make_url(self.url).set(drivername=f"postgresql+{driver}").render_as_string(False)


@pytest.fixture
def pooled(pg_admin: Engine, bouncer: PgBouncer) -> Iterator[Pooled]:
    databases = Databases(pg_admin)
    try:
        name = databases.create()
        yield Pooled(name, bouncer.url(name), databases.direct_url(name))
    finally:
        databases.drop_all()


@pytest.fixture
def migrated(pooled: Pooled) -> Pooled:
    """`pooled` with the outbox schema (made directly: its own tests go through PgBouncer)."""
    engine = create_engine(pooled.direct)
    try:
        outbox.create_schema(engine)
    finally:
        engine.dispose()
    return pooled


def server_settings(url: str, pool_size: int, *names: str) -> list[tuple[str, ...]]:
    """`names`' values on every server connection PgBouncer has for `url`'s database: as many
    clients as its pool holds, each in a transaction, pin every one of them at once."""
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)
    conns = [psycopg.connect(conninfo, prepare_threshold=None) for _ in range(pool_size)]
    try:
        found = []
        for conn in conns:
            values = [conn.execute(f"SHOW {name}").fetchone() for name in names]
            found.append(tuple(str(v[0]) if v else "?" for v in values))
        return found
    finally:
        for conn in conns:
            conn.rollback()
            conn.close()


def _enqueue_one(conn: Connection, n: int, exchange: str = "orders") -> None:
    outbox.enqueue(conn, exchange=exchange, routing_key="order.created", payload={"n": n})


def _run_threads(count: int, target: Callable[[int], object]) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


# --------------------------------------------------------------------------- prepare_threshold


@pytest.mark.parametrize(
    ("given", "expected"), [("None", None), ("none", None), ("0", 0), ("5", 5)]
)
def test_prepare_threshold_in_a_url_is_a_number_or_none_not_text(
    given: str, expected: int | None
) -> None:
    url = make_url(f"postgresql+psycopg://u@h/db?prepare_threshold={given}&options=-cx%3D1")
    rest, args = driver_arguments(url)
    assert args == {"prepare_threshold": expected}
    assert "prepare_threshold" not in rest.query
    assert rest.query["options"] == "-cx=1"  # the rest of the query is kept


@pytest.mark.parametrize("given", ["abc", "-1", "1.5", "null", "None&prepare_threshold=2"])
def test_a_bad_prepare_threshold_names_itself(given: str) -> None:
    with pytest.raises(ConfigError, match=r"--db: prepare_threshold must be None .* not "):
        parse_db_url(f"postgresql+psycopg://u@h/db?prepare_threshold={given}")


def test_a_bad_prepare_threshold_exits_2_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OUTBOX_DB_URL", "postgresql+psycopg://u@127.0.0.1/db?prepare_threshold=x")
    assert main(["status"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert "OUTBOX_DB_URL" in line
    assert "prepare_threshold must be None" in line


def test_relay_engines_prepare_only_on_a_direct_connection_of_the_loop_or_as_the_url_says(
    pg_url: str, pg_engine: Engine
) -> None:
    for query, expected in (
        ("", None),
        ("&prepare_threshold=None", None),
        ("&prepare_threshold=3", 3),
    ):
        engine = make_engine(pg_url + query)
        try:
            with engine.connect() as conn:
                dbapi = conn.connection.driver_connection
                assert isinstance(dbapi, psycopg.Connection)
                assert dbapi.prepare_threshold == expected
                # The URL's other parameters still reach the driver (the test's schema).
                assert conn.exec_driver_sql("SHOW search_path").scalar() == pg_schema(pg_url)
        finally:
            engine.dispose()
    # The relay loop's own engine prepares on a direct connection (a claim is planned once),
    # unless the URL says otherwise.
    for query, expected in (
        ("", 2),
        ("&prepare_threshold=None", None),
        ("&prepare_threshold=3", 3),
    ):
        engine = make_engine(pg_url + query, relaxed_commit=True)
        try:
            with engine.connect() as conn:
                dbapi = conn.connection.driver_connection
                assert isinstance(dbapi, psycopg.Connection)
                assert dbapi.prepare_threshold == expected
                assert conn.exec_driver_sql("SHOW jit").scalar() == "off"
        finally:
            engine.dispose()
    # The wake-up listener builds a libpq conninfo from the URL, where the parameter would be
    # refused: it still listens, and a commit wakes it.
    woke = threading.Event()
    listener = listener_for(pg_url + "&prepare_threshold=none", woke.set)
    assert isinstance(listener, Listener)
    listener.start()
    try:
        wait_until(lambda: listener.carried, what="the listener to listen")

        def enqueue() -> bool:
            with pg_engine.begin() as conn:
                _enqueue_one(conn, 1)
            return woke.wait(0.2)

        wait_until(enqueue, what="a wake-up")
        assert listener.failures == 0
    finally:
        listener.stop()


# --------------------------------------------------------------------------- the relay's store


def test_prepared_statements_fail_through_pgbouncer_and_the_relay_makes_none(
    migrated: Pooled,
) -> None:
    # Control: with psycopg preparing every statement at once, two relays' stores sharing the
    # pool's server connections collide on the statement names psycopg gives (_pg3_0, ...).
    stores: list[SqlStore] = []

    def alternate() -> None:
        # Opening the second store may fail already (SQLAlchemy's first queries are prepared).
        stores.extend(open_store(migrated.url + "?prepare_threshold=0") for _ in range(2))
        for _ in range(20):
            for store in stores:
                store.has_ready("nothing")
                store.counts()

    try:
        with pytest.raises((DBAPIError, DatabaseUnavailable)) as caught:
            alternate()
        assert sqlstate(caught.value) in PREPARED_STATEMENT_ERRORS
    finally:
        for store in stores:
            store.close()

    # The relay's own, opened as the runner opens the loop's (which prepares statements on a
    # direct connection): the same from three stores on three threads each, without an error.
    stores = [open_store(migrated.url, relaxed_commit=True) for _ in range(3)]
    try:
        with stores[0].engine.connect() as conn:  # a pooled connection: nothing prepared
            assert conn.connection.driver_connection.prepare_threshold is None  # type: ignore[union-attr]

        def work(i: int) -> None:
            store = stores[i % len(stores)]
            for _ in range(30):
                store.has_ready("nothing")
                store.counts()
                store.heartbeat(f"relay-{i}")
                assert store.claim(owner="x", token=uuid.uuid4(), limit=5, lease_seconds=30) == []

        assert _run_threads(9, work) == []
    finally:
        for store in stores:
            store.close()


def test_the_relay_leaves_no_session_setting_on_server_connections_others_borrow(
    migrated: Pooled, bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    # The check sees a session setting left behind: a client's SET outlives its transaction.
    conninfo = make_url(migrated.url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '7s'")
    assert ("7s",) in server_settings(migrated.url, bouncer.pool_size, "lock_timeout")

    with caplog.at_level(logging.INFO, logger="relay.store"):
        store = open_store(migrated.url)  # asks for statement timeouts of 30 s and 10 s
        try:

            def work(i: int) -> None:
                for _ in range(20):
                    store.counts()
                    store.heartbeat(f"relay-{i}")

            assert _run_threads(3, work) == []
        finally:
            store.close()
    settings = server_settings(migrated.url, bouncer.pool_size, "statement_timeout")
    assert settings == [("0",)] * bouncer.pool_size
    said = [r for r in caplog.records if r.getMessage() == "database.pooled"]
    assert len(said) == 1  # once, for all its connections and both of its engines
    assert said[0].levelno == logging.WARNING
    assert getattr(said[0], "statement_timeout", None) == "0"
    assert "ALTER ROLE" in str(getattr(said[0], "hint", ""))


def test_a_statement_timeout_the_server_sets_applies_behind_pgbouncer(
    pooled: Pooled, pg_admin: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # What the docs advise (per role); per database here, the same mechanism: PostgreSQL
    # applies it to every server connection PgBouncer opens, and only to that role's (database's).
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE \"{pooled.name}\" SET statement_timeout = '25s'")
    engine = create_engine(pooled.direct)
    try:
        outbox.create_schema(engine)
    finally:
        engine.dispose()
    with caplog.at_level(logging.INFO, logger="relay.store"):
        store = open_store(pooled.url)
        try:
            with store.engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "25s"
        finally:
            store.close()
    said = [r for r in caplog.records if r.getMessage() == "database.pooled"]
    assert [(r.levelno, getattr(r, "statement_timeout", None)) for r in said] == [
        (logging.INFO, "25s")
    ]


# --------------------------------------------------------------------------- LISTEN


def test_listen_through_transaction_pooling_is_found_missing_and_said_once(
    migrated: Pooled, caplog: pytest.LogCaptureFixture
) -> None:
    woke = threading.Event()
    with caplog.at_level(logging.INFO, logger="relay.wakeup"):
        listener = listener_for(migrated.url, woke.set)
        assert isinstance(listener, Listener)
        listener.start()
        try:
            # It gives up by itself (no retry loop): the thread ends.
            wait_until(lambda: not listener.alive, timeout=20, what="the listener to give up")
        finally:
            listener.stop()
    assert listener.carried is False
    assert not woke.is_set()
    events = [r.getMessage() for r in caplog.records]
    assert events == ["listen.unavailable"]
    assert getattr(caplog.records[0], "fallback", None) == "polling"


def test_listen_through_session_pooling_is_carried(
    migrated: Pooled, caplog: pytest.LogCaptureFixture
) -> None:
    # The probe tells the two modes apart: a pooler that keeps a client's server connection
    # (session mode) carries LISTEN, and the listener stays.
    with running(PG_ADMIN_URL, pool_mode="session") as session_mode:
        url = session_mode.url(migrated.name)
        woke = threading.Event()
        with caplog.at_level(logging.INFO, logger="relay.wakeup"):
            listener = listener_for(url, woke.set)
            assert isinstance(listener, Listener)
            listener.start()
            try:
                wait_until(lambda: listener.carried, timeout=20, what="the probe")
                woke.clear()  # the probe's own notification
                engine = create_engine(url, connect_args={"prepare_threshold": None})
                try:

                    def enqueue() -> bool:
                        with engine.begin() as conn:
                            _enqueue_one(conn, 1)
                        return woke.wait(0.2)

                    wait_until(enqueue, what="a wake-up through session pooling")
                finally:
                    engine.dispose()
                assert listener.alive
            finally:
                listener.stop()
    assert "listen.unavailable" not in [r.getMessage() for r in caplog.records]


# --------------------------------------------------------------------------- the whole path


def _relay(db_url: str, relay_id: str, log: Path) -> subprocess.Popen[str]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "relay", "--db", db_url, "--amqp", AMQP_URL, "run",
             "--relay-id", relay_id],
            env=environment(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip


def _command(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run `outbox-relay ARGS` in this process (the console script's `main`); its stdout."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_two_relays_and_an_application_through_pgbouncer_deliver_everything_in_order(
    pooled: Pooled, broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two migrations at once, through the pooler: the advisory lock is a transaction's.
    assert _run_threads(2, lambda _: _command(capsys, "--db", pooled.url, "migrate")) == []

    logs = [tmp_path / f"relay-{i}.log" for i in range(2)]
    relays = [_relay(pooled.url, f"pgb-{i}", log) for i, log in enumerate(logs)]
    try:
        wait_until(
            lambda: (
                all("relay.started" in log.read_text() for log in logs)
                or any(r.poll() is not None for r in relays)
            ),
            timeout=60,
            what="both relays to start",
        )
        assert all(r.poll() is None for r in relays), [log.read_text() for log in logs]

        # The application, as the docs configure its engine: two writers, each owning its
        # keys (so enqueue order per key is the writer's order), 1-3 messages per transaction,
        # every seventh transaction rolled back, until both relays have run a while.
        engine = create_engine(pooled.url, connect_args={"prepare_threshold": None})
        committed: dict[str, str] = {}  # message id -> key
        rolled_back: set[str] = set()
        lock = threading.Lock()
        stop = threading.Event()
        failures: list[BaseException] = []

        def write(writer: int) -> None:
            try:
                write_until_stopped(writer)
            except BaseException as exc:
                failures.append(exc)

        def write_until_stopped(writer: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                key = f"w{writer}-k{n % 8}"
                ids = []
                with engine.connect() as conn, conn.begin() as tx:
                    for i in range(1 + n % 3):
                        payload = {"key": key, "n": n, "i": i}
                        message_id = outbox.enqueue(
                            conn,
                            exchange=broker.exchange,
                            routing_key="r",
                            payload=payload,
                            key=key,
                        )
                        ids.append(str(message_id))
                    if n % 7 == 0:
                        tx.rollback()
                with lock:
                    if n % 7 == 0:
                        rolled_back.update(ids)
                    else:
                        committed.update(dict.fromkeys(ids, key))

        writers = [threading.Thread(target=write, args=(w,)) for w in range(2)]
        for writer in writers:
            writer.start()
        try:
            # A few seconds of traffic: past every statement's fifth run (where psycopg would
            # have started preparing) many times over, past several heartbeats and claims, and
            # past both relays finding that LISTEN is not carried (they poll from then on).
            wait_until(
                lambda: (
                    failures
                    or (
                        len(committed) >= 600
                        and all("listen.unavailable" in log.read_text() for log in logs)
                    )
                ),
                timeout=60,
                what="600 committed messages and both relays polling",
            )
        finally:
            stop.set()
            for writer in writers:
                writer.join(30)
            engine.dispose()
        assert failures == []
        assert len(committed) >= 600

        broker.collect_ids([uuid.UUID(i) for i in committed], timeout=60)
        for relay in relays:
            relay.send_signal(signal.SIGTERM)
        for relay, log in zip(relays, logs, strict=True):
            assert relay.wait(60) == 0, log.read_text()
    finally:
        for relay in relays:
            if relay.poll() is None:
                relay.kill()
                relay.wait()

    received = broker.finish()
    ids = [d.message_id for d in received]
    assert collections.Counter(ids).most_common(1)[0][1] == 1, "a message arrived twice"
    assert set(ids) == set(committed), "lost or unexpected messages"
    assert not set(ids) & rolled_back
    sequence: dict[str, list[int]] = collections.defaultdict(list)
    for delivery in received:
        body = json.loads(delivery.body)
        sequence[body["key"]].append(body["n"] * 10 + body["i"])
    for key, order in sequence.items():
        assert order == sorted(order), f"key {key} out of order: {order}"

    for log in logs:
        lines = log.read_text().splitlines()
        assert not [line for line in lines if " error " in line or "Traceback" in line], lines
        assert sum(" listen.unavailable " in line for line in lines) == 1, lines
        assert sum(" database.pooled " in line for line in lines) == 1, lines

    # The operator's commands, through the same pooler.
    report = json.loads(_command(capsys, "--db", pooled.url, "status", "--json"))
    assert (report["published"], report["pending"], report["in_flight"]) == (len(committed), 0, 0)
    listed = _command(
        capsys, "--db", pooled.url, "messages", "--state", "published", "--limit", "5", "--json"
    )
    rows = json.loads(listed)
    assert len(rows) == 5
    assert {row["id"] for row in rows} <= set(committed)
    shown = json.loads(_command(capsys, "--db", pooled.url, "show", rows[0]["id"], "--json"))
    assert shown["state"] == "published"


# --------------------------------------------------------------------------- the application


def documented_engines(url_for: Callable[[str], str]) -> dict[str, Any]:
    """Run the engines block of docs/guides/pgbouncer.md with its URLs pointed at this test's
    database (each `postgresql+DRIVER://...` literal becomes `url_for(DRIVER)`); return what it
    defines."""
    snippet = block("guides/pgbouncer.md", "pgbouncer-engines")

    def point(match: re.Match[str]) -> str:
        return repr(url_for(match.group(1)))

    code = re.sub(r'"postgresql\+(\w+)://[^"]*"', point, snippet)
    assert code != snippet
    defined: dict[str, Any] = {}
    exec(compile(code, "docs/guides/pgbouncer.md", "exec"), defined)
    return defined


def test_the_documented_application_engines_work_through_pgbouncer(migrated: Pooled) -> None:
    engines = documented_engines(migrated.on)
    engine, async_engine = engines["engine"], engines["async_engine"]
    assert isinstance(engine, Engine)

    def write_with(target: Engine, exchange: str = "orders") -> Callable[[int], None]:
        def write(i: int) -> None:
            for n in range(50):
                with target.begin() as conn:
                    _enqueue_one(conn, i * 1000 + n, exchange)

        return write

    # Control: the same application with psycopg's defaults fails through the pooler.
    plain = create_engine(migrated.url, pool_size=4)
    try:
        errors = _run_threads(4, write_with(plain, exchange="control"))
    finally:
        plain.dispose()
    assert errors
    assert all(sqlstate(e) in PREPARED_STATEMENT_ERRORS for e in errors), errors

    written = 0
    try:  # psycopg 3, as the docs set it: many transactions on four threads, no error
        assert _run_threads(4, write_with(engine)) == []
        written += 200
    finally:
        engine.dispose()

    # psycopg2, with nothing set: it prepares nothing.
    psycopg2_engine = create_engine(migrated.on("psycopg2"), pool_size=4)
    try:
        assert _run_threads(4, write_with(psycopg2_engine)) == []
        written += 200
    finally:
        psycopg2_engine.dispose()

    async def asyncpg_writers() -> None:  # asyncpg, as the docs set it
        async def write(i: int) -> None:
            for n in range(50):
                async with async_engine.begin() as conn:
                    await conn.run_sync(_enqueue_one, i * 1000 + n)

        try:
            await asyncio.gather(*(write(i) for i in range(4)))
        finally:
            await async_engine.dispose()

    asyncio.run(asyncpg_writers())
    written += 200

    check = create_engine(migrated.direct)
    try:
        with check.connect() as conn:
            count = conn.exec_driver_sql(
                "SELECT count(*) FROM outbox_message WHERE exchange = 'orders'"
            ).scalar()
    finally:
        check.dispose()
    assert count == written
