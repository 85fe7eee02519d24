"""Every statement the relay runs on MySQL 8.0+ and MariaDB 10.6+, named and commented. Values are
always bound.

These servers have SKIP LOCKED but neither UPDATE ... RETURNING nor data-modifying CTEs, and
MySQL cannot UPDATE a table it reads in a subquery of the same statement. So what is one
statement on PostgreSQL (postgres.py, where each statement's reasons are given) is a few here,
in one short READ COMMITTED transaction: a locking read (FOR UPDATE, SKIP LOCKED where relays
compete) picks the rows, then plain UPDATEs by primary key change them. The row locks, held to
the COMMIT, are what keep two relays off the same row. READ COMMITTED, not the server's default
REPEATABLE READ: that would lock the gaps between the index entries a claim reads, and an
application's INSERT into such a gap would wait for the claim, or deadlock with it.

Times are DATETIME(6) in UTC: NOW is :now when a test froze time, else UTC_TIMESTAMP(6), the
server's clock (enqueue stamps rows with it too, so the relay and the application agree).
Durations are bound in seconds and added as microseconds.

Lists are bound as SQLAlchemy's expanding parameters (`seq IN :seqs` becomes `seq IN (1, 2, 3)`):
primary-key lookups every server plans well. `key` is a reserved word here: unqualified, it is
quoted.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import takewhile
from typing import Any

from sqlalchemy import BigInteger, Connection, Integer
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import TypeEngine

from outbox.dberrors import DbFailure, classify_db_error, sqlstate_of
from outbox.schema import UUID
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

NOW = "coalesce(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6))"


def _plus(seconds: str, base: str = NOW) -> str:
    """`base` plus a bound number of seconds (microsecond precision)."""
    return f"TIMESTAMPADD(MICROSECOND, ROUND(:{seconds} * 1000000), {base})"


# The lists bound as expanding parameters, in every statement here.
LISTS = ("seqs", "tokens", "exclude", "states", "lasts", "ids", "relays")

# `exchange || '/' || routing_key` is a logical OR here.
RESOURCE_PARTS: Mapping[str, str] = {
    "broker": "''",
    "exchange": "exchange",
    "routing_key": "CONCAT(exchange, '/', routing_key)",
}

# ------------------------------------------------------------------------ per-key order


def is_head(row: str, *, blocking: str) -> str:
    """The head check (postgres.sql's claim) in the form MySQL runs in constant time: per
    blocking state, the key's first row in that state (one probe of
    outbox_message_key_state_idx, read in seq order and stopped at once), earlier than `row` or
    not. As one NOT EXISTS over the states, MySQL and MariaDB read every row of the key,
    published ones included."""
    probes = [
        f"""coalesce((SELECT e.seq FROM outbox_message AS e
                  FORCE INDEX (outbox_message_key_state_idx)
                  WHERE e.key = {row}.key AND e.state = {state}
                  ORDER BY e.seq LIMIT 1), {row}.seq) >= {row}.seq"""  # noqa: S608
        for state in (s.strip() for s in blocking.split(","))
    ]
    return "(" + "\n    AND ".join(probes) + ")"


# ------------------------------------------------------------------------ claiming

# The candidates, best first, locked: ready rows in claim order, keyed and unkeyed together, read
# along outbox_message_claim_idx (outbox/migrate.py). SKIP LOCKED: a row another relay is claiming
# right now is not a candidate. A keyed row becomes a head or is parked (HEADS, PARK), as on
# PostgreSQL; at most :scan rows are looked at.
_CANDIDATES = """
SELECT seq, `key`, lease_expires_at IS NOT NULL AS suspect,
       lease_expires_at IS NOT NULL AND last_error = :solitary AS solitary
FROM outbox_message FORCE INDEX (outbox_message_claim_idx)
WHERE state = 'pending' AND held = false AND available_at <= {now} {filter}
ORDER BY priority DESC, available_at, seq
LIMIT :scan
FOR UPDATE SKIP LOCKED
"""
_RESOURCE_FILTER = """
  AND {resource} NOT IN :exclude
  AND (:only IS NULL OR {resource} = :only)"""

# Which of the keyed candidates have nothing earlier of their key in a blocking state: a plain
# read (the latest committed rows), probing outbox_message_key_state_idx (is_head).
_HEADS = """
SELECT m.seq FROM outbox_message AS m
WHERE m.seq IN :seqs AND {head}
"""

PARK = "UPDATE outbox_message SET held = true WHERE seq IN :seqs"

# Runs (see postgres._CLAIM), in two plain reads; the rows a run keeps are locked after them
# (_LOCK_FOLLOWERS). First, which of the heads chosen have anything of their key behind them in a
# blocking state ({trailed}: per state, one probe of outbox_message_key_state_idx, as is_head):
# most have nothing, and a branch of _FOLLOWERS costs its parse even when it finds nothing.
_TRAILED = """
SELECT m.seq FROM outbox_message AS m WHERE m.seq IN :seqs AND ({trailed})
"""
_TRAILS = """EXISTS (SELECT 1 FROM outbox_message AS e
                FORCE INDEX (outbox_message_key_state_idx)
                WHERE e.key = m.key AND e.state = {state} AND e.seq > m.seq)"""

# Then, behind each of those, the next :run rows of its key in a blocking state. MariaDB has no
# LATERAL and neither server takes a LIMIT in an IN subquery, hence a UNION of branches, two per
# head: its pending rows, a range of outbox_message_key_state_idx read in seq order and stopped
# at :run (one range over all the states would be a hot key's whole backlog, read and sorted),
# and its rows in the other blocking states (few, and never ready). RUN_HEADS heads a statement;
# {i} is the head's place in it, a number the statement is built with.
_FOLLOWER = """(SELECT {i} AS head, seq, {ok} AS ok
 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :key_{i} AND state IN ({states}) AND seq > :seq_{i}
 ORDER BY seq LIMIT :run)"""
_FOLLOWER_OK = "(lease_expires_at IS NULL AND available_at <= {now} {filter})"
RUN_HEADS = 100

# The rows the runs would take, locked where no other claim holds them. A row skipped (locked) or
# no longer ready since the plain read ends its run there: what comes after it stays behind it.
_LOCK_FOLLOWERS = """
SELECT seq FROM outbox_message
WHERE seq IN :seqs AND state = 'pending' AND lease_expires_at IS NULL AND available_at <= {now}
  {filter}
FOR UPDATE SKIP LOCKED
"""

# The chosen rows, locked since _CANDIDATES, and their runs, since _LOCK_FOLLOWERS (a run's rows
# are usually parked: held is cleared). :suspect and :stamp as in sqlite.CLAIM.
CLAIM = f"""
UPDATE outbox_message
SET state = 'in_flight',
    held = false,
    attempts = attempts + 1,
    lease_owner = :owner,
    lease_token = :token,
    lease_expires_at = {_plus("lease_seconds")},
    last_error = CASE WHEN :suspect THEN :stamp ELSE last_error END
WHERE seq IN :seqs
"""  # noqa: S608 - a time expression constant; every value is bound

# The next run of a chain (see postgres._CLAIM_RUN): the runs' statements behind row :after,
# unless an earlier message of its key in a blocking state is not in flight under :token: per
# state, one probe of outbox_message_key_state_idx ({other}, in flight: this lease's rows, a
# chain or two).
_RUN_KEY = "SELECT `key` FROM outbox_message WHERE seq = :after"
_RUN_OTHER = """(SELECT 1 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :of_key AND state = {state} AND seq <= :after {other} LIMIT 1)"""
_NOT_MINE = "AND NOT (lease_token <=> :token)"

CLAIMED = """
SELECT seq, id, exchange, routing_key, payload, content_type, headers, `key`,
       priority, attempts, max_attempts, available_at, created_at, traceparent,
       tracestate, :suspect AS suspect
FROM outbox_message WHERE seq IN :seqs
"""

# See postgres.py.
_HAS_READY = f"""
SELECT EXISTS (
    SELECT 1 FROM outbox_message
    WHERE state = 'pending' AND held = false AND available_at <= {NOW} AND {{resource}} = :only
)
"""  # noqa: S608

# ------------------------------------------------------------------------ settling

# The keyed rows about to be marked, locked, with their keys (read before MARK_PUBLISHED clears
# their lease): MARK_PUBLISHED then publishes exactly these.
KEYS_OF = """
SELECT seq, `key` FROM outbox_message
WHERE seq IN :seqs AND lease_token = :token AND state = 'in_flight' AND `key` IS NOT NULL
FOR UPDATE
"""

# Lease-guarded: see postgres.MARK_PUBLISHED.
MARK_PUBLISHED = f"""
UPDATE outbox_message
SET state = 'published', published_at = {NOW}, last_error = NULL,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq IN :seqs AND lease_token = :token AND state = 'in_flight'
"""  # noqa: S608

# Unparking, as postgres.MARK_PUBLISHED does, after MARK_PUBLISHED in the same transaction (the
# rows it published block nothing any more): for each key just published, its first pending
# message after the highest seq published (:lasts; the key is read from that row), one probe of
# outbox_message_key_state_idx, unparked when it is parked and a head ({head}: is_head). That is
# PostgreSQL's rule: when the key's next message in a blocking state is not that pending one but
# an earlier row (in flight, dead), the head check fails on that row; and a pending row is found
# by a probe of its own state, where one over every blocking state would read and sort the rest
# of a hot key's line. While a run is in flight nothing is unparked. The derived tables are
# materialised (the inner one is DISTINCT), which is what lets MySQL update the table they read.
UNPARK_NEXT = """
UPDATE outbox_message AS t
JOIN (
    SELECT n.seq FROM (
        SELECT DISTINCT d.`key`, (SELECT p.seq FROM outbox_message AS p
                                  FORCE INDEX (outbox_message_key_state_idx)
                                  WHERE p.key = d.key AND p.state = 'pending' AND p.seq > d.seq
                                  ORDER BY p.seq LIMIT 1) AS seq
        FROM outbox_message AS d
        WHERE d.seq IN :lasts
    ) AS n
    WHERE {head}
) AS u ON t.seq = u.seq
SET t.held = false
WHERE t.held AND t.state = 'pending'
"""

# See postgres.RELEASE.
RELEASE = f"""
UPDATE outbox_message
SET state = 'pending', available_at = {_plus("delay_seconds")},
    attempts = greatest(attempts - 1, 0),
    lease_expires_at = CASE WHEN last_error IN (:alone, :grouped) THEN {NOW} END,
    last_error = CASE WHEN last_error = :alone THEN :solitary ELSE :error END,
    lease_owner = NULL, lease_token = NULL
WHERE seq IN :seqs AND lease_token = :token AND state = 'in_flight'
"""  # noqa: S608

# See postgres.EXTEND_LEASES. :tokens are UUIDs as stored (32 hex digits).
EXTEND_LEASES = f"""
UPDATE outbox_message
SET lease_expires_at = {_plus("lease_seconds")}
WHERE lease_token IN :tokens AND state = 'in_flight'
"""  # noqa: S608

# Failed attempts (see postgres.SETTLE_FAILURES): the rows this lease still holds, locked, then
# SETTLE_ONE for each and one RECORD_ATTEMPT for them all.
HELD = """
SELECT seq, id, attempts FROM outbox_message
WHERE seq IN :seqs AND lease_token = :token AND state = 'in_flight'
FOR UPDATE
"""

SETTLE_ONE = f"""
UPDATE outbox_message
SET state = :state,
    available_at = coalesce(CAST(:available_at AS DATETIME(6)), available_at),
    attempts = attempts - :unburn,
    last_error = :error,
    last_failed_at = {NOW},
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq = :seq
"""  # noqa: S608

RECORD_ATTEMPT = f"""
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
VALUES (:message_id, :attempt, {NOW}, :relay_id, :failure_class, :outcome, :error, :next_at)
"""  # noqa: S608

# Taking leases back (relay/core/suspects.py decides what becomes of each row; postgres._RECLAIM
# says when). The rows, locked (SKIP LOCKED: two relays reclaiming at once take disjoint rows),
# with what the decision reads and the server's time, which the rest of the transaction binds as
# :now; then RECLAIM once per distinct change, and one RECORD_ATTEMPT for them all. {where}
# picks the rows: an expired lease, one token's (abandon), an earlier run's, dead relays'.
_RECLAIMABLE = f"""
SELECT seq, id, lease_owner, last_error, attempts, max_attempts, {NOW} AS now
FROM outbox_message
WHERE state = 'in_flight' AND {{where}}
FOR UPDATE SKIP LOCKED
"""  # noqa: S608 - constants; every value is bound
RECLAIMABLE_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "seq": BigInteger(),
    "id": UUID,
    "attempts": Integer(),
    "max_attempts": Integer(),
    "now": TIME,
}
# Only rows the read above locked, still in flight.
RECLAIM = f"""
UPDATE outbox_message
SET state = :state, attempts = :attempts, last_error = :last_error, last_failed_at = {NOW},
    lease_owner = NULL, lease_token = NULL  -- lease_expires_at stays: the suspect's mark
WHERE seq IN :seqs AND state = 'in_flight'
"""  # noqa: S608 - a time expression constant; every value is bound
_EXPIRED = f"lease_expires_at < {NOW}"
# See postgres.RECLAIM_DEAD: the dead relays are read, locked and deleted first, in the same
# transaction.
DEAD_RELAYS = f"""
SELECT relay_id FROM outbox_relay
WHERE last_seen < {_plus("dead_after_neg")} AND relay_id <> :relay_id
ORDER BY relay_id
FOR UPDATE
"""  # noqa: S608
FORGET_RELAYS = "DELETE FROM outbox_relay WHERE relay_id IN :relays"

# ------------------------------------------------------------------------ resources, relays

# Under the row lock (inside Dialect.transaction), with the server's time.
LOCK_RESOURCE = f"""
SELECT {common.RESOURCE_COLUMNS}, {NOW} AS now
FROM outbox_resource WHERE resource = :resource FOR UPDATE
"""  # noqa: S608

# ON DUPLICATE KEY UPDATE of nothing, not INSERT IGNORE: IGNORE would also cut a name longer than
# the column down to size, silently, and two such names would share one row.
ENSURE_RESOURCE = """
INSERT INTO outbox_resource (resource) VALUES (:resource)
ON DUPLICATE KEY UPDATE resource = resource
"""

HEARTBEAT = f"""
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, {NOW}, {NOW})
ON DUPLICATE KEY UPDATE last_seen = VALUES(last_seen)
"""  # noqa: S608

# See postgres.REGISTER_RELAY: the row, then its started_at read back (in one transaction).
REGISTER_RELAY = f"""
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, {NOW}, {NOW})
ON DUPLICATE KEY UPDATE started_at = VALUES(started_at), last_seen = VALUES(last_seen)
"""  # noqa: S608
STARTED_AT = "SELECT started_at FROM outbox_relay WHERE relay_id = :relay_id"
BEAT = common.BEAT.format(now=NOW)

RELAYS = f"""
SELECT relay_id, started_at, last_seen FROM outbox_relay
WHERE last_seen > TIMESTAMPADD(MICROSECOND, -ROUND(:within * 1000000), {NOW})
ORDER BY relay_id
"""  # noqa: S608

# See postgres.PENDING_SUMMARY; the age in seconds, to the microsecond.
PENDING_SUMMARY = f"""
SELECT coalesce(sum(available_at <= {NOW}), 0),
       coalesce(sum(available_at > {NOW}), 0),
       TIMESTAMPDIFF(MICROSECOND,
                     min(CASE WHEN available_at <= {NOW} THEN available_at END), {NOW}) / 1e6
FROM outbox_message
WHERE state = 'pending'
"""  # noqa: S608

# See postgres.sql's unpark_sweep: the same heads (is_head), through a materialised derived table
# (see UNPARK_NEXT).
_UNPARK_SWEEP = """
UPDATE outbox_message AS t
JOIN (
    SELECT f.seq FROM (
        SELECT `key`, min(seq) AS seq FROM outbox_message
        WHERE state = 'pending' AND held AND `key` IS NOT NULL
        GROUP BY `key`
    ) AS f
    WHERE {head}
) AS u ON t.seq = u.seq
SET t.held = false
"""

# ------------------------------------------------------------------------ the console's charts

# See common.py. A time's minute as text, in the form SQLite's is ('YYYY-MM-DD HH:MM', UTC).
_MINUTE = "DATE_FORMAT({column}, '%Y-%m-%d %H:%i')"
PUBLISHED_PER_MINUTE = common.PUBLISHED_PER_MINUTE.format(
    minute=_MINUTE.format(column="published_at")
)
FAILED_PER_MINUTE = common.FAILED_PER_MINUTE.format(minute=_MINUTE.format(column="at"))

# ------------------------------------------------------------------------ retention

# See postgres.py; greatest() is NULL if any argument is, hence the coalesce.
_ELIGIBLE = common.ELIGIBLE.format(
    state_in="state IN :states",
    failed_at="greatest(created_at, coalesce(last_failed_at, created_at), "
    "coalesce(replayed_at, created_at))",
)

# A batch: the rows, locked (SKIP LOCKED as on PostgreSQL: a row an operator is replaying, or
# another purge has, is passed over), then both DELETEs, in one transaction. The locking read
# sees the latest committed rows (READ COMMITTED), so a row replayed to pending is not taken.
DOOMED = f"""
SELECT seq, id FROM outbox_message
WHERE {_ELIGIBLE}
ORDER BY id
LIMIT :batch_size
FOR UPDATE SKIP LOCKED
"""  # noqa: S608
PURGE_MESSAGES = "DELETE FROM outbox_message WHERE seq IN :seqs"
PURGE_ATTEMPTS = "DELETE FROM outbox_attempt WHERE message_id IN :ids"

COUNT_ELIGIBLE = f"SELECT count(*) FROM outbox_message WHERE {_ELIGIBLE}"  # noqa: S608

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

    def _prepare(self, *, blocking: str, resource: str) -> Statements:
        def sql(text: str, columns: Mapping[str, Any] | None = None) -> Any:
            return compile_sql(text, columns, lists=LISTS)

        where = _RESOURCE_FILTER.format(resource=resource)
        self._candidates = sql(_CANDIDATES.format(now=NOW, filter=where))
        self._heads = sql(_HEADS.format(head=is_head("m", blocking=blocking)))
        self._park = sql(PARK)
        states = [state.strip() for state in blocking.split(",")]
        trailed = "\n    OR ".join(_TRAILS.format(state=state) for state in states)
        self._trailed = sql(_TRAILED.format(trailed=trailed))
        others = ", ".join(state for state in states if state != "'pending'")
        self._branches = [  # per head: its pending rows, which may be ready; the others
            ("'pending'", _FOLLOWER_OK.format(now=NOW, filter=where)),
            *([(others, "false")] if others else []),
        ]
        self._followers: dict[int, Compiled] = {}  # by how many heads: built when first needed
        self._lock_followers = sql(_LOCK_FOLLOWERS.format(now=NOW, filter=where))
        self._claim = sql(CLAIM)
        self._claimed = sql(CLAIMED, CLAIMED_COLUMNS)
        self._run_key = sql(_RUN_KEY)
        self._run_other = sql(
            "\nUNION ALL\n".join(
                _RUN_OTHER.format(state=state, other=_NOT_MINE if state == "'in_flight'" else "")
                for state in states
            )
        )
        self._keys_of = sql(KEYS_OF)
        self._mark = sql(MARK_PUBLISHED)
        self._unpark_next = sql(UNPARK_NEXT.format(head=is_head("n", blocking=blocking)))
        self._held = sql(HELD, {"seq": BigInteger(), "id": UUID, "attempts": Integer()})
        self._settle_one = sql(SETTLE_ONE)
        self._record_attempt = sql(RECORD_ATTEMPT)

        def reclaimable(where: str) -> Compiled:
            return compile_sql(_RECLAIMABLE.format(where=where), RECLAIMABLE_COLUMNS, lists=LISTS)

        self._reclaimable = reclaimable(_EXPIRED)
        self._abandonable = reclaimable("lease_token = :token")
        self._owned = reclaimable("lease_owner = :relay_id")
        self._of_dead = reclaimable("lease_owner IN :relays")
        self._reclaim = sql(RECLAIM)
        self._dead_relays = sql(DEAD_RELAYS)
        self._forget_relays = sql(FORGET_RELAYS)
        self._register = sql(REGISTER_RELAY)
        self._started_at = sql(STARTED_AT, {"started_at": TIME})
        self._beat = sql(BEAT)
        self._doomed = sql(DOOMED)
        self._purge_messages = sql(PURGE_MESSAGES)
        self._purge_attempts = sql(PURGE_ATTEMPTS)
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
            ensure_resource=ENSURE_RESOURCE,
            unpark_sweep=_UNPARK_SWEEP.format(head=is_head("f", blocking=blocking)),
            lists=LISTS,
        )

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

    def bind_list(self, values: Iterable[Any]) -> list[Any]:
        return [v.hex if isinstance(v, uuid.UUID) else v for v in values]

    def claim(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            candidates = conn.execute(self._candidates, params).all()
            keyed = [seq for seq, key, _, _ in candidates if key is not None]
            heads = set(conn.execute(self._heads, {"seqs": keyed}).scalars()) if keyed else set()
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
                conn.execute(self._park, {"seqs": parked})
            if not choice.chosen:
                return []
            seqs = [*choice.seqs, *run]
            claim = {**params, "seqs": seqs, "suspect": choice.suspects, "stamp": choice.stamp}
            conn.execute(self._claim, claim)
            return conn.execute(self._claimed, claim).all()

    def claim_run(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        with self.transaction(conn):
            key = conn.execute(self._run_key, params).scalar_one_or_none()
            if key is None:
                return []
            if conn.execute(self._run_other, {**params, "of_key": key}).first() is not None:
                return []
            run = self._runs(conn, params, [(params["after"], key)])
            if not run:
                return []
            claim = {**params, "seqs": run, "suspect": False, "stamp": params["grouped"]}
            conn.execute(self._claim, claim)
            return conn.execute(self._claimed, claim).all()

    def _runs(
        self, conn: Connection, params: Mapping[str, Any], heads: Sequence[tuple[int, str]]
    ) -> list[int]:
        """The rows of the runs behind `heads` ((seq, key), in claim order), locked."""
        if not heads or params["run"] <= 0 or params["follow"] <= 0:
            return []
        trailed = set(conn.execute(self._trailed, {"seqs": [seq for seq, _ in heads]}).scalars())
        if not trailed:
            return []
        lines = self._lines(conn, params, [(seq, key) for seq, key in heads if seq in trailed])
        wanted = _wanted(lines, params["follow"])
        seqs = [seq for line in wanted for seq in line]
        if not seqs:
            return []
        locked = set(conn.execute(self._lock_followers, {**params, "seqs": seqs}).scalars())
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
            for i, seq, ok in conn.execute(self._followers_of(len(chunk)), binds):
                lines[start + i].append((seq, bool(ok)))
            # Each branch is in seq order: merged, the first :run of each head's.
            for line in lines[start : start + RUN_HEADS]:
                line[:] = sorted(line)[: params["run"]]
                read += len(line)
        return lines

    def _followers_of(self, heads: int) -> Compiled:
        """_FOLLOWER's branches for `heads` heads, compiled once per number of heads."""
        found = self._followers.get(heads)
        if found is None:
            branches = [
                _FOLLOWER.format(i=i, states=states, ok=ok)
                for i in range(heads)
                for states, ok in self._branches
            ]
            found = compile_sql("\nUNION ALL\n".join(branches), lists=LISTS)
            self._followers[heads] = found
        return found

    def mark_published(self, conn: Connection, params: dict[str, Any]) -> int:
        with self.transaction(conn):
            lasts: dict[str, int] = {}  # per key, the highest seq about to be published
            for seq, key in conn.execute(self._keys_of, params):
                lasts[key] = max(seq, lasts.get(key, seq))
            marked = conn.execute(self._mark, params).rowcount
            if lasts:
                conn.execute(self._unpark_next, {"lasts": list(lasts.values())})
        return int(marked)

    def settle_failures(
        self, conn: Connection, settlements: Sequence[Mapping[str, Any]], params: dict[str, Any]
    ) -> int:
        by_seq = {s["seq"]: s for s in settlements}
        with self.transaction(conn):
            held = conn.execute(self._held, {**params, "seqs": list(by_seq)}).all()
            records = []
            for seq, message_id, attempts in held:  # the others' lease was lost
                s = by_seq[seq]
                conn.execute(self._settle_one, {**params, **s})
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
                conn.execute(self._record_attempt, records)
        return len(held)

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
            p = {**params, "dead_after_neg": -params["dead_after"]}
            dead = list(conn.execute(self._dead_relays, p).scalars())
            if not dead:
                return [], 0
            conn.execute(self._forget_relays, {"relays": dead})

            def why(owner: str | None) -> str:
                return suspects.dead_relay(owner, params["dead_after"])

            return dead, self._reclaim_rows(conn, {**p, "relays": dead}, self._of_dead, why)

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
            conn.execute(self._reclaim, {**p, **change, "seqs": seqs})
        records = [common.reclaim_attempt(r.id, reclaimed[r.seq].record, p) for r in rows]
        conn.execute(self._record_attempt, records)
        return len(rows)

    def register_relay(self, conn: Connection, params: dict[str, Any]) -> dt.datetime:
        with self.transaction(conn):
            conn.execute(self._register, params)
            started: dt.datetime = conn.execute(self._started_at, params).scalar_one()
        return started

    def beat(self, conn: Connection, params: dict[str, Any]) -> bool:
        # Matched rows, not changed ones: SQLAlchemy connects with CLIENT_FOUND_ROWS.
        return int(conn.execute(self._beat, params).rowcount) == 1

    def purge_batch(self, conn: Connection, params: dict[str, Any]) -> tuple[int, uuid.UUID | None]:
        with self.transaction(conn):
            doomed = conn.execute(self._doomed, params).all()
            if not doomed:
                return 0, None
            ids = [str(i) for _, i in doomed]
            conn.execute(self._purge_messages, {"seqs": [seq for seq, _ in doomed]})
            conn.execute(self._purge_attempts, {"ids": ids})
        return len(ids), uuid.UUID(max(ids))


class Mariadb(Mysql):
    """The same statements: SQLAlchemy names a mariadb:// URL's dialect apart."""

    name = "mariadb"


def _wanted(lines: Sequence[Sequence[tuple[int, bool]]], follow: int) -> list[list[int]]:
    """Per head, its run as read: the prefix of its line that is ready, cut where the lines'
    rows, numbered in the heads' claim order, pass :follow (as postgres._CLAIM numbers them)."""
    wanted: list[list[int]] = []
    before = 0  # rows of the lines before this one, ready or not
    for line in lines:
        ready = [seq for seq, _ in takewhile(lambda row: row[1], line)]
        wanted.append(ready[: max(0, follow - before)])
        before += len(line)
    return wanted
