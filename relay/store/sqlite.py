"""The relay's store on SQLite: which statement of relay/store/sql/sqlite.sql (and common.sql) is
which, how a claim reads its candidates and its runs, and the connection. The SQL, and the reasons
for each statement, are in the .sql file.

SQLite has one writer at a time and no data-modifying CTEs, so what is one statement on PostgreSQL
is a few here (relay/store/stepwise.py), inside one BEGIN IMMEDIATE transaction: the write lock it
takes up front is what keeps two relays from claiming the same row, and what makes the statements
inside see and change the same rows. A transaction of several statements reads the time once
(Stepwise.pin_now), so they all agree on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from relay.core.suspects import Candidate
from relay.store import queries
from relay.store.statements import Compiled, Query
from relay.store.stepwise import Stepwise, StepwiseStatements

SQL = queries.load("common", "sqlite")


@dataclass(frozen=True, slots=True)
class SqliteStatements(StepwiseStatements):
    """SQLite's own statements, beside the steps' (stepwise.py)."""

    select_unkeyed: Annotated[Compiled, Query("select_unkeyed")]
    select_keyed: Annotated[Compiled, Query("select_keyed")]
    followers: Annotated[Compiled, Query("followers")]


class Sqlite(Stepwise):
    name = "sqlite"
    drivers = ("pysqlite",)
    # IMMEDIATE takes the write lock up front, so the statements inside see and change the same
    # rows, and a writer never fails upgrading a read lock against a busy relay.
    begin = "BEGIN IMMEDIATE"
    # SQLite's clock reads milliseconds while enqueue writes Python's microseconds here: a row
    # written in the current millisecond would look due only at the next poll.
    app_clock = True
    # WAL lets the application write while the relay reads; busy_timeout makes writers queue for
    # the single write lock instead of failing at once.
    on_connect = ("PRAGMA journal_mode=WAL", "PRAGMA busy_timeout=30000")
    # A purge batch holds the single write lock: between batches a purge rests as long as the
    # batch took, so writers queued in SQLite's busy handler (which retries at intervals of up to
    # 100 ms) find the lock free instead of losing every race to the next batch.
    purge_rest_ratio = 1.0

    queries = SQL
    statements = SqliteStatements
    sql: SqliteStatements

    @classmethod
    def is_transient(cls, exc: DBAPIError) -> bool:
        # No SQLSTATE here: every OperationalError ("database is locked", a disk error) is one
        # the next attempt may not meet.
        return isinstance(exc, OperationalError)

    @classmethod
    def engine_options(
        cls, *, pool_size: int, statement_timeout: float | None, pool_timeout: float
    ) -> dict[str, Any]:
        # No statement timeout in SQLite; the busy timeout bounds the wait for the write lock.
        return {"pool_timeout": pool_timeout, "connect_args": {"timeout": 30}}

    def bind_list(self, values: Iterable[Any]) -> str:
        # One JSON array, read by json_each: the statement's text is the same for any length.
        return json.dumps(super().bind_list(values))

    def candidates(
        self, conn: Connection, params: Mapping[str, Any]
    ) -> tuple[list[Candidate], list[int]]:
        # (seq, priority, available_at, suspect, solitary, key)
        found = [tuple(r) for r in conn.execute(self.sql.select_unkeyed, params)]
        waiting: list[int] = []
        for *candidate, head in conn.execute(self.sql.select_keyed, params):
            if head:
                found.append(tuple(candidate))
            else:
                waiting.append(candidate[0])
        # available_at is the stored text here, which sorts as time does.
        found.sort(key=lambda c: (-c[1], str(c[2]), c[0]))
        ready = [
            Candidate(seq, key, bool(suspect), bool(solitary))
            for seq, _, _, suspect, solitary, key in found
        ]
        return ready, waiting

    def runs(
        self, conn: Connection, params: Mapping[str, Any], heads: Sequence[Candidate]
    ) -> list[int]:
        found = conn.execute(
            self.sql.followers, {**params, "heads": self.bind_list(h.seq for h in heads)}
        )
        return list(found.scalars())
