"""The relay's store on MySQL 8.0.4+ and MariaDB 10.6+: which statement of relay/store/sql/mysql.sql
(and common.sql) is which, how a claim reads its candidates and its runs, and the connection. The
SQL, and the reasons for each statement, are in the .sql file.

These servers have SKIP LOCKED but neither UPDATE ... RETURNING nor data-modifying CTEs, and
MySQL cannot UPDATE a table it reads in a subquery of the same statement. So what is one
statement on PostgreSQL is a few here (relay/store/stepwise.py), in one short READ COMMITTED
transaction: a locking read (FOR UPDATE, SKIP LOCKED where relays compete) picks the rows, then
plain UPDATEs by primary key change them. The row locks, held to the COMMIT, are what keep two
relays off the same row. READ COMMITTED, not the server's default REPEATABLE READ: that would lock
the gaps between the index entries a claim reads, and an application's INSERT into such a gap
would wait for the claim, or deadlock with it.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import takewhile
from typing import Annotated, Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from relay.core.suspects import Candidate
from relay.store import common, queries
from relay.store.statements import TIME, Compiled, Query, compile_sql, sql_of
from relay.store.stepwise import Stepwise, StepwiseStatements

SQL = queries.load("common", "mysql")

# The lists bound as expanding parameters, in every statement here.
LISTS = ("seqs", "tokens", "exclude", "states", "lasts", "ids")

# `exchange || '/' || routing_key` is a logical OR here.
RESOURCE_PARTS: Mapping[str, str] = {
    "broker": "''",
    "exchange": "exchange",
    "routing_key": "CONCAT(exchange, '/', routing_key)",
}


@dataclass(frozen=True, slots=True)
class MysqlStatements(StepwiseStatements):
    """MySQL's and MariaDB's own statements, beside the steps' (stepwise.py). The runs'
    followers are built per number of heads (Mysql.followers_of)."""

    # common.sql's update_rows, as MySQL updates from another table.
    transition_rows: Annotated[Compiled, Query("update_rows_join")]
    candidates: Annotated[Compiled, Query("candidates")]
    heads: Annotated[Compiled, Query("heads")]
    trailed: Annotated[Compiled, Query("trailed")]
    lock_followers: Annotated[Compiled, Query("lock_followers")]
    started_at: Annotated[Compiled, Query("started_at", {"started_at": TIME})]


# How many heads' followers one statement reads (mysql.sql, follower_ready).
RUN_HEADS = 100

# ------------------------------------------------------------------------ the connection

# A statement timeout, in milliseconds as text: MariaDB's covers every statement, MySQL's
# (max_execution_time) only SELECTs.
MARIADB_TIMEOUT = "SET SESSION max_statement_time = CAST(%s AS DECIMAL(12, 3)) / 1000"
MYSQL_TIMEOUT = "SET SESSION max_execution_time = CAST(%s AS UNSIGNED)"


def _utc_datetime(value: dt.datetime, mapping: Any = None) -> str:
    """A datetime as the server reads it: UTC. PyMySQL writes a datetime's digits and drops its
    offset, so an aware time from another zone would be stored hours off."""
    import pymysql.converters

    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return str(pymysql.converters.escape_datetime(value, mapping))


@functools.cache
def conversions() -> dict[Any, Any]:
    """PyMySQL's conversions, with that one change. Imported when a MySQL engine is made:
    PyMySQL is an extra (outbox-relay[mysql]), absent for PostgreSQL and SQLite users."""
    import pymysql.converters

    return {**pymysql.converters.conversions, dt.datetime: _utc_datetime}


class Mysql(Stepwise):
    name = "mysql"
    drivers = ("pymysql",)
    # A bare mysql:// would be mysqlclient, which needs a C client library to build.
    bare_url_driver = "pymysql"
    # The row lock comes from FOR UPDATE; START TRANSACTION only keeps it to the COMMIT.
    begin = "START TRANSACTION"
    # See the module's docstring. time_zone: what little the server computes in local time
    # (NOW(), a TIMESTAMP column) is UTC too.
    on_connect = (
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SET SESSION time_zone = '+00:00'",
    )
    statement_timeout = MARIADB_TIMEOUT
    resource_parts = RESOURCE_PARTS

    queries = SQL
    statements = MysqlStatements
    sql: MysqlStatements
    lists = LISTS

    def __init__(self, *, hold: bool = True, scope: str = "exchange") -> None:
        super().__init__(hold=hold, scope=scope)
        # Per head, its rows in the blocking states other than pending (never ready): the
        # followers' second branch, where there are such states.
        states = (s.strip() for s in self.blocking.split(","))
        self._others = ", ".join(s for s in states if s != "'pending'")
        self._followers: dict[int, Compiled] = {}  # by how many heads: built when first needed

    def configuration(self, *, blocking: str, resource: str) -> dict[str, str]:
        # The head check, the trails and a chain's other rows probe each blocking state apart
        # (mysql.sql): the dead-key mode picks the blocks that name its states.
        mode = "hold" if blocking == common.BLOCKING_HOLD else "skip"
        probes = ("key_head", "trails", "other_probes")
        return {"resource": resource, **{name: SQL.text(f"{name}_{mode}") for name in probes}}

    @classmethod
    def connection_options(cls) -> dict[str, Any]:
        return {
            # The server closes a connection idle past its wait_timeout (8 hours by default):
            # a quiet relay's pooled connection is checked before use instead of failing once.
            "pool_pre_ping": True,
            # Engines that open transactions (operator commands) open them READ COMMITTED too;
            # the relay's own (autocommit) get it from on_connect.
            "isolation_level": "READ COMMITTED",
            "connect_args": {"connect_timeout": 5, "conv": conversions(), "charset": "utf8mb4"},
        }

    @classmethod
    def timeout_sql(cls, dbapi_conn: Any) -> str | None:
        version = str(getattr(dbapi_conn, "server_version", ""))
        return MARIADB_TIMEOUT if "mariadb" in version.lower() else MYSQL_TIMEOUT

    def texts(self) -> dict[str, str]:
        # The runs' followers of one head: a claim's statement has such a pair of branches per
        # head, up to RUN_HEADS.
        return {**super().texts(), "followers_of_1": sql_of(self.followers_of(1))}

    def migration_denied(self, engine: Engine, exc: DBAPIError, sqlstate: str) -> str:
        # The server's message names the privilege and the user.
        said = exc.orig.args[-1] if exc.orig is not None and exc.orig.args else exc
        first = str(said).splitlines()[0]
        return (
            f"{first}: migrate needs CREATE, ALTER, INDEX and DROP on the database "
            "(GRANT ... ON db.* TO ...), or run it as the tables' owner"
        )

    def pin_now(self, conn: Connection, params: Mapping[str, Any]) -> dict[str, Any]:
        # Each statement reads the server's clock ({{now}}): no time to agree on beforehand.
        return dict(params)

    def candidates(
        self, conn: Connection, params: Mapping[str, Any]
    ) -> tuple[list[Candidate], list[int]]:
        found = conn.execute(self.sql.candidates, params).all()
        keyed = [seq for seq, key, _, _ in found if key is not None]
        heads = set(conn.execute(self.sql.heads, {"seqs": keyed}).scalars()) if keyed else set()
        ready = [
            Candidate(seq, key, bool(suspect), bool(solitary))
            for seq, key, suspect, solitary in found
            if key is None or seq in heads
        ]
        return ready, [seq for seq in keyed if seq not in heads]

    def runs(
        self, conn: Connection, params: Mapping[str, Any], heads: Sequence[Candidate]
    ) -> list[int]:
        trailed = set(conn.execute(self.sql.trailed, {"seqs": [h.seq for h in heads]}).scalars())
        if not trailed:
            return []
        keyed = [(h.seq, str(h.key)) for h in heads if h.seq in trailed]
        lines = self._lines(conn, params, keyed)
        wanted = _wanted(lines, params["follow"])
        seqs = [seq for line in wanted for seq in line]
        if not seqs:
            return []
        locked = set(conn.execute(self.sql.lock_followers, {**params, "seqs": seqs}).scalars())
        return [seq for line in wanted for seq in takewhile(locked.__contains__, line)]

    def _lines(
        self, conn: Connection, params: Mapping[str, Any], heads: Sequence[tuple[int, str]]
    ) -> list[list[tuple[int, bool]]]:
        """Per head, the next :run rows of its key in a blocking state: (seq, ready), in order.
        Heads whose rows could not be numbered within :follow any more are not read."""
        lines: list[list[tuple[int, bool]]] = [[] for _ in heads]
        read = 0  # rows read so far, all numbered before the next head's
        for start in range(0, len(heads), RUN_HEADS):
            if read >= params["follow"]:
                break
            chunk = heads[start : start + RUN_HEADS]
            binds = dict(params)
            for i, (seq, key) in enumerate(chunk):
                binds[f"key_{i}"], binds[f"seq_{i}"] = key, seq
            for i, seq, ok in conn.execute(self.followers_of(len(chunk)), binds):
                lines[start + i].append((seq, bool(ok)))
            # Each branch is in seq order: merged, the first :run of each head's.
            for line in lines[start : start + RUN_HEADS]:
                line[:] = sorted(line)[: params["run"]]
                read += len(line)
        return lines

    def followers_of(self, heads: int) -> Compiled:
        """mysql.sql's follower branches for `heads` heads (two per head: its ready pending rows,
        and its rows in the other blocking states where the dead-key mode has any), compiled once
        per number of heads. {{i}} is the head's place, a number the statement is built with."""
        found = self._followers.get(heads)
        if found is None:
            branches = []
            for i in range(heads):
                place = {"i": str(i)}
                branches.append(self.queries.expand("follower_ready", place, self.config)[0])
                if self._others:
                    others = {**place, "others": self._others}
                    branches.append(self.queries.expand("follower_blocked", others, {})[0])
            found = compile_sql("\nUNION ALL\n".join(branches), lists=LISTS)
            self._followers[heads] = found
        return found

    def register_relay(self, conn: Connection, params: dict[str, Any]) -> dt.datetime:
        # No RETURNING: the row, then its started_at read back, in one transaction.
        with self.transaction(conn):
            conn.execute(self.sql.register_relay, params)
            started: dt.datetime = conn.execute(self.sql.started_at, params).scalar_one()
        return started


class Mariadb(Mysql):
    """The same statements: SQLAlchemy names a mariadb:// URL's dialect apart."""

    name = "mariadb"


def _wanted(lines: Sequence[Sequence[tuple[int, bool]]], follow: int) -> list[list[int]]:
    """Per head, its run as read: the prefix of its line that is ready, cut where the lines'
    rows, numbered in the heads' claim order, pass :follow (as postgres.sql's claim numbers
    them)."""
    wanted: list[list[int]] = []
    before = 0  # rows of the lines before this one, ready or not
    for line in lines:
        ready = [seq for seq, _ in takewhile(lambda row: row[1], line)]
        wanted.append(ready[: max(0, follow - before)])
        before += len(line)
    return wanted
