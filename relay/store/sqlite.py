"""The relay's store on SQLite: which statement of relay/store/sql/sqlite.sql (and common.sql) is
which, and the transactions that run several of them. The SQL, and the reasons for each
statement, are in the .sql file.

SQLite has one writer at a time and no data-modifying CTEs, so what is one statement on PostgreSQL
is a few here, inside one BEGIN IMMEDIATE transaction: the write lock it takes up front is what
keeps two relays from claiming the same row, and what makes the statements inside see and change
the same rows. A transaction of several statements reads the time once (Sqlite._now), so they all
agree on it.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from sqlalchemy import Connection, Integer, Uuid
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.types import TypeEngine

from relay.core import suspects
from relay.store import common, queries
from relay.store.dialect import Dialect
from relay.store.statements import CLAIMED_COLUMNS, TIME, Compiled, Query, Statements

SQL = queries.load("common", "sqlite")

# What a reclaim's decision reads of each row (relay/core/suspects.py).
RECLAIMABLE: Mapping[str, TypeEngine[Any]] = {
    "seq": Integer(),
    "id": Uuid(),
    "attempts": Integer(),
    "max_attempts": Integer(),
}


def _reclaimable(rows: str) -> Query:
    """sqlite.sql's reclaimable, reading `rows`."""
    return Query("reclaimable", RECLAIMABLE, fill={"where": rows})


@dataclass(frozen=True, slots=True)
class SqliteStatements(Statements):
    """SQLite's own statements, beside every dialect's."""

    read_now: Annotated[Compiled, Query("read_now", {"now": TIME})]
    select_unkeyed: Annotated[Compiled, Query("select_unkeyed")]
    select_keyed: Annotated[Compiled, Query("select_keyed")]
    followers: Annotated[Compiled, Query("followers")]
    run_other: Annotated[Compiled, Query("run_other")]
    park: Annotated[Compiled, Query("park")]
    claim: Annotated[Compiled, Query("claim", CLAIMED_COLUMNS)]
    mark_published: Annotated[Compiled, Query("mark_published")]
    unpark_next: Annotated[Compiled, Query("unpark_next")]
    settle_one: Annotated[Compiled, Query("settle_one", {"id": Uuid(), "attempt": Integer()})]
    record_attempt: Annotated[Compiled, Query("record_attempt")]
    reclaimable: Annotated[Compiled, _reclaimable("{{reclaim_expired}}")]
    abandonable: Annotated[Compiled, _reclaimable("{{abandoned}}")]
    owned: Annotated[Compiled, _reclaimable("{{reclaim_owner}}")]
    of_dead: Annotated[Compiled, _reclaimable("{{reclaim_dead}}")]
    reclaim: Annotated[Compiled, Query("reclaim")]
    dead_relays: Annotated[Compiled, Query("dead_relays")]
    forget_relays: Annotated[Compiled, Query("forget_relays")]
    purge_messages: Annotated[Compiled, Query("purge_messages")]
    purge_attempts: Annotated[Compiled, Query("purge_attempts")]


class Sqlite(Dialect):
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
        return json.dumps([v.hex if isinstance(v, uuid.UUID) else v for v in values])

    def _now(self, conn: Connection, params: Mapping[str, Any]) -> dt.datetime:
        """The transaction's time: the frozen one if any, else SQLite's clock, read once."""
        now: dt.datetime = conn.execute(self.sql.read_now, {"now": params["now"]}).scalar_one()
        return now

    def claim(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            p = {**params, "now": self._now(conn, params)}
            # (seq, priority, available_at, suspect, solitary, key)
            candidates = [tuple(r) for r in conn.execute(self.sql.select_unkeyed, p)]
            parked: list[int] = []
            for *candidate, head in conn.execute(self.sql.select_keyed, p):
                if head:
                    candidates.append(tuple(candidate))
                else:
                    parked.append(candidate[0])
            # available_at is the stored text here, which sorts as time does.
            candidates.sort(key=lambda c: (-c[1], str(c[2]), c[0]))
            best = [
                suspects.Candidate(seq, key, bool(suspect), bool(solitary))
                for seq, _, _, suspect, solitary, key in candidates[: params["limit"]]
            ]
            # A solitary suspect alone, else suspects only, else all; runs follow heads only
            # when no suspect is claimed (relay/core/suspects.py).
            choice = suspects.choose(best, group=params["group"])
            run = self._runs(conn, p, [c.seq for c in choice.heads])
            in_run = set(run)
            parked = [seq for seq in parked if seq not in in_run]
            if parked:
                conn.execute(self.sql.park, {"seqs": self.bind_list(parked)})
            return conn.execute(
                self.sql.claim,
                {
                    **p,
                    "seqs": self.bind_list([*choice.seqs, *run]),
                    "suspect": choice.suspects,
                    "stamp": choice.stamp,
                },
            ).all()

    def claim_run(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            p = {**params, "now": self._now(conn, params)}
            if conn.execute(self.sql.run_other, p).first() is not None:
                return []
            run = self._runs(conn, p, [params["after"]])
            if not run:
                return []
            claim = {**p, "seqs": self.bind_list(run), "suspect": False, "stamp": p["grouped"]}
            return conn.execute(self.sql.claim, claim).all()

    def _runs(self, conn: Connection, params: Mapping[str, Any], heads: Sequence[int]) -> list[int]:
        """The rows of the runs behind `heads` (keyed rows, in claim order)."""
        if not heads or params["run"] <= 0 or params["follow"] <= 0:
            return []
        found = conn.execute(self.sql.followers, {**params, "heads": self.bind_list(heads)})
        return list(found.scalars())

    def mark_published(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            p = {**params, "now": self._now(conn, params)}
            marked = conn.execute(self.sql.mark_published, p).all()
            lasts: dict[Any, int] = {}  # per key, the highest seq published
            for key, seq in marked:
                if key is not None:
                    lasts[key] = max(seq, lasts.get(key, seq))
            if lasts:
                conn.execute(self.sql.unpark_next, {"lasts": self.bind_list(lasts.values())})
        return len(marked)

    def settle_failures(
        self, conn: Connection, settlements: Sequence[Mapping[str, Any]], params: dict[str, Any]
    ) -> int:
        changed = 0
        with self.transaction(conn):
            p = {**params, "now": self._now(conn, params)}
            for s in settlements:
                hit = conn.execute(self.sql.settle_one, {**s, **p}).first()
                if hit is None:
                    continue  # the lease was lost: another relay owns the row now
                changed += 1
                conn.execute(
                    self.sql.record_attempt,
                    {
                        **p,
                        "message_id": hit.id,
                        "attempt": hit.attempt,
                        "failure_class": s["failure_class"],
                        "outcome": s["outcome"],
                        "error": s["error"],
                        "next_at": s["available_at"],
                    },
                )
        return changed

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
            p = {**params, "now": self._now(conn, params)}
            dead = list(conn.execute(self.sql.dead_relays, p).scalars())
            if not dead:
                return [], 0
            relays = self.bind_list(dead)
            conn.execute(self.sql.forget_relays, {"relays": relays})

            def why(owner: str | None) -> str:
                return suspects.dead_relay(owner, params["dead_after"])

            return dead, self._reclaim_rows(conn, {**p, "relays": relays}, self.sql.of_dead, why)

    def _reclaim_rows(
        self,
        conn: Connection,
        params: dict[str, Any],
        pick: Compiled,
        why: Callable[[str | None], str],
    ) -> int:
        """Inside the caller's transaction: the rows `pick` finds, taken back as the core says,
        `why` giving the reason from a row's lease owner."""
        now = self._now(conn, params)
        p = {**params, "now": now}
        rows = conn.execute(pick, p).all()
        if not rows:
            return 0
        reclaimed = {
            r.seq: suspects.reclaim(
                suspects.Leased(r.seq, r.last_error, r.attempts, r.max_attempts),
                reason=why(r.lease_owner),
                max_attempts=params["max_attempts"],
                now=now,
            )
            for r in rows
        }
        for (state, attempts, last_error), seqs in suspects.by_change(reclaimed.values()).items():
            change = {"state": state, "attempts": attempts, "last_error": last_error}
            conn.execute(self.sql.reclaim, {**p, **change, "seqs": self.bind_list(seqs)})
        records = [common.reclaim_attempt(r.id, reclaimed[r.seq].record, p) for r in rows]
        conn.execute(self.sql.record_attempt, records)
        return len(rows)

    def purge_batch(self, conn: Connection, params: dict[str, Any]) -> tuple[int, uuid.UUID | None]:
        with self.transaction(conn):
            ids = [str(i) for i in conn.execute(self.sql.purge_messages, params).scalars()]
            if ids:
                conn.execute(self.sql.purge_attempts, {"ids": self.bind_list(ids)})
        return len(ids), uuid.UUID(max(ids)) if ids else None
