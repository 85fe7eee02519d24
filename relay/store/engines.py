"""Engines for the relay's database: the relay loop's (autocommit, statement timeouts, session
settings per dialect, nothing a pooler would keep), and one per operator command."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import URL, Engine, create_engine, event

from outbox.encoding import load_stored_json
from relay.store.boundary import translated
from relay.store.databases import DIALECTS, database_url, driver_arguments, shown
from relay.store.overlap import connection_class

log = logging.getLogger("relay.store")

# Budgets, in seconds. The loop's statements are single-row or batched index scans that take
# milliseconds: one still running after STATEMENT_TIMEOUT is stuck (a lock, an overloaded server)
# and is better cancelled and retried. A pooled connection not free within POOL_TIMEOUT means
# the same. The probes and gauges get their own, smaller budget (SIDE_*).
STATEMENT_TIMEOUT = 30.0
POOL_TIMEOUT = 10.0
SIDE_STATEMENT_TIMEOUT = 10.0
SIDE_POOL_TIMEOUT = 2.0


def make_engine(
    db_url: str,
    *,
    autocommit: bool = True,
    pool_size: int = 3,
    statement_timeout: float | None = None,
    pool_timeout: float = 30.0,
    relaxed_commit: bool = False,
) -> Engine:
    """An engine configured for the relay (autocommit: every statement is its own transaction).
    `statement_timeout` (seconds; None: none) cancels a statement that runs longer, where the
    database can (PostgreSQL); `pool_timeout` bounds the wait for a pooled connection."""
    url, driver_args = driver_arguments(database_url(db_url))
    dialect = DIALECTS[url.get_backend_name()]
    options = dialect.engine_options(
        pool_size=pool_size, statement_timeout=statement_timeout, pool_timeout=pool_timeout
    )
    if driver_args:
        options["connect_args"] = {**options.get("connect_args", {}), **driver_args}
    if autocommit:
        options["isolation_level"] = "AUTOCOMMIT"
    # A row's undecodable JSON becomes a value the wire refuses, not an error failing the claim.
    engine = create_engine(url, json_deserializer=load_stored_json, **options)
    if relaxed_commit and url.get_driver_name() == "psycopg":
        # The loop's connections let its thread do the broker's IO while it waits for them.
        event.listen(engine, "do_connect", _overlapping)
    if relaxed_commit:  # the loop's engine: one per database the relay works on
        where = shown(url)
        event.listen(engine, "connect", lambda dbapi_conn, _record: _say_server(where, dbapi_conn))
    timeout_sql = dialect.statement_timeout if statement_timeout is not None else None
    relaxed_sql = dialect.relaxed_commit if relaxed_commit else None
    # The loop's statements prepared on the server, on a direct connection only, unless the URL
    # says otherwise (Dialect.prepare_direct).
    prepare = dialect.prepare_direct if relaxed_commit and not driver_args else None
    if dialect.on_connect or timeout_sql or relaxed_sql:
        ms = str(max(1, round((statement_timeout or 0) * 1000)))

        def session_settings(dbapi_conn: Any, _record: Any) -> None:
            server_timeout = dialect.pooled(dbapi_conn)
            if server_timeout is not None:
                # A session setting would stay on the server connection for whichever client
                # the pooler lends it to next, and the relay's next transaction would run on
                # another: none is made (the server's own settings, per role, still apply).
                _say_pooled(url, server_timeout)
                if not dbapi_conn.autocommit:
                    dbapi_conn.rollback()  # an open transaction would pin a server connection
                return
            cursor = dbapi_conn.cursor()
            for statement in dialect.on_connect:
                cursor.execute(statement)
            if timeout_sql:
                cursor.execute(dialect.timeout_sql(dbapi_conn) or timeout_sql, (ms,))
            if relaxed_sql:
                cursor.execute(relaxed_sql)
            if prepare is not None:
                dbapi_conn.prepare_threshold = prepare
            cursor.close()

        event.listen(engine, "connect", session_settings)
    return engine


def _overlapping(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
    return connection_class().connect(*cargs, **cparams)


_said_pooled: set[str] = set()  # databases whose pooler was reported (once per process each)


def _say_pooled(url: URL, server_timeout: str) -> None:
    where = shown(url)
    if where in _said_pooled:
        return
    _said_pooled.add(where)
    fields = {"db": where, "session_settings": "none", "statement_timeout": server_timeout}
    if server_timeout == "0":
        hint = "no statement timeout: set one on the relay's role (ALTER ROLE ... SET)"
        log.warning("database.pooled", extra={**fields, "hint": hint})
    else:
        log.info("database.pooled", extra=fields)


_servers: dict[str, str] = {}  # database URL -> host:port its last new connection reached


def server_of(dbapi_conn: Any) -> str | None:
    """The host:port a driver connection reached, where the driver says (psycopg: the host of a
    multi-host URL that answered), else None. Read from the connection: no round trip."""
    info = getattr(dbapi_conn, "info", None)
    host, port = getattr(info, "host", None), getattr(info, "port", None)
    return None if not host else f"{host}:{port}"


def _say_server(where: str, dbapi_conn: Any) -> None:
    """One line when the relay first reaches its database (DEBUG: a start that fails next says
    so in one line of its own), and a warning each time a new connection reaches another server
    than the last (a multi-host URL after a failover)."""
    server = server_of(dbapi_conn)
    if server is None:
        return
    previous = _servers.get(where)
    if previous == server:
        return
    _servers[where] = server
    if previous is None:
        log.debug("database.connected", extra={"db": where, "host": server})
    else:
        log.warning("database.connected", extra={"db": where, "host": server, "previous": previous})


@contextmanager
def command_engine(db_url: str) -> Iterator[Engine]:
    """An engine for one operator command (its transactions as the command opens them), with
    driver errors translated as the store's are; disposed at the end."""
    engine = make_engine(db_url, autocommit=False, pool_size=1)
    try:
        with translated(engine):
            yield engine
    finally:
        engine.dispose()
