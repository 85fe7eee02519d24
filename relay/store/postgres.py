"""The relay's store on PostgreSQL: which statement of relay/store/sql/postgres.sql (and
common.sql) is which, and the few things a statement cannot say. The SQL, and the reasons for
each statement, are in the .sql file.

Each runs as a single statement in autocommit mode: one round trip, and no transaction left open
between a claim and its settlement (the lease, not a lock, protects the row in between). The
exceptions are a resource change (circuits, rate buckets), a read and a write under FOR UPDATE,
and taking leases back, the same on every database (relay/store/rescuer.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Annotated, Any

from sqlalchemy import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from outbox.enqueue import NOTIFY_CHANNEL
from outbox.schema import message
from relay.errors import ConfigError
from relay.ports import Claimed, TableHealth
from relay.store import driven, queries
from relay.store.dialect import Dialect
from relay.store.estimates import TableStats, shares
from relay.store.statements import Compiled, Driven, Query, Statements

SQL = queries.load("common", "postgres")


@dataclass(frozen=True, slots=True)
class PostgresStatements(Statements):
    """PostgreSQL's own statements, beside every dialect's."""

    # The hot path, on the driver's cursor (relay/store/driven.py): rows in Claimed's order.
    claim: Annotated[Driven, Query("claim")]
    claim_run: Annotated[Driven, Query("claim_run")]
    mark_published: Annotated[Driven, Query("mark_published")]
    settle_failures: Annotated[Compiled, Query("settle_failures")]
    purge_batch: Annotated[Compiled, Query("purge_batch")]
    # Around the counting statements (Postgres.reading, table_stats, table_health).
    table_size: Annotated[Compiled, Query("table_size")]
    table_shares: Annotated[Compiled, Query("table_shares")]
    table_health: Annotated[Compiled, Query("table_health")]
    no_parallel: Annotated[str, Query("no_parallel")]
    read_snapshot: Annotated[str, Query("read_snapshot")]
    # Who a migration ran as, and where (Postgres.migration_denied).
    role_and_schema: Annotated[Compiled, Query("role_and_schema")]
    # Logical capture (relay/capture/): the log's messages that take the table's path, the held
    # rows of those published from the log, the keys the table holds.
    admit_logged: Annotated[Compiled, Query("admit_logged")]
    mark_logged: Annotated[Compiled, Query("mark_logged")]
    held_keys: Annotated[Compiled, Query("held_keys")]


# The SQLSTATE of a role with no schema to create tables in: nothing on its search_path exists,
# or it may not use what does.
NO_SCHEMA = "3F000"

# How PostgreSQL spells false in a boolean option (its parse_bool: a word, or a prefix of it).
_FALSE = frozenset({"f", "fa", "fal", "fals", "false", "n", "no", "of", "off", "0"})


def autovacuum_off(server: str, reloptions: Sequence[str] | None) -> str | None:
    """Why autovacuum will not clean a table, or None when it may: the table's own
    `autovacuum_enabled` storage option (named first: it is the table's), or the server's
    `autovacuum` setting."""
    for option in reloptions or ():
        name, _, value = option.partition("=")
        if name.strip().lower() == "autovacuum_enabled" and value.strip().lower() in _FALSE:
            return f"{option} (the table's storage option)"
    if server.strip().lower() in _FALSE:
        return f"autovacuum={server} (the server's setting)"
    return None


# ------------------------------------------------------------------------ wake-ups

# Enqueue sends pg_notify on this channel when its transaction commits (outbox/enqueue.py); an
# idle relay LISTENs and claims at once instead of at its next poll.
LISTEN = f"LISTEN {NOTIFY_CHANNEL}"

# A notification the listener sends itself, from another connection, to learn whether its LISTEN
# is carried (a transaction pooler runs LISTEN on a server connection it then lends to others).
# Any relay listening wakes once; one parameter: a text payload.
NOTIFY_PROBE = f"SELECT pg_notify('{NOTIFY_CHANNEL}', %s)"

# The outbox table this relay serves, as enqueue names it in a notification's payload (its oid,
# resolved by the search_path: outbox/pg_insert.py): another schema's notifications are not its.
NOTIFY_TABLE = f"SELECT to_regclass('{message.fullname}')::oid::text"

# ------------------------------------------------------------------------ poolers

# psycopg's prepare_threshold: how many runs of a statement before psycopg prepares it on the
# server; None never does (what a transaction pooler needs: PgBouncer hands each transaction
# whichever server connection is free, where the statement is not prepared, or is prepared
# under the same name by another client). A URL may set it (Postgres.url_arguments).
PREPARE_THRESHOLD = "prepare_threshold"

BACKEND = SQL.text("backend")


def behind_pooler(dbapi_conn: Any) -> str | None:
    """None for a direct psycopg connection; through a pooler, the server's statement timeout."""
    with dbapi_conn.cursor() as cursor:
        cursor.execute(BACKEND)
        pid, timeout = cursor.fetchone()
    return None if pid == dbapi_conn.info.backend_pid else str(timeout)


class Postgres(Dialect):
    name = "postgresql"
    drivers = ("psycopg",)
    bare_url_driver = "psycopg"
    # The row lock comes from FOR UPDATE in lock_resource; BEGIN only keeps it to the COMMIT.
    begin = "BEGIN"
    listen = LISTEN
    # Set on each new connection, in milliseconds as text (a URL's own `options` stay as given).
    # A cancelled statement (57014) is transient: the loop retries it.
    statement_timeout = "SELECT set_config('statement_timeout', %s, false)"
    # And no JIT: the loop's statements take a millisecond or so, and JIT would compile some of
    # them for tens of milliseconds first whenever the planner overestimates their rows. And no
    # sequential scans where an index serves: every statement of the loop is written as index
    # scans, and statistics taken before a burst (a table all pending, one key) can make the
    # planner read the whole table for each claim instead. Nor bitmap scans: on its generic plan
    # (prepared, below) the claim would read every pending row through a bitmap of the ready index
    # and sort them to keep `limit`, where reading the index in order stops at `limit` rows
    # (tests/integration/test_backlog_plans.py). And times in UTC: psycopg gives a session in UTC
    # the fixed `datetime.UTC` zone, where a server zone such as Etc/UTC (Debian's default) makes
    # every claimed row's times ZoneInfo's, which cost several times as much to read and compare.
    relaxed_commit = (
        "SELECT set_config('synchronous_commit', 'off', false), set_config('jit', 'off', false),"
        " set_config('enable_seqscan', 'off', false),"
        " set_config('enable_bitmapscan', 'off', false), set_config('timezone', 'UTC', false)"
    )
    # Planning the claim costs about as much as running it: prepared once a statement has run
    # twice, where no pooler stands between (the connection's default stays None, which
    # PgBouncer's transaction mode needs).
    prepare_direct = 2

    queries = SQL
    statements = PostgresStatements
    sql: PostgresStatements

    @classmethod
    def connection_options(cls) -> dict[str, Any]:
        return {
            "connect_args": {
                "connect_timeout": 5,
                # A startup parameter, which PgBouncer restores on each server connection it
                # lends the relay (a SET would stay on the server connection, for its next user).
                "application_name": "outbox-relay",
                # No server-side prepared statements: behind a transaction pooler they fail
                # (DuplicatePreparedStatement, InvalidSqlStatementName) and crash the relay.
                # A URL's ?prepare_threshold=N turns them back on (url_arguments).
                "prepare_threshold": None,
            },
        }

    @classmethod
    def url_arguments(cls, url: URL) -> tuple[URL, dict[str, Any]]:
        # SQLAlchemy hands URL query values to the driver as text, and the text "None" makes
        # the first statement fail with a TypeError: prepare_threshold is read here instead.
        if PREPARE_THRESHOLD not in url.query:
            return url, {}
        raw = url.query[PREPARE_THRESHOLD]
        value = raw if isinstance(raw, str) else None  # given twice: refused below
        if value is not None and value.lower() == "none":
            threshold = None
        elif value is not None and value.isascii() and value.isdigit() and len(value) <= 9:
            threshold = int(value)
        else:
            raise ConfigError(
                f"{PREPARE_THRESHOLD} must be None (never prepare statements on the server) or "
                f"a whole number of runs, not {raw!r}"
            )
        rest = url.difference_update_query([PREPARE_THRESHOLD])
        return rest, {PREPARE_THRESHOLD: threshold}

    @classmethod
    def pooled(cls, dbapi_conn: Any) -> str | None:
        return behind_pooler(dbapi_conn)

    def texts(self) -> dict[str, str]:
        return {**super().texts(), "notify_probe": NOTIFY_PROBE, "backend": BACKEND}

    def migration_denied(self, engine: Engine, exc: DBAPIError, sqlstate: str) -> str:
        try:
            with engine.connect() as conn:
                role, schema, database = conn.execute(self.sql.role_and_schema).one()
        except DBAPIError:
            role, schema, database = "this role", None, "this database"
        if sqlstate == NO_SCHEMA or schema is None:
            return (
                f"role {role} has no schema to create the outbox tables in: no schema on its "
                f"search_path exists or grants it USAGE (GRANT USAGE, CREATE ON SCHEMA ... TO "
                f"{role})"
            )
        verb = (exc.statement or "").lstrip().split(" ", 1)[0].upper()
        if verb in ("CREATE", ""):
            return (
                f"role {role} lacks the CREATE privilege on schema {schema} of database "
                f"{database}: run `GRANT CREATE ON SCHEMA {schema} TO {role}`, or migrate as the "
                "schema's owner"
            )
        # ALTER, and anything else a later migration does to an existing table, needs its owner.
        return (
            f"role {role} does not own the outbox tables in schema {schema} ({verb} needs the "
            "owner's privileges): migrate as the role that created them"
        )

    def claim(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        return driven.run(conn, self.sql.claim, params)

    def claim_run(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        return driven.run(conn, self.sql.claim_run, params)

    def claimed(self, rows: Sequence[Sequence[Any]]) -> list[Claimed]:
        # The driver's values are Claimed's already: the id as text (the claim casts it), times
        # with their zone, the suspect column a boolean.
        return list(map(Claimed._make, rows))

    def mark_published(self, conn: Connection, params: dict[str, Any]) -> int:
        ((marked,),) = driven.run(conn, self.sql.mark_published, params)
        return int(marked)

    def settle_failures(
        self, conn: Connection, settlements: Sequence[Mapping[str, Any]], params: dict[str, Any]
    ) -> int:
        def column(name: str) -> list[Any]:
            return [s[name] for s in settlements]

        arrays = {
            "seqs": column("seq"),
            "states": column("state"),
            "available_ats": column("available_at"),
            "unburns": column("unburn"),
            "classes": column("failure_class"),
            "outcomes": column("outcome"),
            "errors": column("error"),
        }
        return conn.execute(self.sql.settle_failures, {**params, **arrays}).rowcount

    def purge_batch(self, conn: Connection, params: dict[str, Any]) -> tuple[int, uuid.UUID | None]:
        count, last = conn.execute(self.sql.purge_batch, params).one()
        return int(count), None if last is None else uuid.UUID(str(last))

    def table_stats(self, conn: Connection) -> TableStats | None:
        found = conn.execute(self.sql.table_size).one_or_none()
        if found is None:
            return None  # no such table: the counting statements say so
        stats = TableStats(
            pages=int(found.pages),
            live_tuples=int(found.live_tuples),
            measured=bool(found.measured),
            reltuples=float(found.reltuples),
            relpages=int(found.relpages),
        )
        if stats.small:
            return stats  # counted exactly: no shares needed
        found_shares = conn.execute(self.sql.table_shares)
        by_column = {row.attname: shares(row.vals, row.freqs) for row in found_shares}
        return replace(
            stats,
            state_shares=by_column.get("state", {}),
            exchange_shares=by_column.get("exchange", {}),
        )

    def table_health(self, conn: Connection) -> list[TableHealth]:
        found = []
        for row in conn.execute(self.sql.table_health):
            why = autovacuum_off(str(row.server), row.reloptions)
            health = TableHealth(row.name, why is None, why, int(row.live), int(row.dead))
            found.append(health)
        return found

    @contextmanager
    def reading(self, conn: Connection) -> Iterator[None]:
        # The statements see one snapshot, and run without parallel workers (no_parallel), in a
        # transaction of their own on the store's autocommit connection, or in the caller's.
        if not conn.connection.dbapi_connection.autocommit:  # type: ignore[union-attr]
            conn.exec_driver_sql(self.sql.no_parallel)
            yield
            return
        conn.exec_driver_sql(self.sql.read_snapshot)
        try:
            conn.exec_driver_sql(self.sql.no_parallel)
            yield
        finally:
            conn.exec_driver_sql("ROLLBACK")  # read only: nothing to keep
