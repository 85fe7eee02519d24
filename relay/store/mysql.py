"""The relay's store on MySQL 8.0+ and MariaDB 10.6+: which statement of relay/store/sql/mysql.sql
(and common.sql) is which, and the transactions that run several of them. The SQL, and the
reasons for each statement, are in the .sql file.

These servers have SKIP LOCKED but neither UPDATE ... RETURNING nor data-modifying CTEs, and
MySQL cannot UPDATE a table it reads in a subquery of the same statement. So what is one
statement on PostgreSQL is a few here, in one short READ COMMITTED transaction: a locking read
(FOR UPDATE, SKIP LOCKED where relays compete) picks the rows, then plain UPDATEs by primary key
change them. The row locks, held to the COMMIT, are what keep two relays off the same row. READ
COMMITTED, not the server's default REPEATABLE READ: that would lock the gaps between the index
entries a claim reads, and an application's INSERT into such a gap would wait for the claim, or
deadlock with it.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import takewhile
from typing import Annotated, Any

from sqlalchemy import BigInteger, Connection, Engine, Integer
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import TypeEngine

from outbox.dberrors import DbFailure, classify_db_error, sqlstate_of
from outbox.schema import UUID
from relay.core import suspects
from relay.store import common, queries
from relay.store.dialect import Dialect
from relay.store.statements import (
    CLAIMED_COLUMNS,
    TIME,
    Compiled,
    Query,
    Statements,
    compile_sql,
    sql_of,
)

SQL = queries.load("common", "mysql")
NOW = SQL.text("now")

# The lists bound as expanding parameters, in every statement here.
LISTS = ("seqs", "tokens", "exclude", "states", "lasts", "ids", "relays")

# `exchange || '/' || routing_key` is a logical OR here.
RESOURCE_PARTS: Mapping[str, str] = {
    "broker": "''",
    "exchange": "exchange",
    "routing_key": "CONCAT(exchange, '/', routing_key)",
}

# What a reclaim's decision reads of each row (relay/core/suspects.py), and the server's time.
RECLAIMABLE_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "seq": BigInteger(),
    "id": UUID,
    "attempts": Integer(),
    "max_attempts": Integer(),
    "now": TIME,
}


# What settling reads of the rows a lease still holds.
HELD_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "seq": BigInteger(),
    "id": UUID,
    "attempts": Integer(),
}


def _reclaimable(rows: str) -> Query:
    """mysql.sql's reclaimable, locking `rows`."""
    return Query("reclaimable", RECLAIMABLE_COLUMNS, fill={"where": rows})


@dataclass(frozen=True, slots=True)
class MysqlStatements(Statements):
    """MySQL's and MariaDB's own statements, beside every dialect's. The runs' followers are
    built per number of heads (Mysql.followers_of)."""

    candidates: Annotated[Compiled, Query("candidates")]
    heads: Annotated[Compiled, Query("heads")]
    park: Annotated[Compiled, Query("park")]
    trailed: Annotated[Compiled, Query("trailed")]
    lock_followers: Annotated[Compiled, Query("lock_followers")]
    claim: Annotated[Compiled, Query("claim")]
    claimed: Annotated[Compiled, Query("claimed", CLAIMED_COLUMNS)]
    run_key: Annotated[Compiled, Query("run_key")]
    run_other: Annotated[Compiled, Query("run_other")]
    keys_of: Annotated[Compiled, Query("keys_of")]
    mark_published: Annotated[Compiled, Query("mark_published")]
    unpark_next: Annotated[Compiled, Query("unpark_next")]
    held: Annotated[
        Compiled, Query("held", {"seq": BigInteger(), "id": UUID, "attempts": Integer()})
    ]
    settle_one: Annotated[Compiled, Query("settle_one")]
    record_attempt: Annotated[Compiled, Query("record_attempt")]
    reclaimable: Annotated[Compiled, _reclaimable("{{reclaim_expired}}")]
    abandonable: Annotated[Compiled, _reclaimable("{{abandoned}}")]
    owned: Annotated[Compiled, _reclaimable("{{reclaim_owner}}")]
    of_dead: Annotated[Compiled, _reclaimable("{{reclaim_dead}}")]
    reclaim: Annotated[Compiled, Query("reclaim")]
    dead_relays: Annotated[Compiled, Query("dead_relays")]
    forget_relays: Annotated[Compiled, Query("forget_relays")]
    started_at: Annotated[Compiled, Query("started_at", {"started_at": TIME})]
    doomed: Annotated[Compiled, Query("doomed")]
    purge_messages: Annotated[Compiled, Query("purge_messages")]
    purge_attempts: Annotated[Compiled, Query("purge_attempts")]


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


class Mysql(Dialect):
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
    def is_transient(cls, exc: DBAPIError) -> bool:
        # By error number, read as a SQLSTATE (outbox/dberrors.py holds the rule).
        return classify_db_error(sqlstate_of(exc.orig)) is DbFailure.TRANSIENT

    @classmethod
    def engine_options(
        cls, *, pool_size: int, statement_timeout: float | None, pool_timeout: float
    ) -> dict[str, Any]:
        return {
            "pool_size": pool_size,
            "max_overflow": 2,
            "pool_timeout": pool_timeout,
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

    def bind_list(self, values: Iterable[Any]) -> list[Any]:
        return [v.hex if isinstance(v, uuid.UUID) else v for v in values]

    def claim(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            candidates = conn.execute(self.sql.candidates, params).all()
            keyed = [seq for seq, key, _, _ in candidates if key is not None]
            heads = set(conn.execute(self.sql.heads, {"seqs": keyed}).scalars()) if keyed else set()
            ready = [
                suspects.Candidate(seq, key, bool(suspect), bool(solitary))
                for seq, key, suspect, solitary in candidates
                if key is None or seq in heads
            ]
            best = ready[: params["limit"]]  # still in claim order
            # A solitary suspect alone, else suspects only, else all; runs follow heads only
            # when no suspect is claimed (relay/core/suspects.py).
            choice = suspects.choose(best, group=params["group"])
            run = self._runs(
                conn, params, [(c.seq, c.key) for c in choice.heads if c.key is not None]
            )
            in_run = set(run)
            parked = [seq for seq in keyed if seq not in heads and seq not in in_run]
            if parked:
                conn.execute(self.sql.park, {"seqs": parked})
            if not choice.chosen:
                return []
            seqs = [*choice.seqs, *run]
            claim = {**params, "seqs": seqs, "suspect": choice.suspects, "stamp": choice.stamp}
            conn.execute(self.sql.claim, claim)
            return conn.execute(self.sql.claimed, claim).all()

    def claim_run(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            key = conn.execute(self.sql.run_key, params).scalar_one_or_none()
            if key is None:
                return []
            if conn.execute(self.sql.run_other, {**params, "of_key": key}).first() is not None:
                return []
            run = self._runs(conn, params, [(params["after"], key)])
            if not run:
                return []
            claim = {**params, "seqs": run, "suspect": False, "stamp": params["grouped"]}
            conn.execute(self.sql.claim, claim)
            return conn.execute(self.sql.claimed, claim).all()

    def _runs(
        self, conn: Connection, params: Mapping[str, Any], heads: Sequence[tuple[int, str]]
    ) -> list[int]:
        """The rows of the runs behind `heads` ((seq, key), in claim order), locked."""
        if not heads or params["run"] <= 0 or params["follow"] <= 0:
            return []
        trailed = set(conn.execute(self.sql.trailed, {"seqs": [seq for seq, _ in heads]}).scalars())
        if not trailed:
            return []
        lines = self._lines(conn, params, [(seq, key) for seq, key in heads if seq in trailed])
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

    def mark_published(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            lasts: dict[str, int] = {}  # per key, the highest seq about to be published
            for seq, key in conn.execute(self.sql.keys_of, params):
                lasts[key] = max(seq, lasts.get(key, seq))
            marked = conn.execute(self.sql.mark_published, params).rowcount
            if lasts:
                conn.execute(self.sql.unpark_next, {"lasts": list(lasts.values())})
        return int(marked)

    def settle_failures(
        self, conn: Connection, settlements: Sequence[Mapping[str, Any]], params: dict[str, Any]
    ) -> int:
        by_seq = {s["seq"]: s for s in settlements}
        with self.transaction(conn):
            held = conn.execute(self.sql.held, {**params, "seqs": list(by_seq)}).all()
            records = []
            for seq, message_id, attempts in held:  # the others' lease was lost
                s = by_seq[seq]
                conn.execute(self.sql.settle_one, {**params, **s})
                records.append(
                    {
                        **params,
                        "message_id": message_id,
                        "attempt": attempts,
                        "failure_class": s["failure_class"],
                        "outcome": s["outcome"],
                        "error": s["error"],
                        "next_at": s["available_at"],
                    }
                )
            if records:
                conn.execute(self.sql.record_attempt, records)
        return len(held)

    def reclaim_expired(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            return self._reclaim_rows(conn, params, self.sql.reclaimable, suspects.expired)

    def abandon(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            error = params["error"]
            return self._reclaim_rows(conn, params, self.sql.abandonable, lambda _: error)

    def reclaim_owner(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            why = suspects.earlier_run(params["relay_id"])
            return self._reclaim_rows(conn, params, self.sql.owned, lambda _: why)

    def reclaim_dead(self, conn: Connection, params: dict[str, Any]) -> tuple[list[str], int]:
        with self.transaction(conn):
            p = {**params, "dead_after_neg": -params["dead_after"]}
            dead = list(conn.execute(self.sql.dead_relays, p).scalars())
            if not dead:
                return [], 0
            conn.execute(self.sql.forget_relays, {"relays": dead})

            def why(owner: str | None) -> str:
                return suspects.dead_relay(owner, params["dead_after"])

            return dead, self._reclaim_rows(conn, {**p, "relays": dead}, self.sql.of_dead, why)

    def _reclaim_rows(
        self,
        conn: Connection,
        params: dict[str, Any],
        pick: Compiled,
        why: Callable[[str | None], str],
    ) -> int:
        """Inside the caller's transaction: the rows `pick` locks, taken back as the core says,
        `why` giving the reason from a row's lease owner."""
        rows = conn.execute(pick, params).all()
        if not rows:
            return 0
        p = {**params, "now": rows[0].now}  # the server's time, once for the whole change
        reclaimed = {
            r.seq: suspects.reclaim(
                suspects.Leased(r.seq, r.last_error, r.attempts, r.max_attempts),
                reason=why(r.lease_owner),
                max_attempts=params["max_attempts"],
                now=r.now,
            )
            for r in rows
        }
        for (state, attempts, last_error), seqs in suspects.by_change(reclaimed.values()).items():
            change = {"state": state, "attempts": attempts, "last_error": last_error}
            conn.execute(self.sql.reclaim, {**p, **change, "seqs": seqs})
        records = [common.reclaim_attempt(r.id, reclaimed[r.seq].record, p) for r in rows]
        conn.execute(self.sql.record_attempt, records)
        return len(rows)

    def register_relay(self, conn: Connection, params: dict[str, Any]) -> dt.datetime:
        with self.transaction(conn):
            conn.execute(self.sql.register_relay, params)
            started: dt.datetime = conn.execute(self.sql.started_at, params).scalar_one()
        return started

    def purge_batch(self, conn: Connection, params: dict[str, Any]) -> tuple[int, uuid.UUID | None]:
        with self.transaction(conn):
            doomed = conn.execute(self.sql.doomed, params).all()
            if not doomed:
                return 0, None
            ids = [str(i) for _, i in doomed]
            conn.execute(self.sql.purge_messages, {"seqs": [seq for seq, _ in doomed]})
            conn.execute(self.sql.purge_attempts, {"ids": ids})
        return len(ids), uuid.UUID(max(ids))


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
