"""Every statement the relay runs on SQLite, named and commented. Values are always bound.

SQLite has one writer at a time and no data-modifying CTEs, so what is one statement on PostgreSQL
(postgres.py, where each statement's reasons are given) is a few here, inside one BEGIN IMMEDIATE
transaction: the write lock it takes up front is what keeps two relays from claiming the same
row, and what makes the statements inside see and change the same rows.

SQLite has no time type: times are text in the format SQLAlchemy's DateTime writes
('YYYY-MM-DD HH:MM:SS.ffffff', UTC), so comparisons are plain string order. NOW is :now when a
test froze time, else SQLite's clock in that same format (to the millisecond: %f is SS.SSS). A
transaction of several statements reads it once (Sqlite._now), so they all agree on the time.
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
from relay.store import common
from relay.store.dialect import (
    CLAIMED_COLUMNS,
    TIME,
    Compiled,
    Dialect,
    Statements,
    compile_sql,
)

_FORMAT = "'%Y-%m-%d %H:%M:%f000'"
NOW = f"coalesce(:now, strftime({_FORMAT}, 'now'))"


def _now_plus(seconds: str) -> str:
    """NOW plus a bound number of seconds, in the stored format."""
    return f"strftime({_FORMAT}, coalesce(:now, 'now'), printf('%+.6f seconds', :{seconds}))"


_READ_NOW = f"SELECT {NOW} AS now"


def _is_head(row: str, *, blocking: str) -> str:
    """common.is_head, naming outbox_message_key_idx's state list: SQLite uses a partial index
    only where the query names its predicate, so with dead_key "skip" (a shorter list) the probe
    would walk every earlier row of the table by seq instead. The states outside `blocking`
    (dead, with "skip") are let off by `unless`."""
    if blocking == common.BLOCKING_HOLD:
        return common.is_head(row, blocking=blocking)
    return common.is_head(row, blocking=common.BLOCKING_HOLD, unless=f"e.state NOT IN ({blocking})")


# ------------------------------------------------------------------------ claiming

# Claiming is four statements in one transaction (five with runs): the unkeyed and the keyed
# candidates (keyed ones with whether each is its key's head), the runs behind the heads chosen
# (_FOLLOWERS), parking the keyed candidates that are neither heads nor in a run, and leasing the
# best :limit of the rest with their runs. Per-key order, parking, resources and runs as in
# postgres._CLAIM; there is no SKIP LOCKED to need, the write lock is already held. These bind
# the transaction's time, read once (Sqlite._now), so :now is never NULL here.
_SELECT_UNKEYED = """
SELECT seq, priority, available_at, lease_expires_at IS NOT NULL AS suspect,
       lease_expires_at IS NOT NULL AND last_error = :solitary AS solitary, key
FROM outbox_message
WHERE state = 'pending' AND key IS NULL AND available_at <= :now {filter}
ORDER BY priority DESC, available_at, seq
LIMIT :limit
"""

_SELECT_KEYED = """
SELECT seq, priority, available_at, lease_expires_at IS NOT NULL AS suspect,
       lease_expires_at IS NOT NULL AND last_error = :solitary AS solitary, key, {head} AS head
FROM outbox_message AS m
WHERE state = 'pending' AND key IS NOT NULL AND NOT held AND available_at <= :now {filter}
ORDER BY priority DESC, available_at, seq
LIMIT :scan
"""

# :exclude is a JSON array.
_RESOURCE_FILTER = """
  AND {resource} NOT IN (SELECT value FROM json_each(:exclude))
  AND (:only IS NULL OR {resource} = :only)"""

# Runs (see postgres._CLAIM): behind each of :heads (a JSON array of seqs, in claim order; the
# key is read from the head's row, since a BLOB key cannot travel in JSON), the next :run rows of
# its key in a blocking state, in seq order. SQLite has no LATERAL: a correlated IN with its own
# LIMIT reads each key's line in outbox_message_key_idx and stops at :run ({indexed} is that
# partial index's own state list: SQLite uses the index only where the query names its
# predicate, and with dead_key "skip" {blocking} is shorter). A run is the prefix whose rows are
# all ready (`due`); :follow rows at most are kept, numbered in the claim order of their heads.
_FOLLOWERS = """
WITH h AS (
    SELECT j.key AS rank, m.seq, m.key
    FROM json_each(:heads) AS j JOIN outbox_message AS m ON m.seq = j.value
), f AS (
    SELECT e.seq, h.rank,
           (e.state = 'pending' AND e.lease_expires_at IS NULL
            AND e.available_at <= :now {filter}) AS ok
    FROM h JOIN outbox_message AS e ON e.seq IN (
        SELECT x.seq FROM outbox_message AS x
        WHERE x.key = h.key AND x.seq > h.seq AND x.state IN ({indexed})
          AND x.state IN ({blocking})
        ORDER BY x.seq
        LIMIT :run
    )
), numbered AS (
    SELECT seq, row_number() OVER (ORDER BY rank, seq) AS n,
           min(ok) OVER (PARTITION BY rank ORDER BY seq) AS due
    FROM f
)
SELECT seq FROM numbered WHERE due AND n <= :follow
"""

# The next run of a chain (see postgres._CLAIM_RUN): _FOLLOWERS behind row :after, unless an
# earlier message of its key in a blocking state is not in flight under :token (this statement
# finds one).
_RUN_OTHER = """
SELECT 1 FROM outbox_message AS e
WHERE e.key = (SELECT key FROM outbox_message WHERE seq = :after) AND e.seq <= :after
  AND e.state IN ({indexed}) AND e.state IN ({blocking})
  AND NOT (e.state = 'in_flight' AND e.lease_token = :token)
LIMIT 1
"""

PARK = "UPDATE outbox_message SET held = true WHERE seq IN (SELECT value FROM json_each(:seqs))"

# `state = 'pending'` again: the candidates were chosen under the same write lock, so this only
# restates what must hold. :suspect is true when the rows chosen are suspects (see
# postgres._CLAIM): they are stamped with :stamp, claimed alone or with other suspects. A run's
# rows are usually parked: held is cleared with the lease.
CLAIM = f"""
UPDATE outbox_message
SET state = 'in_flight',
    held = false,
    attempts = attempts + 1,
    lease_owner = :owner,
    lease_token = :token,
    lease_expires_at = {_now_plus("lease_seconds")},
    last_error = CASE WHEN :suspect THEN :stamp ELSE last_error END
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND state = 'pending'
RETURNING seq, id, exchange, routing_key, payload, content_type, headers, key,
          priority, attempts, max_attempts, available_at, created_at, traceparent,
          tracestate, :suspect AS suspect
"""  # noqa: S608 - a time expression constant; every value is bound

# See postgres.py.
_HAS_READY = f"""
SELECT EXISTS (
    SELECT 1 FROM outbox_message
    WHERE state = 'pending' AND available_at <= {NOW} AND NOT held AND {{resource}} = :only
)
"""  # noqa: S608

# ------------------------------------------------------------------------ settling

# Lease-guarded: see postgres.MARK_PUBLISHED. Followed, in the same transaction, by UNPARK_NEXT
# for the rows it returns (one per row marked).
MARK_PUBLISHED = """
UPDATE outbox_message
SET state = 'published', published_at = :now, last_error = NULL,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND lease_token = :token
  AND state = 'in_flight'
RETURNING key, seq
"""

# Unparking, as postgres.MARK_PUBLISHED does: for each key just published, its next message in a
# blocking state after the highest seq published (:lasts, a JSON array of those seqs; the key is
# read from that row), unparked when it is parked and a head. One probe of
# outbox_message_key_idx each ({indexed} as in _FOLLOWERS), and one more for {head}. MARK_PUBLISHED
# ran first in the same transaction, so the rows it published block nothing any more. While a
# run is in flight the next message is the run's own: nothing is unparked.
UNPARK_NEXT = """
UPDATE outbox_message AS u SET held = false
WHERE u.seq IN (
    SELECT (SELECT n.seq FROM outbox_message AS n
            WHERE n.key = d.key AND n.seq > d.seq AND n.state IN ({indexed})
              AND n.state IN ({blocking})
            ORDER BY n.seq LIMIT 1)
    FROM json_each(:lasts) AS j JOIN outbox_message AS d ON d.seq = j.value
) AND u.state = 'pending' AND u.held AND {head}
"""

# See postgres.RELEASE.
RELEASE = f"""
UPDATE outbox_message
SET state = 'pending', available_at = {_now_plus("delay_seconds")},
    attempts = max(attempts - 1, 0),
    lease_expires_at = CASE WHEN last_error IN (:alone, :grouped) THEN {NOW} END,
    last_error = CASE WHEN last_error = :alone THEN :solitary ELSE :error END,
    lease_owner = NULL, lease_token = NULL
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND lease_token = :token
  AND state = 'in_flight'
"""  # noqa: S608

# See postgres.EXTEND_LEASES. :tokens is a JSON array of UUIDs as SQLite stores them (hex).
EXTEND_LEASES = f"""
UPDATE outbox_message
SET lease_expires_at = {_now_plus("lease_seconds")}
WHERE lease_token IN (SELECT value FROM json_each(:tokens)) AND state = 'in_flight'
"""  # noqa: S608

# Failed attempts (see postgres.SETTLE_FAILURES), one row at a time: SETTLE_ONE, then
# RECORD_ATTEMPT for the row if it changed (the lease guard let it through).
SETTLE_ONE = """
UPDATE outbox_message
SET state = :state,
    available_at = coalesce(:available_at, available_at),
    attempts = attempts - :unburn,
    last_error = :error,
    last_failed_at = :now,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq = :seq AND lease_token = :token AND state = 'in_flight'
RETURNING id, attempts + :unburn AS attempt
"""

RECORD_ATTEMPT = """
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
VALUES (:message_id, :attempt, :now, :relay_id, :failure_class, :outcome, :error, :next_at)
"""

# Taking leases back (relay/core/suspects.py decides what becomes of each row; postgres._RECLAIM
# says when): the rows, with what the decision reads, then RECLAIM once per distinct change and
# RECORD_ATTEMPT for them all, under the write lock the transaction holds. {where} picks the
# rows: an expired lease, one token's (abandon), an earlier run's, dead relays'.
_RECLAIMABLE = """
SELECT seq, id, lease_owner, last_error, attempts, max_attempts
FROM outbox_message WHERE state = 'in_flight' AND {where}
"""
# Only rows the read above found, still in flight.
RECLAIM = """
UPDATE outbox_message
SET state = :state, attempts = :attempts, last_error = :last_error, last_failed_at = :now,
    lease_owner = NULL, lease_token = NULL  -- lease_expires_at stays: the suspect's mark
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND state = 'in_flight'
"""
_EXPIRED = "lease_expires_at < :now"
_OWNER = "lease_owner = :relay_id"
# See postgres.RECLAIM_DEAD: the dead relays are read and deleted first, in the same transaction.
_DEAD = "lease_owner IN (SELECT value FROM json_each(:relays))"
DEAD_RELAYS = f"""
SELECT relay_id FROM outbox_relay
WHERE last_seen < strftime({_FORMAT}, :now, printf('-%.6f seconds', :dead_after))
  AND relay_id <> :relay_id
ORDER BY relay_id
"""  # noqa: S608
FORGET_RELAYS = "DELETE FROM outbox_relay WHERE relay_id IN (SELECT value FROM json_each(:relays))"
# ------------------------------------------------------------------------ resources, relays

# No FOR UPDATE in SQLite: the write lock BEGIN IMMEDIATE took (Dialect.transaction) covers it.
LOCK_RESOURCE = f"""
SELECT {common.RESOURCE_COLUMNS}, {NOW} AS now
FROM outbox_resource WHERE resource = :resource
"""  # noqa: S608

# See postgres.REGISTER_RELAY.
REGISTER_RELAY = f"""
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, {NOW}, {NOW})
ON CONFLICT (relay_id) DO UPDATE SET started_at = excluded.started_at,
                                     last_seen = excluded.last_seen
RETURNING started_at
"""  # noqa: S608
BEAT = common.BEAT.format(now=NOW)

HEARTBEAT = f"""
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, {NOW}, {NOW})
ON CONFLICT (relay_id) DO UPDATE SET last_seen = excluded.last_seen
"""  # noqa: S608

RELAYS = f"""
SELECT relay_id, started_at, last_seen FROM outbox_relay
WHERE last_seen > strftime({_FORMAT}, coalesce(:now, 'now'), printf('-%.6f seconds', :within))
ORDER BY relay_id
"""  # noqa: S608

# See postgres.PENDING_SUMMARY: through the same partial indexes (SQLite uses one when a term of
# the WHERE clause is a term of its predicate). julianday() reads the stored text; its difference
# is in days.
_PENDING_PART = f"""
SELECT coalesce(sum(m.available_at <= {NOW}), 0) AS due,
       coalesce(sum(m.available_at > {NOW}), 0) AS later,
       min(CASE WHEN m.available_at <= {NOW} THEN m.available_at END) AS oldest
FROM outbox_message AS m WHERE {{where}}
"""  # noqa: S608 - a module constant's fragment
PENDING_SUMMARY = f"""
SELECT sum(due), sum(later), (julianday({NOW}) - julianday(min(oldest))) * 86400.0
FROM ({"UNION ALL".join(_PENDING_PART.format(where=w) for w in common.PENDING_PARTS)})
"""  # noqa: S608

# ------------------------------------------------------------------------ the console's charts

# See common.py. Times are text here, so a time's minute is its first 16 characters
# ('YYYY-MM-DD HH:MM').
PUBLISHED_PER_MINUTE = common.PUBLISHED_PER_MINUTE.format(minute="substr(published_at, 1, 16)")
FAILED_PER_MINUTE = common.FAILED_PER_MINUTE.format(minute="substr(at, 1, 16)")

# ------------------------------------------------------------------------ retention

# The stored times are text in one format, so max() and < compare them as times; a
# multi-argument max() is NULL if any argument is, hence the coalesce.
_ELIGIBLE = common.ELIGIBLE.format(
    state_in="state IN (SELECT value FROM json_each(:states))",
    failed_at="max(created_at, coalesce(last_failed_at, created_at), "
    "coalesce(replayed_at, created_at))",
)

# A batch is this DELETE and PURGE_ATTEMPTS for the ids it returns, in one transaction (the write
# lock, held for the batch only, is what keeps anything from changing the rows in between). The
# ids come back as the stored hex text.
PURGE_MESSAGES = f"""
DELETE FROM outbox_message
WHERE seq IN (
    SELECT seq FROM outbox_message
    WHERE {_ELIGIBLE}
    ORDER BY id
    LIMIT :batch_size
)
RETURNING id
"""  # noqa: S608

# :ids is a JSON array of message ids as SQLite stores them (32 lowercase hex digits).
PURGE_ATTEMPTS = """
DELETE FROM outbox_attempt WHERE message_id IN (SELECT value FROM json_each(:ids))
"""

COUNT_ELIGIBLE = f"SELECT count(*) FROM outbox_message WHERE {_ELIGIBLE}"  # noqa: S608


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

    def _prepare(self, *, blocking: str, resource: str) -> Statements:
        where = _RESOURCE_FILTER.format(resource=resource)
        head = _is_head("m", blocking=blocking)
        self._read_now = compile_sql(_READ_NOW, {"now": TIME})
        self._select_unkeyed = compile_sql(_SELECT_UNKEYED.format(filter=where))
        self._select_keyed = compile_sql(_SELECT_KEYED.format(head=head, filter=where))
        self._followers = compile_sql(
            _FOLLOWERS.format(filter=where, blocking=blocking, indexed=common.BLOCKING_HOLD)
        )
        self._run_other = compile_sql(
            _RUN_OTHER.format(indexed=common.BLOCKING_HOLD, blocking=blocking)
        )
        self._park = compile_sql(PARK)
        self._claim = compile_sql(CLAIM, CLAIMED_COLUMNS)
        self._mark = compile_sql(MARK_PUBLISHED)
        self._unpark_next = compile_sql(
            UNPARK_NEXT.format(
                indexed=common.BLOCKING_HOLD,
                blocking=blocking,
                head=_is_head("u", blocking=blocking),
            )
        )
        self._settle_one = compile_sql(SETTLE_ONE, {"id": Uuid(), "attempt": Integer()})
        self._record_attempt = compile_sql(RECORD_ATTEMPT)
        reclaimable: dict[str, TypeEngine[Any]] = {
            "seq": Integer(),
            "id": Uuid(),
            "attempts": Integer(),
            "max_attempts": Integer(),
        }
        self._reclaimable = compile_sql(_RECLAIMABLE.format(where=_EXPIRED), reclaimable)
        self._abandonable = compile_sql(
            _RECLAIMABLE.format(where="lease_token = :token"), reclaimable
        )
        self._owned = compile_sql(_RECLAIMABLE.format(where=_OWNER), reclaimable)
        self._of_dead = compile_sql(_RECLAIMABLE.format(where=_DEAD), reclaimable)
        self._reclaim = compile_sql(RECLAIM)
        self._dead_relays = compile_sql(DEAD_RELAYS)
        self._forget_relays = compile_sql(FORGET_RELAYS)
        self._register = compile_sql(REGISTER_RELAY, {"started_at": TIME})
        self._beat = compile_sql(BEAT)
        self._purge_messages = compile_sql(PURGE_MESSAGES)
        self._purge_attempts = compile_sql(PURGE_ATTEMPTS)
        return Statements.compile(
            blocking=blocking,
            has_ready=_HAS_READY.format(resource=resource),
            release=RELEASE,
            extend_leases=EXTEND_LEASES,
            lock_resource=LOCK_RESOURCE,
            heartbeat=HEARTBEAT,
            relays=RELAYS,
            pending_summary=PENDING_SUMMARY,
            count_eligible=COUNT_ELIGIBLE,
        )

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
