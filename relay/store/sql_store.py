"""The relay's store: one SqlStore that runs its database's Dialect and turns rows into values.

Driver errors are translated here and nowhere else (`translated`; SqlStore and command_engine run
behind it): into DatabaseUnavailable when waiting may help, SchemaNotFound when the tables are
missing.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from outbox.dberrors import sqlstate_of
from outbox.encoding import load_stored_json
from outbox.migrate import current_version, inspect_schema
from outbox.schema import is_missing_table
from outbox.shape import Shape
from relay.core.bucket import Bucket
from relay.core.circuit import Circuit, CircuitState
from relay.core.policy import Dead, Retry
from relay.core.retention import RetentionPolicy
from relay.errors import DatabaseUnavailable, PermissionDenied, RelayError, SchemaNotFound
from relay.ports import Claimed, ResourceRow, RetentionFailed, StateCounts, T
from relay.store import counting, retention
from relay.store.common import ALONE, GROUPED, SOLITARY
from relay.store.databases import DIALECTS, database_url, dialect_for, driver_arguments

ERROR_MAX = 2000  # characters of error text kept per attempt

# The texts that mark a suspect's isolation (common.GROUPED), bound into the statements that claim,
# give back and reclaim rows.
SUSPECT_STAMPS = {"alone": ALONE, "grouped": GROUPED, "solitary": SOLITARY}

log = logging.getLogger("relay.store")


def database_clock() -> dt.datetime | None:
    """No time of our own: every statement uses the database's clock (see dialect.py)."""
    return None


def _app_now() -> dt.datetime:
    """The application's clock, for databases where enqueue writes it (Dialect.app_clock)."""
    return dt.datetime.now(dt.UTC)


def _utc(value: dt.datetime) -> dt.datetime:
    # SQLite hands back naive datetimes; everything this project writes is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _claimed(rows: Sequence[Sequence[Any]]) -> list[Claimed]:
    """Claimed rows, by position (CLAIMED_COLUMNS' order): the hot path, hundreds a claim."""
    return [
        Claimed(
            seq=r[0],
            id=r[1],
            exchange=r[2],
            routing_key=r[3],
            payload=r[4],  # as stored: the wire checks its type, per row
            content_type=r[5],
            headers=r[6],
            key=r[7],
            priority=r[8],
            attempts=r[9],
            max_attempts=r[10],
            available_at=_utc(r[11]),
            created_at=_utc(r[12]),
            traceparent=r[13],
            tracestate=r[14],
            suspect=bool(r[15]),
        )
        for r in rows
    ]


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
            # Runs: up to `run` more messages behind each keyed head, `limit` at most in all.
            "run": max(0, run),
            "follow": limit if run > 0 else 0,
            **SUSPECT_STAMPS,
            "now": self._clock(),
        }
        with self._conn() as conn:
            rows = self.dialect.claim(conn, params)
        claimed = _claimed(rows)
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
            **SUSPECT_STAMPS,
            "now": self._clock(),
        }
        with self._conn() as conn:
            rows = self.dialect.claim_run(conn, params)
        return sorted(_claimed(rows), key=lambda c: c.seq)

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
            **SUSPECT_STAMPS,
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

    def reclaim_expired(self, *, relay_id: str = "", max_attempts: int = 10) -> int:
        params = {
            "relay_id": relay_id,
            "max_attempts": max_attempts,
            **SUSPECT_STAMPS,
            "now": self._clock(),
        }
        with self._conn() as conn:
            return self.dialect.reclaim_expired(conn, params)

    def reclaim_owner(self, relay_id: str, *, max_attempts: int = 10) -> int:
        params = {
            "relay_id": relay_id,
            "max_attempts": max_attempts,
            **SUSPECT_STAMPS,
            "now": self._clock(),
        }
        with self._conn() as conn:
            return self.dialect.reclaim_owner(conn, params)

    def reclaim_dead(
        self, *, relay_id: str, dead_after: float, max_attempts: int = 10
    ) -> tuple[list[str], int]:
        params = {
            "relay_id": relay_id,
            "dead_after": dead_after,
            "max_attempts": max_attempts,
            **SUSPECT_STAMPS,
            "now": self._clock(),
        }
        with self._conn() as conn:
            return self.dialect.reclaim_dead(conn, params)

    def abandon(
        self, token: uuid.UUID, *, error: str, relay_id: str = "", max_attempts: int = 10
    ) -> int:
        params = {
            "token": token,
            "error": error[:ERROR_MAX],
            "relay_id": relay_id,
            "max_attempts": max_attempts,
            **SUSPECT_STAMPS,
            "now": self._clock(),
        }
        with self._conn() as conn:
            return self.dialect.abandon(conn, params)

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
                row, result = change(_resource_row(found), _utc(found.now))
                conn.execute(self._sql.update_resource, _resource_params(row))
        return result

    # ----------------------------------------------------------------- relays, retention, status

    def heartbeat(self, relay_id: str) -> None:
        with self._conn() as conn:
            conn.execute(self._sql.heartbeat, {"relay_id": relay_id, "now": self._clock()})

    def register_relay(self, relay_id: str) -> dt.datetime:
        with self._conn() as conn:
            return _utc(
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
            return [(r.relay_id, _utc(r.started_at), _utc(r.last_seen)) for r in found]

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
            raise RetentionFailed(_first_line(exc)) from exc

    def counts(self) -> StateCounts:
        """Messages by state: exact through the partial indexes, published and cancelled
        estimated beside a large table (relay/store/counting.py)."""
        with self._side_conn() as conn:
            return counting.state_counts(self.dialect, conn, self._clock())

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
        with self._side_conn() as conn:
            conn.execute(self._sql.ping)

    def close(self) -> None:
        self.engine.dispose()
        if self._side is not None:
            self._side.dispose()


def _maybe_utc(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else _utc(value)


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


# --------------------------------------------------------------------------- the error boundary


def translate_db_error(engine: Engine, exc: DBAPIError) -> RelayError | None:
    """The relay's error for a driver error, or None when it should propagate as it is.

    Transient errors (connection lost or refused, server starting or shutting down, serialization
    failure, deadlock; each dialect says which, PostgreSQL by SQLSTATE, never by message text)
    become DatabaseUnavailable, which the relay loop waits out and retries; anything else is a
    bug or a broken schema and propagates.
    """
    if is_missing_table(exc):
        return SchemaNotFound(
            "the outbox tables do not exist in this database: run `outbox-relay migrate`"
        )
    if sqlstate_of(exc.orig) == "42501":  # insufficient_privilege
        # A role without a grant it needs (relay/store/grants.py); the CLI names which.
        return PermissionDenied(_first_line(exc))
    if DIALECTS[engine.dialect.name].is_transient(exc) or exc.connection_invalidated:
        return DatabaseUnavailable(_describe(engine, exc))
    return None


@contextmanager
def translated(engine: Engine) -> Iterator[None]:
    """Run a block against `engine` with its driver errors translated (translate_db_error)."""
    try:
        yield
    except DBAPIError as exc:
        relay_error = translate_db_error(engine, exc)
        if relay_error is not None:
            raise relay_error from exc
        raise
    except PoolTimeout as exc:
        # Every pooled connection busy past the pool's timeout: the database is slow, not the
        # statement wrong; the loop waits and retries as for an outage.
        where = engine.url.render_as_string(hide_password=True)
        raise DatabaseUnavailable(f"database {where}: no free connection ({exc})") from exc


def _first_line(exc: SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _describe(engine: Engine, exc: DBAPIError) -> str:
    first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    sqlstate = sqlstate_of(exc.orig)
    what = "is not reachable" if sqlstate is None or sqlstate.startswith("08") else "failed"
    return f"database {engine.url.render_as_string(hide_password=True)} {what}: {first}"


# --------------------------------------------------------------------------- opening one


# Budgets, in seconds. The loop's statements are single-row or batched index scans that take
# milliseconds: one still running after STATEMENT_TIMEOUT is stuck (a lock, an overloaded server)
# and is better cancelled and retried. A pooled connection not free within POOL_TIMEOUT means
# the same. The probes and gauges get their own, smaller budget (SIDE_*).
STATEMENT_TIMEOUT = 30.0
POOL_TIMEOUT = 10.0
SIDE_STATEMENT_TIMEOUT = 10.0
SIDE_POOL_TIMEOUT = 2.0


def make_engine(
    db_url: str,
    *,
    autocommit: bool = True,
    pool_size: int = 3,
    statement_timeout: float | None = None,
    pool_timeout: float = 30.0,
    relaxed_commit: bool = False,
) -> Engine:
    """An engine configured for the relay (autocommit: every statement is its own transaction).
    `statement_timeout` (seconds; None: none) cancels a statement that runs longer, where the
    database can (PostgreSQL); `pool_timeout` bounds the wait for a pooled connection."""
    url, driver_args = driver_arguments(database_url(db_url))
    dialect = DIALECTS[url.get_backend_name()]
    options = dialect.engine_options(
        pool_size=pool_size, statement_timeout=statement_timeout, pool_timeout=pool_timeout
    )
    if driver_args:
        options["connect_args"] = {**options.get("connect_args", {}), **driver_args}
    if autocommit:
        options["isolation_level"] = "AUTOCOMMIT"
    # A row's undecodable JSON becomes a value the wire refuses, not an error failing the claim.
    engine = create_engine(url, json_deserializer=load_stored_json, **options)
    timeout_sql = dialect.statement_timeout if statement_timeout is not None else None
    relaxed_sql = dialect.relaxed_commit if relaxed_commit else None
    # The loop's statements prepared on the server, on a direct connection only, unless the URL
    # says otherwise (Dialect.prepare_direct).
    prepare = dialect.prepare_direct if relaxed_commit and not driver_args else None
    if dialect.on_connect or timeout_sql or relaxed_sql:
        ms = str(max(1, round((statement_timeout or 0) * 1000)))

        def session_settings(dbapi_conn: Any, _record: Any) -> None:
            server_timeout = dialect.pooled(dbapi_conn)
            if server_timeout is not None:
                # A session setting would stay on the server connection for whichever client
                # the pooler lends it to next, and the relay's next transaction would run on
                # another: none is made (the server's own settings, per role, still apply).
                _say_pooled(url, server_timeout)
                if not dbapi_conn.autocommit:
                    dbapi_conn.rollback()  # an open transaction would pin a server connection
                return
            cursor = dbapi_conn.cursor()
            for statement in dialect.on_connect:
                cursor.execute(statement)
            if timeout_sql:
                cursor.execute(dialect.timeout_sql(dbapi_conn) or timeout_sql, (ms,))
            if relaxed_sql:
                cursor.execute(relaxed_sql)
            if prepare is not None:
                dbapi_conn.prepare_threshold = prepare
            cursor.close()

        event.listen(engine, "connect", session_settings)
    return engine


_said_pooled: set[str] = set()  # databases whose pooler was reported (once per process each)


def _say_pooled(url: URL, server_timeout: str) -> None:
    where = url.render_as_string(hide_password=True)
    if where in _said_pooled:
        return
    _said_pooled.add(where)
    fields = {"db": where, "session_settings": "none", "statement_timeout": server_timeout}
    if server_timeout == "0":
        hint = "no statement timeout: set one on the relay's role (ALTER ROLE ... SET)"
        log.warning("database.pooled", extra={**fields, "hint": hint})
    else:
        log.info("database.pooled", extra=fields)


@contextmanager
def command_engine(db_url: str) -> Iterator[Engine]:
    """An engine for one operator command (its transactions as the command opens them), with
    driver errors translated as the store's are; disposed at the end."""
    engine = make_engine(db_url, autocommit=False, pool_size=1)
    try:
        with translated(engine):
            yield engine
    finally:
        engine.dispose()


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
