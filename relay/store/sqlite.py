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
from typing import Any

from sqlalchemy import Connection, Integer, Uuid
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.types import TypeEngine

from relay.core import suspects
from relay.store import common, queries
from relay.store.dialect import CLAIMED_COLUMNS, TIME, Compiled, Dialect, Query

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


# The statements Sqlite's own methods run (beside SqlStore's, dialect.STATEMENTS), by attribute;
# {{row}} is the alias key_head looks at.
STATEMENTS: Mapping[str, Query] = {
    "_read_now": Query("read_now", {"now": TIME}),
    "_select_unkeyed": Query("select_unkeyed"),
    "_select_keyed": Query("select_keyed", fill={"row": "m"}),
    "_followers": Query("followers"),
    "_run_other": Query("run_other"),
    "_park": Query("park"),
    "_claim": Query("claim", CLAIMED_COLUMNS),
    "_mark": Query("mark_published"),
    "_unpark_next": Query("unpark_next", fill={"row": "u"}),
    "unpark_sweep": Query("unpark_sweep"),
    "_settle_one": Query("settle_one", {"id": Uuid(), "attempt": Integer()}),
    "_record_attempt": Query("record_attempt"),
    "_reclaimable": _reclaimable("{{reclaim_expired}}"),
    "_abandonable": _reclaimable("{{abandoned}}"),
    "_owned": _reclaimable("{{reclaim_owner}}"),
    "_of_dead": _reclaimable("{{reclaim_dead}}"),
    "_reclaim": Query("reclaim"),
    "_dead_relays": Query("dead_relays"),
    "_forget_relays": Query("forget_relays"),
    "_register": Query("register_relay", {"started_at": TIME}),
    "_beat": Query("beat"),
    "_purge_messages": Query("purge_messages"),
    "_purge_attempts": Query("purge_attempts"),
}

# Run by other modules: the console's charts (admin.py), a retention batch by hand (tests).
PUBLISHED_PER_MINUTE = SQL.text("published_per_minute")
FAILED_PER_MINUTE = SQL.text("failed_per_minute")
PURGE_MESSAGES = SQL.text("purge_messages")
COUNT_ELIGIBLE = SQL.text("count_eligible")


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

    queries = SQL
    statements = STATEMENTS
    _read_now: Compiled
    _select_unkeyed: Compiled
    _select_keyed: Compiled
    _followers: Compiled
    _run_other: Compiled
    _park: Compiled
    _claim: Compiled
    _mark: Compiled
    _unpark_next: Compiled
    _settle_one: Compiled
    _record_attempt: Compiled
    _reclaimable: Compiled
    _abandonable: Compiled
    _owned: Compiled
    _of_dead: Compiled
    _reclaim: Compiled
    _dead_relays: Compiled
    _forget_relays: Compiled
    _register: Compiled
    _beat: Compiled
    _purge_messages: Compiled
    _purge_attempts: Compiled

    def configuration(self, *, blocking: str, resource: str) -> dict[str, str]:
        # SQLite uses a partial index only where the query names its predicate: a head check
        # names outbox_message_key_idx's states, and with dead_key "skip" lets the dead off
        # beside them (sqlite.sql, key_head).
        let_off = "" if blocking == common.BLOCKING_HOLD else "{{let_off_dead}}"
        return {**super().configuration(blocking=blocking, resource=resource), "let_off": let_off}

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
        now: dt.datetime = conn.execute(self._read_now, {"now": params["now"]}).scalar_one()
        return now

    def claim(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            p = {**params, "now": self._now(conn, params)}
            # (seq, priority, available_at, suspect, solitary, key)
            candidates = [tuple(r) for r in conn.execute(self._select_unkeyed, p)]
            parked: list[int] = []
            for *candidate, head in conn.execute(self._select_keyed, p):
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
                conn.execute(self._park, {"seqs": self.bind_list(parked)})
            return conn.execute(
                self._claim,
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
            if conn.execute(self._run_other, p).first() is not None:
                return []
            run = self._runs(conn, p, [params["after"]])
            if not run:
                return []
            claim = {**p, "seqs": self.bind_list(run), "suspect": False, "stamp": p["grouped"]}
            return conn.execute(self._claim, claim).all()

    def _runs(self, conn: Connection, params: Mapping[str, Any], heads: Sequence[int]) -> list[int]:
        """The rows of the runs behind `heads` (keyed rows, in claim order)."""
        if not heads or params["run"] <= 0 or params["follow"] <= 0:
            return []
        found = conn.execute(self._followers, {**params, "heads": self.bind_list(heads)})
        return list(found.scalars())

    def mark_published(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            p = {**params, "now": self._now(conn, params)}
            marked = conn.execute(self._mark, p).all()
            lasts: dict[Any, int] = {}  # per key, the highest seq published
            for key, seq in marked:
                if key is not None:
                    lasts[key] = max(seq, lasts.get(key, seq))
            if lasts:
                conn.execute(self._unpark_next, {"lasts": self.bind_list(lasts.values())})
        return len(marked)

    def settle_failures(
        self, conn: Connection, settlements: Sequence[Mapping[str, Any]], params: dict[str, Any]
    ) -> int:
        changed = 0
        with self.transaction(conn):
            p = {**params, "now": self._now(conn, params)}
            for s in settlements:
                hit = conn.execute(self._settle_one, {**s, **p}).first()
                if hit is None:
                    continue  # the lease was lost: another relay owns the row now
                changed += 1
                conn.execute(
                    self._record_attempt,
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
            return self._reclaim_rows(conn, params, self._reclaimable, suspects.expired)

    def abandon(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            error = params["error"]
            return self._reclaim_rows(conn, params, self._abandonable, lambda _: error)

    def reclaim_owner(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            why = suspects.earlier_run(params["relay_id"])
            return self._reclaim_rows(conn, params, self._owned, lambda _: why)

    def reclaim_dead(self, conn: Connection, params: dict[str, Any]) -> tuple[list[str], int]:
        with self.transaction(conn):
            p = {**params, "now": self._now(conn, params)}
            dead = list(conn.execute(self._dead_relays, p).scalars())
            if not dead:
                return [], 0
            relays = self.bind_list(dead)
            conn.execute(self._forget_relays, {"relays": relays})

            def why(owner: str | None) -> str:
                return suspects.dead_relay(owner, params["dead_after"])

            return dead, self._reclaim_rows(conn, {**p, "relays": relays}, self._of_dead, why)

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
            conn.execute(self._reclaim, {**p, **change, "seqs": self.bind_list(seqs)})
        records = [common.reclaim_attempt(r.id, reclaimed[r.seq].record, p) for r in rows]
        conn.execute(self._record_attempt, records)
        return len(rows)

    def register_relay(self, conn: Connection, params: dict[str, Any]) -> dt.datetime:
        started: dt.datetime = conn.execute(self._register, params).scalar_one()
        return started

    def beat(self, conn: Connection, params: dict[str, Any]) -> bool:
        return conn.execute(self._beat, params).rowcount == 1

    def purge_batch(self, conn: Connection, params: dict[str, Any]) -> tuple[int, uuid.UUID | None]:
        with self.transaction(conn):
            ids = [str(i) for i in conn.execute(self._purge_messages, params).scalars()]
            if ids:
                conn.execute(self._purge_attempts, {"ids": self.bind_list(ids)})
        return len(ids), uuid.UUID(max(ids)) if ids else None
