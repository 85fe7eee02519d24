"""Runs the statements of `postgres_sql` / `sqlite_sql` and turns rows into plain values.

Driver errors are translated here and nowhere else.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Connection,
    DateTime,
    Engine,
    Float,
    Integer,
    LargeBinary,
    String,
    TextClause,
    TextualSelect,
    Uuid,
    bindparam,
    create_engine,
    event,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError, OperationalError

from outbox.dberrors import DbFailure, classify_db_error
from outbox.schema import is_missing_table
from relay.core.bucket import Bucket
from relay.core.circuit import Circuit, CircuitState
from relay.core.failures import FailureClass
from relay.core.policy import Dead, Retry
from relay.errors import DatabaseUnavailable, RelayError, SchemaNotFound
from relay.loop.maintenance import RetentionPolicy, run_retention_once
from relay.ports import Claimed, ResourceRow, StateCounts, T
from relay.runtime.config import parse_db_url, redact
from relay.store import postgres as postgres_sql
from relay.store import resource_sql
from relay.store import sqlite as sqlite_sql
from relay.store.sqlite_tx import sqlite_transaction

_Time = DateTime(timezone=True)
_CLAIM_COLUMNS: dict[str, Any] = {
    "seq": BigInteger(),
    "id": Uuid(),
    "exchange": String(),
    "routing_key": String(),
    "payload": LargeBinary(),
    "content_type": String(),
    "headers": JSON().with_variant(postgresql.JSON(), "postgresql"),
    "key": String(),
    "priority": Integer(),
    "attempts": Integer(),
    "max_attempts": Integer(),
    "available_at": _Time,
    "created_at": _Time,
    "traceparent": String(),
    "tracestate": String(),
}


def _utc(value: dt.datetime) -> dt.datetime:
    # SQLite hands back naive datetimes; everything this project writes is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


class SqlStore:
    """The relay's store on a SQLAlchemy engine (PostgreSQL or SQLite)."""

    def __init__(
        self,
        engine: Engine,
        *,
        now: Callable[[], dt.datetime] | None = None,
        dead_key: str = "hold",
        scope: str = "exchange",
    ) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._sql: ModuleType = postgres_sql if self.dialect == "postgresql" else sqlite_sql
        self._pg = self.dialect == "postgresql"
        # SQLite has no server clock worth the name; PostgreSQL's now() is the one clock every
        # relay shares, so it is used there.
        self._now = now or (lambda: dt.datetime.now(dt.UTC))
        if dead_key not in ("hold", "skip"):
            raise ValueError(f"dead_key must be 'hold' or 'skip', not {dead_key!r}")
        hold = dead_key == "hold"
        if scope not in resource_sql.SCOPES:
            raise ValueError(f"scope must be one of {sorted(resource_sql.SCOPES)}, not {scope!r}")
        part = resource_sql.SCOPES[scope]
        if self._pg:
            claim_sql = postgres_sql.claim(hold=hold, resource=part)
        else:
            claim_sql = sqlite_sql.CLAIM
            keyed = sqlite_sql.select_keyed(hold=hold, resource=part)
            self._select_unkeyed = self._stmt(sqlite_sql.select_unkeyed(resource=part), now=_Time)
            self._select_keyed = self._stmt(keyed, now=_Time)
            self._park = text(sqlite_sql.PARK)
            self._unpark_next = text(sqlite_sql.UNPARK_NEXT)
        self._has_ready = self._stmt(self._sql.has_ready(resource=part), now=_Time)
        self._claim = self._stmt(claim_sql, token=Uuid(), now=_Time, expires=_Time).columns(
            **_CLAIM_COLUMNS
        )
        self._unpark_sweep = text(
            self._sql.UNPARK_SWEEP_HOLD if hold else self._sql.UNPARK_SWEEP_SKIP
        )
        self._mark = self._stmt(self._sql.MARK_PUBLISHED, token=Uuid(), now=_Time)
        self._release = self._stmt(self._sql.RELEASE, token=Uuid(), available_at=_Time)
        if self._pg:
            self._settle_failures = self._stmt(self._sql.SETTLE_FAILURES, token=Uuid())
        else:
            self._settle_one = self._stmt(
                self._sql.SETTLE_ONE, token=Uuid(), now=_Time, available_at=_Time
            )
            self._insert_attempt = self._stmt(
                self._sql.INSERT_ATTEMPT, message_id=Uuid(), now=_Time, next_at=_Time
            )
        self._extend = self._stmt(self._sql.EXTEND_LEASES, expires=_Time)
        reclaim = self._stmt(self._sql.RECLAIM_EXPIRED, now=_Time)
        # SQLite returns the reclaimed rows (their attempt records are written from here).
        self._reclaim: TextClause | TextualSelect = (
            reclaim
            if self._pg
            else reclaim.columns(id=Uuid(), attempts=Integer(), last_error=String(), state=String())
        )
        self._resources = self._stmt(
            resource_sql.LIST, open_until=_Time, probe_until=_Time, changed_at=_Time
        ).columns(**_RESOURCE_COLUMNS)
        self._ensure_resource = text(
            resource_sql.ENSURE_PG if self._pg else resource_sql.ENSURE_SQLITE
        )
        lock_columns = dict(_RESOURCE_COLUMNS, now=_Time) if self._pg else _RESOURCE_COLUMNS
        self._lock_resource = text(
            resource_sql.LOCK_PG if self._pg else resource_sql.LOCK_SQLITE
        ).columns(**lock_columns)
        self._update_resource = self._stmt(
            resource_sql.UPDATE,
            open_until=_Time,
            probe_until=_Time,
            changed_at=_Time,
            tokens_at=_Time,
        )
        self._heartbeat = self._stmt(
            resource_sql.HEARTBEAT_PG if self._pg else resource_sql.HEARTBEAT_SQLITE, now=_Time
        )
        self._forget_relay = text(resource_sql.FORGET_RELAY)
        self._relays = self._stmt(
            resource_sql.RELAYS_PG if self._pg else resource_sql.RELAYS_SQLITE, since=_Time
        ).columns(relay_id=String(), started_at=_Time, last_seen=_Time)
        self._count_by_state = text(self._sql.COUNT_BY_STATE)
        self._pending = self._stmt(self._sql.PENDING_SUMMARY, now=_Time)

    def _stmt(self, sql: str, **types: Any) -> TextClause:
        clause = text(sql)
        wanted = [bindparam(name, type_=t) for name, t in types.items() if f":{name}" in sql]
        return clause.bindparams(*wanted) if wanted else clause

    @contextmanager
    def _conn(self) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                yield conn
        except DBAPIError as exc:
            translated = translate_db_error(self.engine, exc)
            if translated is not None:
                raise translated from exc
            raise

    def _seqs(self, seqs: Sequence[int]) -> Any:
        return list(seqs) if self._pg else json.dumps(list(seqs))

    def claim(
        self,
        *,
        owner: str,
        token: uuid.UUID,
        limit: int,
        lease_seconds: float,
        exclude: Sequence[str] = (),
        only: str | None = None,
    ) -> list[Claimed]:
        now = self._now()
        params: dict[str, Any] = {"owner": owner, "token": token, "limit": limit}
        # Keyed candidates scanned per claim: heads are leased, the rest parked for good.
        scan = limit * 2
        if self._pg:
            params.update(lease_seconds=lease_seconds, scan=scan, exclude=list(exclude), only=only)
            with self._conn() as conn:
                rows = conn.execute(self._claim, params).all()
        else:
            params.update(now=now, expires=now + dt.timedelta(seconds=lease_seconds))
            where = {"exclude": json.dumps(list(exclude)), "only": only, "now": now}
            with self._conn() as conn, sqlite_transaction(conn):
                window = {**where, "limit": limit}
                candidates = [tuple(r) for r in conn.execute(self._select_unkeyed, window)]
                parked: list[int] = []
                for seq, priority, available_at, head in conn.execute(
                    self._select_keyed, {**where, "scan": scan}
                ):
                    if head:
                        candidates.append((seq, priority, available_at))
                    else:
                        parked.append(seq)
                if parked:
                    conn.execute(self._park, {"seqs": json.dumps(parked)})
                # available_at is the stored text here, which sorts as time does.
                candidates.sort(key=lambda c: (-c[1], str(c[2]), c[0]))
                params["seqs"] = json.dumps([c[0] for c in candidates[:limit]])
                rows = conn.execute(self._claim, params).all()
        claimed = [
            Claimed(
                seq=r[0],
                id=r[1],
                exchange=r[2],
                routing_key=r[3],
                payload=bytes(r[4]),
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
            )
            for r in rows
        ]
        # RETURNING order is unspecified; publish in claim order so priority and enqueue order
        # hold within a batch too.
        claimed.sort(key=lambda c: (-c.priority, c.available_at, c.seq))
        return claimed

    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int:
        if not seqs:
            return 0
        params: dict[str, Any] = {"token": token, "seqs": self._seqs(seqs)}
        if self._pg:
            with self._conn() as conn:
                return int(conn.execute(self._mark, params).scalar_one())
        params["now"] = self._now()
        with self._conn() as conn, sqlite_transaction(conn):
            keys = [k for (k,) in conn.execute(self._mark, params)]  # one row per row marked
            keyed = sorted({k for k in keys if k is not None})
            if keyed:
                conn.execute(self._unpark_next, {"keys": json.dumps(keyed)})
        return len(keys)

    def unpark_sweep(self) -> int:
        """Unpark the next message of every key that nothing blocks any more."""
        with self._conn() as conn:
            return conn.execute(self._unpark_sweep).rowcount

    def release(
        self, token: uuid.UUID, seqs: Sequence[int], *, delay_seconds: float, error: str
    ) -> int:
        if not seqs:
            return 0
        params: dict[str, Any] = {"token": token, "seqs": self._seqs(seqs), "error": error}
        if self._pg:
            params["delay_seconds"] = delay_seconds
        else:
            params["available_at"] = self._now() + dt.timedelta(seconds=delay_seconds)
        with self._conn() as conn:
            return conn.execute(self._release, params).rowcount

    def extend_leases(self, tokens: Sequence[uuid.UUID], lease_seconds: float) -> int:
        if not tokens:
            return 0
        params: dict[str, Any]
        if self._pg:
            params = {"tokens": [str(t) for t in tokens], "lease_seconds": lease_seconds}
        else:
            params = {
                "tokens": json.dumps([t.hex for t in tokens]),
                "expires": self._now() + dt.timedelta(seconds=lease_seconds),
            }
        with self._conn() as conn:
            return conn.execute(self._extend, params).rowcount

    def settle_failures(
        self, token: uuid.UUID, decisions: Sequence[Retry | Dead], *, relay_id: str
    ) -> int:
        """Apply failure decisions (lease-guarded) and record one attempt row per changed row."""
        if not decisions:
            return 0
        rows = [_settlement(d) for d in decisions]
        if self._pg:
            params = {
                "token": token,
                "relay_id": relay_id,
                "seqs": [r["seq"] for r in rows],
                "states": [r["state"] for r in rows],
                "available_at": [r["available_at"] for r in rows],
                "unburn": [r["unburn"] for r in rows],
                "classes": [r["failure_class"] for r in rows],
                "outcomes": [r["outcome"] for r in rows],
                "errors": [r["error"] for r in rows],
            }
            with self._conn() as conn:
                return conn.execute(self._settle_failures, params).rowcount
        now = self._now()
        changed = 0
        with self._conn() as conn, sqlite_transaction(conn):
            for r in rows:
                hit = conn.execute(self._settle_one, {**r, "token": token, "now": now}).first()
                if hit is None:
                    continue  # the lease was lost: another relay owns the row now
                changed += 1
                conn.execute(
                    self._insert_attempt,
                    {
                        "message_id": _as_uuid(hit[0]),
                        "attempt": hit[1],
                        "now": now,
                        "relay_id": relay_id,
                        "failure_class": r["failure_class"],
                        "outcome": r["outcome"],
                        "error": r["error"],
                        "next_at": r["available_at"],
                    },
                )
        return changed

    def reclaim_expired(self, *, relay_id: str = "", max_attempts: int = 10) -> int:
        if self._pg:
            params = {"relay_id": relay_id, "max_attempts": max_attempts}
            with self._conn() as conn:
                return conn.execute(self._reclaim, params).rowcount
        now = self._now()
        with self._conn() as conn, sqlite_transaction(conn):
            expired = conn.execute(self._reclaim, {"now": now, "max_attempts": max_attempts}).all()
            for message_id, attempts, error, state in expired:
                conn.execute(
                    self._insert_attempt,
                    {
                        "message_id": message_id,
                        "attempt": attempts,
                        "now": now,
                        "relay_id": relay_id,
                        "failure_class": FailureClass.AMBIGUOUS.value,
                        "outcome": "dead" if state == "dead" else "retry",
                        "error": error,
                        "next_at": None if state == "dead" else now,
                    },
                )
        return len(expired)

    def purge_expired(self, policy: RetentionPolicy, now: dt.datetime) -> int:
        return run_retention_once(self.engine, policy, now)

    def has_ready(self, part: str) -> bool:
        params: dict[str, Any] = {"only": part} if self._pg else {"only": part, "now": self._now()}
        with self._conn() as conn:
            return bool(conn.execute(self._has_ready, params).scalar_one())

    def resources(self) -> list[ResourceRow]:
        with self._conn() as conn:
            return [_resource_row(r) for r in conn.execute(self._resources)]

    def change_resource(
        self, resource: str, change: Callable[[ResourceRow, dt.datetime], tuple[ResourceRow, T]]
    ) -> T:
        with self._conn() as conn:
            conn.execute(self._ensure_resource, {"resource": resource})
            conn.exec_driver_sql("BEGIN" if self._pg else "BEGIN IMMEDIATE")
            try:
                found = conn.execute(self._lock_resource, {"resource": resource}).one()
                now = _utc(found[-1]) if self._pg else self._now()
                row, result = change(_resource_row(found), now)
                conn.execute(self._update_resource, _resource_params(row))
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")
        return result

    def heartbeat(self, relay_id: str) -> None:
        params: dict[str, Any] = {"relay_id": relay_id}
        if not self._pg:
            params["now"] = self._now()
        with self._conn() as conn:
            conn.execute(self._heartbeat, params)

    def forget_relay(self, relay_id: str) -> None:
        with self._conn() as conn:
            conn.execute(self._forget_relay, {"relay_id": relay_id})

    def relays(self, within_seconds: float) -> list[tuple[str, dt.datetime, dt.datetime]]:
        """Relays whose heartbeat is more recent than `within_seconds`: (id, started, last seen)."""
        params: dict[str, Any] = (
            {"within": within_seconds}
            if self._pg
            else {"since": self._now() - dt.timedelta(seconds=within_seconds)}
        )
        with self._conn() as conn:
            return [(r[0], _utc(r[1]), _utc(r[2])) for r in conn.execute(self._relays, params)]

    def counts(self) -> StateCounts:
        now = self._now()
        with self._conn() as conn:
            by_state = {str(s): int(n) for s, n in conn.execute(self._count_by_state)}
            params = {} if self._pg else {"now": now}
            ready, delayed, oldest = conn.execute(self._pending, params).one()
        if oldest is None:
            age = None
        elif self._pg:
            age = max(0.0, float(oldest))
        else:
            oldest_at = _utc(dt.datetime.fromisoformat(str(oldest)))
            age = max(0.0, (now - oldest_at).total_seconds())
        return StateCounts(by_state, int(ready or 0), int(delayed or 0), age)

    def ping(self) -> None:
        with self._conn() as conn:
            conn.execute(text(self._sql.PING))

    def close(self) -> None:
        self.engine.dispose()


ERROR_MAX = 2000  # characters of error text kept per attempt

_RESOURCE_COLUMNS: dict[str, Any] = {
    "resource": String(),
    "state": String(),
    "failures": Integer(),
    "opens": Integer(),
    "open_until": _Time,
    "probe_owner": String(),
    "probe_until": _Time,
    "last_error": String(),
    "changed_at": _Time,
    "tokens": Float(),
    "tokens_at": _Time,
}


def _maybe_utc(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else _utc(value)


def _resource_row(r: Any) -> ResourceRow:
    circuit = Circuit(
        resource=r[0],
        state=CircuitState(r[1]),
        failures=int(r[2]),
        opens=int(r[3]),
        open_until=_maybe_utc(r[4]),
        probe_owner=r[5],
        probe_until=_maybe_utc(r[6]),
        last_error=r[7],
        changed_at=_maybe_utc(r[8]),
    )
    return ResourceRow(circuit, Bucket(None if r[9] is None else float(r[9]), _maybe_utc(r[10])))


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
    if isinstance(decision, Dead):
        return {
            "seq": decision.seq,
            "state": "dead",
            "available_at": None,
            "unburn": 0,
            "failure_class": decision.failure.cls.value,
            "outcome": "dead",
            "error": decision.reason[:ERROR_MAX],
        }
    return {
        "seq": decision.seq,
        "state": "pending",
        "available_at": decision.at,
        "unburn": 0 if decision.burn else 1,
        "failure_class": decision.failure.cls.value,
        "outcome": "retry" if decision.burn else "deferred",
        "error": decision.failure.detail[:ERROR_MAX],
    }


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def translate_db_error(engine: Engine, exc: DBAPIError) -> RelayError | None:
    """The relay's error for a driver error, or None when it should propagate as it is.

    Told apart by SQLSTATE, never by message text (SQLite has no SQLSTATE; there every
    OperationalError, "database is locked" or a disk error, counts as transient): transient
    errors (connection lost or refused, server starting or shutting down, serialization
    failure, deadlock) become DatabaseUnavailable, which the relay loop waits out and retries;
    anything else is a bug or a broken schema and propagates.
    """
    if is_missing_table(exc):
        return SchemaNotFound(
            "the outbox tables do not exist in this database: run `outbox-relay migrate`"
        )
    if engine.dialect.name == "postgresql":
        sqlstate = getattr(exc.orig, "sqlstate", None)
        transient = classify_db_error(sqlstate) is DbFailure.TRANSIENT
    else:
        transient = isinstance(exc, OperationalError)
    if transient or exc.connection_invalidated:
        return DatabaseUnavailable(_describe(engine, exc))
    return None


def _describe(engine: Engine, exc: DBAPIError) -> str:
    first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    sqlstate = getattr(exc.orig, "sqlstate", None)
    what = "is not reachable" if sqlstate is None or sqlstate.startswith("08") else "failed"
    return f"database {redact(str(engine.url))} {what}: {first}"


def make_engine(db_url: str, *, autocommit: bool = True, pool_size: int = 3) -> Engine:
    """An engine configured for the relay (autocommit: every statement is its own transaction)."""
    url = parse_db_url(db_url)
    kwargs: dict[str, Any] = {}
    if autocommit:
        kwargs["isolation_level"] = "AUTOCOMMIT"
    if url.get_backend_name() == "postgresql":
        kwargs.update(
            pool_size=pool_size,
            max_overflow=2,
            connect_args={"connect_timeout": 5, "application_name": "outbox-relay"},
        )
        return create_engine(url, **kwargs)
    engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets the application write while the relay reads; busy_timeout makes writers queue
    # for the single write lock instead of failing at once.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def open_store(
    db_url: str, *, check: bool = True, dead_key: str = "hold", scope: str = "exchange"
) -> SqlStore:
    """Open the store at `db_url`; with `check`, fail now if the database is unreachable."""
    store = SqlStore(make_engine(db_url), dead_key=dead_key, scope=scope)
    if check:
        store.ping()
    return store
