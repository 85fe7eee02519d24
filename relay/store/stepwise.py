"""The store on a database without data-modifying CTEs (MySQL and MariaDB, SQLite): what is one
statement on PostgreSQL is a few here, in one short transaction, and these are the steps, written
once. The statements the two write alike are in common.sql; Mysql and Sqlite say how they read a
claim's candidates and a run's followers, and what their transaction's time is.

- claim: the candidates in claim order (keyed ones with whether each is its key's head), the
  core's choice among the best :limit (relay/core/suspects.py), the runs behind the heads chosen,
  parking the keyed candidates that are neither heads nor in a run, and the lease;
- mark_published: the keys of the rows about to be marked, the mark, and unparking the next
  message of each key;
- settle_failures: the rows the lease still holds, and the settlements written back in one
  statement with their attempt records (Dialect.write_back);
- purge_batch: a batch of rows, locked, then the rows and their attempts deleted.
"""

from __future__ import annotations

import uuid
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from sqlalchemy import Connection

from relay.core import suspects
from relay.core.suspects import Candidate
from relay.store.dialect import Dialect
from relay.store.statements import CLAIMED_COLUMNS, HELD_COLUMNS, Compiled, Query, Statements
from relay.store.transitions import Attempt, Transition


@dataclass(frozen=True, slots=True)
class StepwiseStatements(Statements):
    """The statements of the steps, beside every dialect's (common.sql, but for the dialect's own
    unpark_next, run_other and purge_attempts)."""

    park: Annotated[Compiled, Query("park")]  # (seqs)
    claim_rows: Annotated[Compiled, Query("claim_rows")]  # (seqs, owner, token, suspect, stamp)
    claimed: Annotated[Compiled, Query("claimed", CLAIMED_COLUMNS)]  # (seqs)
    run_key: Annotated[Compiled, Query("run_key")]  # (after) -> key
    run_other: Annotated[Compiled, Query("run_other")]  # (of_key, after, token) -> any row
    keys_of: Annotated[Compiled, Query("keys_of")]  # (seqs, token) -> (seq, key)
    mark_rows: Annotated[Compiled, Query("mark_rows")]  # (seqs, token, now); rowcount
    unpark_next: Annotated[Compiled, Query("unpark_next")]  # (lasts)
    held: Annotated[Compiled, Query("held", HELD_COLUMNS)]  # (seqs, token)
    doomed: Annotated[Compiled, Query("doomed")]  # retention's binds -> (seq, id)
    purge_messages: Annotated[Compiled, Query("purge_messages")]  # (seqs)
    purge_attempts: Annotated[Compiled, Query("purge_attempts")]  # (ids)


class Stepwise(Dialect):
    """A Dialect whose claims, marks, settlements and purges take several statements each."""

    sql: StepwiseStatements

    def pin_now(self, conn: Connection, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` with the time the transaction's statements use: the one given (the
        application's clock, or a test's), else the database's, read once so that they all
        agree on it (read_now)."""
        if params["now"] is not None:
            return dict(params)
        now = conn.execute(self.sql.read_now, {"now": None}).scalar_one()
        return {**params, "now": now}

    @abstractmethod
    def candidates(
        self, conn: Connection, params: Mapping[str, Any]
    ) -> tuple[list[Candidate], list[int]]:
        """The ready candidates in claim order (unkeyed rows and keyed heads), and the keyed
        candidates that are not their key's head (parked unless a run takes them)."""

    @abstractmethod
    def runs(
        self, conn: Connection, params: Mapping[str, Any], heads: Sequence[Candidate]
    ) -> list[int]:
        """The rows of the runs behind `heads` (keyed rows, in claim order), locked where the
        database locks rows: the prefix of each key's line that is ready, :follow rows in all."""

    # ------------------------------------------------------------------ claiming

    def claim(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            p = self.pin_now(conn, params)
            ready, waiting = self.candidates(conn, p)
            # A solitary suspect alone, else suspects only, else all; runs follow heads only
            # when no suspect is claimed (relay/core/suspects.py).
            choice = suspects.choose(ready[: p["limit"]], group=p["group"])
            run = self._runs(conn, p, choice.heads)
            in_run = set(run)
            parked = [seq for seq in waiting if seq not in in_run]
            if parked:
                conn.execute(self.sql.park, {"seqs": self.bind_list(parked)})
            if not choice.chosen:
                return []
            return self._lease(conn, p, [*choice.seqs, *run], choice.stamp)

    def claim_run(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            p = self.pin_now(conn, params)
            key = conn.execute(self.sql.run_key, p).scalar_one_or_none()
            if key is None:
                return []
            if conn.execute(self.sql.run_other, {**p, "of_key": key}).first() is not None:
                return []
            run = self._runs(conn, p, [Candidate(p["after"], key, suspect=False, solitary=False)])
            return self._lease(conn, p, run, None) if run else []

    def _runs(
        self, conn: Connection, params: Mapping[str, Any], heads: Sequence[Candidate]
    ) -> list[int]:
        if not heads or params["run"] <= 0 or params["follow"] <= 0:
            return []
        return self.runs(conn, params, heads)

    def _lease(
        self, conn: Connection, params: Mapping[str, Any], seqs: list[int], stamp: str | None
    ) -> Sequence[Sequence[Any]]:
        lease = {**params, "seqs": self.bind_list(seqs)}
        conn.execute(self.sql.claim_rows, {**lease, "stamp": stamp})
        return conn.execute(self.sql.claimed, lease).all()

    # ------------------------------------------------------------------ settling

    def mark_published(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            p = self.pin_now(conn, params)
            lasts: dict[Any, int] = {}  # per key, the highest seq about to be published
            for seq, key in conn.execute(self.sql.keys_of, p):
                lasts[key] = max(seq, lasts.get(key, seq))
            marked = conn.execute(self.sql.mark_rows, p).rowcount
            if lasts:
                conn.execute(self.sql.unpark_next, {"lasts": self.bind_list(lasts.values())})
        return int(marked)

    def settle_failures(
        self, conn: Connection, settlements: Sequence[Mapping[str, Any]], params: dict[str, Any]
    ) -> int:
        by_seq = {s["seq"]: s for s in settlements}
        with self.transaction(conn):
            p = self.pin_now(conn, params)
            held = conn.execute(self.sql.held, {**p, "seqs": self.bind_list(by_seq)}).all()
            changes: list[Transition] = []
            records: list[Attempt] = []
            for seq, message_id, attempts in held:  # the others' lease was lost
                s = by_seq[seq]
                changes.append(
                    Transition(
                        seq=seq,
                        token=p["token"],
                        state=s["state"],
                        attempts=attempts - s["unburn"],
                        last_error=s["error"],
                        suspect=None,  # settling a row ends its suspicion
                        available_at=s["available_at"],
                    )
                )
                records.append(
                    Attempt(
                        message_id,
                        attempts,
                        s["failure_class"],
                        s["outcome"],
                        s["error"],
                        s["available_at"],
                    )
                )
            if held:
                self.write_back(conn, changes, records, p)
        return len(held)

    # ------------------------------------------------------------------ retention

    def purge_batch(self, conn: Connection, params: dict[str, Any]) -> tuple[int, uuid.UUID | None]:
        with self.transaction(conn):
            doomed = conn.execute(self.sql.doomed, params).all()
            if not doomed:
                return 0, None
            ids = [str(i) for _, i in doomed]  # as stored: 32 hex digits
            conn.execute(self.sql.purge_messages, {"seqs": self.bind_list(s for s, _ in doomed)})
            conn.execute(self.sql.purge_attempts, {"ids": self.bind_list(ids)})
        return len(ids), uuid.UUID(max(ids))
