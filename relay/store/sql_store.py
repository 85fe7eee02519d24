"""The relay's store: one SqlStore that runs its database's Dialect and turns rows into values,
and open_store, which builds one.

Every statement runs behind boundary.translated, the one place driver errors become the relay's.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from outbox.migrate import current_version, inspect_schema
from outbox.shape import Shape
from relay.core import suspects
from relay.core.bucket import Bucket
from relay.core.circuit import Circuit, CircuitState
from relay.core.policy import Dead, Retry
from relay.core.retention import RetentionPolicy
from relay.errors import DatabaseUnavailable, PermissionDenied
from relay.ports import Claimed, FdWait, ResourceRow, RetentionFailed, StateCounts, T, TableHealth
from relay.store import counting, rescuer, retention
from relay.store.boundary import first_line, translated
from relay.store.databases import dialect_for, shown
from relay.store.dialect import utc
from relay.store.engines import (
    POOL_TIMEOUT,
    SIDE_POOL_TIMEOUT,
    SIDE_STATEMENT_TIMEOUT,
    STATEMENT_TIMEOUT,
    make_engine,
)
from relay.store.overlap import waiting_with

ERROR_MAX = 2000  # characters of error text kept per attempt

# The texts relays of schema 6 read in last_error instead of the suspect column
# (relay/core/suspects.py), bound into the claim (set on suspects) and release (kept on one to be
# claimed alone).
CLAIM_STAMPS = {"alone": suspects.ALONE, "grouped": suspects.GROUPED}
RELEASE_STAMPS = {"solitary": suspects.SOLITARY}

log = logging.getLogger("relay.store")


def database_clock() -> dt.datetime | None:
    """No time of our own: every statement uses the database's clock (see dialect.py)."""
    return None


def _app_now() -> dt.datetime:
    """The application's clock, for databases where enqueue writes it (Dialect.app_clock)."""
    return dt.datetime.now(dt.UTC)


class SqlStore:
    """The relay's store on a SQLAlchemy engine (any database in databases.DIALECTS).

    `clock` is the time bound as `:now` into every statement; None (the default) means the
    database's own clock. Tests pass a frozen one. `side_engine`, when given, serves ping and
    counts (health probes, gauges) from a pool of its own.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], dt.datetime | None] = database_clock,
        hold_dead_keys: bool = True,
        scope: str = "exchange",
        side_engine: Engine | None = None,
    ) -> None:
        # hold_dead_keys: a dead message holds the rest of its key (the config's dead_key "hold").
        self.engine = engine
        self.dialect = dialect_for(engine.dialect.name, hold=hold_dead_keys, scope=scope)
        self._sql = self.dialect.sql
        if clock is database_clock and self.dialect.app_clock:
            clock = _app_now
        self._clock = clock
        self._side = side_engine

    @contextmanager
    def _conn(self) -> Iterator[Connection]:
        with translated(self.engine), self.engine.connect() as conn:
            yield conn

    @contextmanager
    def _side_conn(self) -> Iterator[Connection]:
        """A connection for the probes and gauges (ping, counts): their own small pool, so a
        slow /readyz or a gauge scrape never takes a connection the loop is waiting for."""
        side = self._side or self.engine
        with translated(side), side.connect() as conn:
            yield conn

    # ----------------------------------------------------------------- claiming and settling

    def claim(
        self,
        *,
        owner: str,
        token: uuid.UUID,
        limit: int,
        lease_seconds: float,
        exclude: Sequence[str] = (),
        only: str | None = None,
        suspect_group: int = 1,
        run: int = 0,
        follow: int | None = None,
    ) -> list[Claimed]:
        params: dict[str, Any] = {
            "owner": owner,
            "token": token,
            "limit": limit,
            # Keyed candidates looked at per claim: heads are leased, the rest parked for good.
            "scan": limit * 2,
            "lease_seconds": lease_seconds,
            "exclude": self.dialect.bind_list(exclude),
            "only": only,
            "group": max(1, suspect_group),
            # Runs: up to `run` more messages behind each keyed head, `follow` at most in all.
            "run": max(0, run),
            "follow": max(0, limit if follow is None else follow) if run > 0 else 0,
            **CLAIM_STAMPS,
            "now": self._clock(),
        }
        with self._conn() as conn:
            rows = self.dialect.claim(conn, params)
        claimed = self.dialect.claimed(rows)
        # RETURNING order is unspecified; publish in claim order so priority and enqueue order
        # hold within a batch too.
        claimed.sort(key=lambda c: (-c.priority, c.available_at, c.seq))
        return claimed

    def claim_run(
        self,
        *,
        owner: str,
        token: uuid.UUID,
        after: int,
        limit: int,
        lease_seconds: float,
        exclude: Sequence[str] = (),
    ) -> list[Claimed]:
        if limit <= 0:
            return []
        params: dict[str, Any] = {
            "owner": owner,
            "token": token,
            "after": after,
            "run": limit,
            "follow": limit,
            "lease_seconds": lease_seconds,
            "exclude": self.dialect.bind_list(exclude),
            "only": None,
            "now": self._clock(),
        }
        with self._conn() as conn:
            rows = self.dialect.claim_run(conn, params)
        return sorted(self.dialect.claimed(rows), key=lambda c: c.seq)

    def has_ready(self, part: str) -> bool:
        with self._conn() as conn:
            found = conn.execute(self._sql.has_ready, {"only": part, "now": self._clock()})
            return bool(found.scalar_one())

    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int:
        if not seqs:
            return 0
        params = {"token": token, "seqs": self.dialect.bind_list(seqs), "now": self._clock()}
        with self._conn() as conn:
            return self.dialect.mark_published(conn, params)

    def release(
        self, token: uuid.UUID, seqs: Sequence[int], *, delay_seconds: float, error: str
    ) -> int:
        if not seqs:
            return 0
        params = {
            "token": token,
            "seqs": self.dialect.bind_list(seqs),
            "delay_seconds": delay_seconds,
            "error": error,
            **RELEASE_STAMPS,
            "now": self._clock(),
        }
        with self._conn() as conn:
            return conn.execute(self._sql.release, params).rowcount

    def extend_leases(self, tokens: Sequence[uuid.UUID], lease_seconds: float) -> int:
        if not tokens:
            return 0
        params = {
            "tokens": self.dialect.bind_list(tokens),
            "lease_seconds": lease_seconds,
            "now": self._clock(),
        }
        with self._conn() as conn:
            return conn.execute(self._sql.extend_leases, params).rowcount

    def settle_failures(
        self, token: uuid.UUID, decisions: Sequence[Retry | Dead], *, relay_id: str
    ) -> int:
        """Apply failure decisions (lease-guarded) and record one attempt row per changed row."""
        if not decisions:
            return 0
        settlements = [_settlement(d) for d in decisions]
        params = {"token": token, "relay_id": relay_id, "now": self._clock()}
        with self._conn() as conn:
            return self.dialect.settle_failures(conn, settlements, params)

    # Taking leases back: the same on every database (relay/store/rescuer.py).

    def reclaim_expired(self, *, relay_id: str = "", max_attempts: int = 10) -> int:
        params = {"relay_id": relay_id, "max_attempts": max_attempts, "now": self._clock()}
        with self._conn() as conn:
            return rescuer.reclaim(
                self.dialect, conn, self._sql.stuck_expired, params, suspects.expired
            )

    def reclaim_owner(self, relay_id: str, *, max_attempts: int = 10) -> int:
        params = {
            "relay_id": relay_id,  # the relay restarting records it
            "owner": relay_id,
            "max_attempts": max_attempts,
            "now": self._clock(),
        }
        why = suspects.earlier_run(relay_id)
        with self._conn() as conn:
            return rescuer.reclaim(self.dialect, conn, self._sql.stuck_owned, params, lambda _: why)

    def reclaim_strays(
        self, relay_id: str, held: Collection[tuple[uuid.UUID, int]], *, max_attempts: int = 10
    ) -> int:
        params = {
            "relay_id": relay_id,
            "owner": relay_id,
            "max_attempts": max_attempts,
            "now": self._clock(),
        }
        why = suspects.stray(relay_id)
        with self._conn() as conn:
            return rescuer.reclaim(
                self.dialect, conn, self._sql.stuck_owned, params, lambda _: why, keep=set(held)
            )

    def reclaim_dead(
        self, *, relay_id: str, dead_after: float, max_attempts: int = 10
    ) -> tuple[list[str], int]:
        params = {
            "relay_id": relay_id,
            "dead_after": dead_after,
            "max_attempts": max_attempts,
            "now": self._clock(),
        }
        with self._conn() as conn:
            return rescuer.reclaim_dead(self.dialect, conn, params)

    def abandon(
        self, token: uuid.UUID, *, error: str, relay_id: str = "", max_attempts: int = 10
    ) -> int:
        params = {
            "token": token,
            "relay_id": relay_id,
            "max_attempts": max_attempts,
            "now": self._clock(),
        }
        why = error[:ERROR_MAX]
        with self._conn() as conn:
            return rescuer.reclaim(
                self.dialect, conn, self._sql.stuck_abandoned, params, lambda _: why
            )

    def unpark_sweep(self) -> int:
        """Unpark the next message of every key that nothing blocks any more."""
        with self._conn() as conn:
            return conn.execute(self._sql.unpark_sweep).rowcount

    # ----------------------------------------------------------------- resources

    def resources(self) -> list[ResourceRow]:
        with self._conn() as conn:
            return [_resource_row(r) for r in conn.execute(self._sql.resources)]

    def change_resource(
        self, resource: str, change: Callable[[ResourceRow, dt.datetime], tuple[ResourceRow, T]]
    ) -> T:
        with self._conn() as conn:
            conn.execute(self._sql.ensure_resource, {"resource": resource})
            with self.dialect.transaction(conn):
                found = conn.execute(
                    self._sql.lock_resource, {"resource": resource, "now": self._clock()}
                ).one()
                row, result = change(_resource_row(found), utc(found.now))
                conn.execute(self._sql.update_resource, _resource_params(row))
        return result

    # ----------------------------------------------------------------- relays, retention, status

    def heartbeat(self, relay_id: str) -> None:
        with self._conn() as conn:
            conn.execute(self._sql.heartbeat, {"relay_id": relay_id, "now": self._clock()})

    def register_relay(self, relay_id: str) -> dt.datetime:
        with self._conn() as conn:
            return utc(
                self.dialect.register_relay(conn, {"relay_id": relay_id, "now": self._clock()})
            )

    def beat(self, relay_id: str, started_at: dt.datetime) -> bool:
        params = {"relay_id": relay_id, "started_at": started_at, "now": self._clock()}
        with self._conn() as conn:
            return self.dialect.beat(conn, params)

    def forget_relay(self, relay_id: str) -> None:
        with self._conn() as conn:
            conn.execute(self._sql.forget_relay, {"relay_id": relay_id})

    def relays(self, within_seconds: float) -> list[tuple[str, dt.datetime, dt.datetime]]:
        """Relays whose heartbeat is more recent than `within_seconds`: (id, started, last seen)."""
        params = {"within": within_seconds, "now": self._clock()}
        with self._conn() as conn:
            found = conn.execute(self._sql.relays, params)
            return [(r.relay_id, utc(r.started_at), utc(r.last_seen)) for r in found]

    def purge_expired(self, policy: RetentionPolicy, now: dt.datetime) -> int:
        try:
            with translated(self.engine):
                return retention.run_retention_once(self.engine, policy, now)
        except DatabaseUnavailable:
            raise
        except PermissionDenied as exc:  # a relay role granted no DELETE: retention only stops
            raise RetentionFailed(str(exc)) from exc
        except SQLAlchemyError as exc:
            # Housekeeping only: whatever the database says (a lock timeout, a constraint, a
            # corrupt page on SQLite), it must not stop the relay. Said once, tried again later.
            raise RetentionFailed(first_line(exc)) from exc

    def counts(self) -> StateCounts:
        """Messages by state: exact through the partial indexes, published and cancelled
        estimated beside a large table (relay/store/counting.py)."""
        with self._side_conn() as conn:
            return counting.state_counts(self.dialect, conn, self._clock())

    def table_health(self) -> list[TableHealth]:
        """Autovacuum and dead rows of the relay's tables (Dialect.table_health), read through
        the side pool, as the gauges are."""
        with self._side_conn() as conn:
            return self.dialect.table_health(conn)

    def schema_version(self) -> int:
        """The outbox schema's version `migrate` recorded in this database (0: none)."""
        with self._conn() as conn:
            return current_version(conn)

    def schema_shape(self) -> Shape:
        """The outbox schema in this database against what this version needs (for a schema
        that recorded no version, such as one an Alembic migration made)."""
        with self._conn() as conn:
            return inspect_schema(conn)

    def ping(self) -> None:
        """The database answers and takes writes; DatabaseUnavailable otherwise."""
        with self._side_conn() as conn:
            read_only = conn.execute(self._sql.ping).scalar_one()
        if read_only:
            where = shown(self.engine.url)
            raise DatabaseUnavailable(f"database {where} is read-only (a standby): no primary")

    def while_waiting(self, wait: FdWait) -> AbstractContextManager[None]:
        """On the calling thread, wait for the database with `wait` (relay/store/overlap.py)."""
        return waiting_with(wait)

    def close(self) -> None:
        self.engine.dispose()
        if self._side is not None:
            self._side.dispose()


def _maybe_utc(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else utc(value)


def _resource_row(r: Any) -> ResourceRow:
    circuit = Circuit(
        resource=r.resource,
        state=CircuitState(r.state),
        failures=int(r.failures),
        opens=int(r.opens),
        open_until=_maybe_utc(r.open_until),
        probe_owner=r.probe_owner,
        probe_until=_maybe_utc(r.probe_until),
        last_error=r.last_error,
        changed_at=_maybe_utc(r.changed_at),
    )
    tokens = None if r.tokens is None else float(r.tokens)
    return ResourceRow(circuit, Bucket(tokens, _maybe_utc(r.tokens_at)))


def _resource_params(row: ResourceRow) -> dict[str, Any]:
    c = row.circuit
    return {
        "resource": c.resource,
        "state": c.state.value,
        "failures": c.failures,
        "opens": c.opens,
        "open_until": c.open_until,
        "probe_owner": c.probe_owner,
        "probe_until": c.probe_until,
        "last_error": None if c.last_error is None else c.last_error[:ERROR_MAX],
        "changed_at": c.changed_at,
        "tokens": row.bucket.tokens,
        "tokens_at": row.bucket.at,
    }


def _settlement(decision: Retry | Dead) -> dict[str, Any]:
    """A decision as the row values and attempt record every dialect's settle_failures takes."""
    if isinstance(decision, Dead):
        state, available_at, unburn, error = "dead", None, 0, decision.reason
    else:
        state, available_at, error = "pending", decision.at, decision.failure.detail
        unburn = 0 if decision.burn else 1  # the claim counted the attempt already
    return {
        "seq": decision.seq,
        "state": state,
        "available_at": available_at,
        "unburn": unburn,
        "failure_class": decision.failure.cls.value,
        "outcome": decision.kind,
        "error": error[:ERROR_MAX],
    }


def open_store(
    db_url: str,
    *,
    check: bool = True,
    hold_dead_keys: bool = True,
    scope: str = "exchange",
    clock: Callable[[], dt.datetime | None] = database_clock,
    statement_timeout: float = STATEMENT_TIMEOUT,
    relaxed_commit: bool = False,
) -> SqlStore:
    """Open the store at `db_url`; with `check`, fail now if the database is unreachable.
    `relaxed_commit`: the relay loop's store (Dialect.relaxed_commit)."""
    engine = make_engine(
        db_url,
        statement_timeout=statement_timeout,
        pool_timeout=POOL_TIMEOUT,
        relaxed_commit=relaxed_commit,
    )
    side = make_engine(
        db_url,
        pool_size=1,
        statement_timeout=min(statement_timeout, SIDE_STATEMENT_TIMEOUT),
        pool_timeout=SIDE_POOL_TIMEOUT,
    )
    store = SqlStore(
        engine, clock=clock, hold_dead_keys=hold_dead_keys, scope=scope, side_engine=side
    )
    if check:
        store.ping()
    return store
