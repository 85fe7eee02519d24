"""Taking leases back, the same on every database, as River's rescuer does it: the stuck rows are
read and locked (common.sql, stuck_*), relay/core/suspects.py decides what becomes of each, and
the decisions and their attempt records are written back in one statement each for all the rows
(Dialect.write_back). The SQL holds no policy.

All of it runs in one short transaction, at one time read at its start (read_now): the locks
taken by the read (SKIP LOCKED: two relays reclaiming at once take disjoint rows) keep the rows
as read until the decisions are written.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from sqlalchemy import Connection, Row

from relay.core import suspects
from relay.store.dialect import Dialect
from relay.store.statements import Compiled
from relay.store.transitions import Attempt, Transition

# Why a lease was taken back, from the lease owner a stuck row names.
Reason = Callable[[str | None], str]


def reclaim(
    dialect: Dialect,
    conn: Connection,
    pick: Compiled,
    params: Mapping[str, Any],
    why: Reason,
    *,
    keep: Set[tuple[uuid.UUID, int]] = frozenset(),
) -> int:
    """Take back the rows `pick` (one of the stuck_* statements) reads with `params`, but those
    of `keep` (lease token, seq); return how many. params: relay_id (who records it),
    max_attempts (the relay's default), and what `pick` binds (token, owner)."""
    with dialect.transaction(conn):
        now = _now(dialect, conn, params)
        rows = conn.execute(pick, {**params, "now": now}).all()
        if keep:
            rows = [r for r in rows if (r.lease_token, r.seq) not in keep]
        return _take_back(dialect, conn, rows, why, {**params, "now": now})


def reclaim_dead(
    dialect: Dialect, conn: Connection, params: Mapping[str, Any]
) -> tuple[list[str], int]:
    """Delete the rows of relays, other than :relay_id, last seen more than :dead_after seconds
    ago, and take back the rows they leased; return those relays and how many rows."""
    with dialect.transaction(conn):
        now = _now(dialect, conn, params)
        seen_before = now - dt.timedelta(seconds=params["dead_after"])
        found = conn.execute(
            dialect.sql.dead_relays, {"seen_before": seen_before, "relay_id": params["relay_id"]}
        )
        dead = [str(relay) for relay in found.scalars()]
        rows: list[Row[Any]] = []
        for relay in dead:
            conn.execute(dialect.sql.forget_relay, {"relay_id": relay})
            rows += conn.execute(dialect.sql.stuck_owned, {"owner": relay, "now": now}).all()

        def why(owner: str | None) -> str:
            return suspects.dead_relay(owner, params["dead_after"])

        return dead, _take_back(dialect, conn, rows, why, {**params, "now": now})


def _now(dialect: Dialect, conn: Connection, params: Mapping[str, Any]) -> dt.datetime:
    """The transaction's time: the frozen one if any, else the database's, read once."""
    now: dt.datetime = conn.execute(dialect.sql.read_now, {"now": params.get("now")}).scalar_one()
    return now


def _take_back(
    dialect: Dialect,
    conn: Connection,
    rows: Sequence[Row[Any]],
    why: Reason,
    params: Mapping[str, Any],
) -> int:
    """Inside the caller's transaction: `rows` (stuck_columns), taken back as the core says."""
    if not rows:
        return 0
    max_attempts, now = params["max_attempts"], params["now"]
    changes: list[Transition] = []
    records: list[Attempt] = []
    for r in rows:
        leased = suspects.Leased(r.seq, suspects.suspect_of(r.suspect), r.attempts, r.max_attempts)
        decided = suspects.reclaim(
            leased, reason=why(r.lease_owner), max_attempts=max_attempts, now=now
        )
        changes.append(
            Transition(
                seq=r.seq,
                token=r.lease_token,
                state=decided.state,
                attempts=decided.attempts,
                last_error=decided.last_error,
                suspect=decided.suspect.value,
                keep_expiry=True,
            )
        )
        record = decided.record
        records.append(
            Attempt(
                r.id,
                record.attempt,
                suspects.AMBIGUOUS,
                record.outcome,
                record.error,
                record.next_attempt_at,
            )
        )
    dialect.write_back(conn, changes, records, params)
    return len(rows)
