"""What SqlStore needs from a database: its statements, as typed attributes (statements.py), and
the few behaviours where databases truly differ.

postgres.py, mysql.py and sqlite.py each define a Dialect; databases.py maps a URL to one. Another
database is a module beside them, its .sql file (relay/store/sql/, read by queries.py), and a line
in databases.py; SqlStore does not change. (The library's half of a database, what `enqueue`,
`migrate` and the inbox run, is outbox/databases.py.)
"""

from __future__ import annotations

import datetime as dt
import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from sqlalchemy import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from outbox.dberrors import DbFailure, classify_db_error, sqlstate_of
from relay.ports import Claimed, TableHealth
from relay.store import common
from relay.store.estimates import TableStats
from relay.store.queries import Queries
from relay.store.statements import Statements, build, sql_of
from relay.store.transitions import Attempt, Transition, as_json


def utc(value: dt.datetime) -> dt.datetime:
    """`value` with its zone: SQLite hands back naive datetimes, and this project writes UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


class Dialect(ABC):
    """One database's SQL for the relay's store.

    Made per store configuration: the claim statements depend on the dead-key mode (`hold`) and
    on the resource scope, which are written into them (see common.blocking_states and
    common.RESOURCE_PARTS) so that the planner can use the partial indexes.
    """

    name: ClassVar[str]  # SQLAlchemy's backend name: a URL's backend picks its dialect
    drivers: ClassVar[tuple[str, ...]]  # the DBAPI drivers it runs on
    # The driver written into a bare URL (postgresql://): older SQLAlchemy releases default to
    # one this project does not ship. None: SQLAlchemy's default is one of `drivers`.
    bare_url_driver: ClassVar[str | None] = None
    # How a write transaction begins (the engine runs in autocommit; see transaction()).
    begin: ClassVar[str]
    # The statement that subscribes to enqueue notifications, where the database has them.
    listen: ClassVar[str | None] = None
    # Statements run on every new connection (session settings).
    on_connect: ClassVar[tuple[str, ...]] = ()
    # Run on the relay loop's own connections (open_store(relaxed_commit=True)), where the
    # database can: its commits return before their WAL is on disk. A write that a database
    # crash loses can only make a message published again (same message_id), never lost: the
    # application's own commit of the row stays synchronous. A claim then waits for no disk.
    relaxed_commit: ClassVar[str | None] = None
    # On the relay loop's connections, where the connection is direct (no pooler between, see
    # `pooled`): after how many runs a statement is prepared on the server. None: never.
    prepare_direct: ClassVar[int | None] = None
    # The driver-level statement that sets a statement timeout (one parameter: milliseconds, as
    # text), where the database has one.
    statement_timeout: ClassVar[str | None] = None
    # Whether the store binds the application's clock as :now: true where `enqueue` writes the
    # application's time (SQLite), so a row it has just written is already due to the store.
    app_clock: ClassVar[bool] = False
    # How long a purge rests after each batch, as a share of the batch's own time, where other
    # writers wait for it (SQLite's single write lock); 0 where nothing waits for a purge.
    purge_rest_ratio: ClassVar[float] = 0.0
    # The SQL expression of a row's resource part, per scope (common.RESOURCE_PARTS' texts,
    # where the database concatenates with ||).
    resource_parts: ClassVar[Mapping[str, str]] = common.RESOURCE_PARTS
    # Its .sql files (common.sql and its own), and the class of its statements.
    queries: ClassVar[Queries]
    statements: ClassVar[type[Statements]]
    # The binds its statements expand as lists (Query.lists overrides).
    lists: ClassVar[Collection[str]] = ()

    # Built by __init__: the literal list of states that hold a key back, the values of the
    # configuration's placeholders, and the statements (a dialect's own class of `statements`).
    blocking: str
    config: dict[str, str]
    sql: Statements

    def __init__(self, *, hold: bool = True, scope: str = "exchange") -> None:
        if scope not in common.RESOURCE_PARTS:
            raise ValueError(f"scope must be one of {sorted(common.RESOURCE_PARTS)}, not {scope!r}")
        blocking = common.blocking_states(hold=hold)
        self.blocking = blocking
        self.config = self.configuration(blocking=blocking, resource=self.resource_parts[scope])
        self.sql = build(self.statements, self.queries, self.config, self.lists)

    def configuration(self, *, blocking: str, resource: str) -> dict[str, str]:
        """What the placeholders of this store's configuration take: {{blocking}}, the literal
        list of states that hold a key back, and {{resource}}, the SQL expression of a row's
        resource part; and any a dialect adds. Literal SQL, never another placeholder."""
        return {"blocking": blocking, "resource": resource}

    def texts(self) -> dict[str, str]:
        """Every statement this dialect runs, by name, as the database receives it: its
        statements, and what runs on a driver connection (`outbox-relay sql`)."""
        found = {name: sql_of(statement) for name, statement in self.sql.items()}
        session = {
            "begin": self.begin,
            "listen": self.listen,
            "statement_timeout": self.statement_timeout,
            "relaxed_commit": self.relaxed_commit,
            **{f"on_connect_{i + 1}": s for i, s in enumerate(self.on_connect)},
        }
        found.update({name: sql for name, sql in session.items() if sql is not None})
        return found

    @classmethod
    def is_transient(cls, exc: DBAPIError) -> bool:
        """Whether the error means the database is unavailable for now (retry later), as opposed
        to a statement that will fail the same way every time. By SQLSTATE (a MySQL error number
        read as one), never by message text: outbox/dberrors.py holds the rule."""
        return classify_db_error(sqlstate_of(exc.orig)) is DbFailure.TRANSIENT

    def migration_denied(self, engine: Engine, exc: DBAPIError, sqlstate: str) -> str:
        """What a role that `migrate` was refused a privilege lacks (`sqlstate` 42501, or 3F000:
        no schema to create the tables in), and how to give it; one line."""
        said = str(exc.orig if exc.orig is not None else exc).strip()
        return said.splitlines()[0] if said else type(exc).__name__

    @classmethod
    def engine_options(
        cls, *, pool_size: int, statement_timeout: float | None, pool_timeout: float
    ) -> dict[str, Any]:
        """create_engine's arguments for a relay engine of this database (statement_timeout in
        seconds, None for none): by default a pool of `pool_size` and two more at a peak, and
        the database's own (connection_options)."""
        pool = {"pool_size": pool_size, "max_overflow": 2, "pool_timeout": pool_timeout}
        return {**pool, **cls.connection_options()}

    @classmethod
    def url_arguments(cls, url: URL) -> tuple[URL, dict[str, Any]]:
        """`url` without the query parameters this dialect reads itself, and those as the
        driver's connect arguments; ConfigError names a bad value. None by default: SQLAlchemy
        hands a URL's query to the driver as it is."""
        return url, {}

    @classmethod
    def connection_options(cls) -> dict[str, Any]:
        """create_engine's arguments of this database's own (connect_args, ...)."""
        return {}

    @classmethod
    def timeout_sql(cls, dbapi_conn: Any) -> str | None:
        """`statement_timeout` for the server behind a new driver connection (MySQL and
        MariaDB name their setting apart)."""
        return cls.statement_timeout

    @classmethod
    def pooled(cls, dbapi_conn: Any) -> str | None:
        """None when a new driver connection reaches the database directly. Through a pooler,
        where a session setting would outlive the relay's use of the server connection: the
        statement timeout the server applies by itself ("0": none)."""
        return None

    def bind_list(self, values: Iterable[Any]) -> Any:
        """A list as this database binds it: a list, a UUID in it as its 32 hex digits."""
        return [v.hex if isinstance(v, uuid.UUID) else v for v in values]

    @abstractmethod
    def claim(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        """Lease up to :limit ready rows; return them with CLAIMED_COLUMNS (in no set order).

        When the best candidates include a suspect to be claimed alone, only that one is
        claimed; else when they include suspects, only those, at most :group
        (relay/core/suspects.py, choose; :alone or :grouped in last_error for relays of schema
        6). The last column says whether a row is a suspect.

        params: owner, token, limit, scan (keyed candidates looked at), lease_seconds,
        exclude (resource parts passed by), only (the one part wanted, or None), group, run,
        follow (rows all runs add, at most), alone, grouped, now."""

    @abstractmethod
    def claim_run(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        """Lease to :token the next :run messages of the key of row :after, behind it, as the
        claim's runs do (pending, due, not suspects, :exclude passed by, not locked: the prefix
        that is all of these); nothing unless every earlier message of the key in a blocking
        state is in flight under :token. Rows with CLAIMED_COLUMNS (none a suspect).

        params: owner, token, after, run, follow (= run), lease_seconds, exclude, only (None),
        now."""

    def claimed(self, rows: Sequence[Sequence[Any]]) -> list[Claimed]:
        """`claim`'s and `claim_run`'s rows as Claimed, by position (CLAIMED_COLUMNS' order):
        the hot path, hundreds a claim. The message id as text, times in UTC (SQLite's come
        naive; everything this project writes is UTC), the suspect column a boolean. The
        payload is as stored: the wire checks its type, per row."""
        return [
            Claimed(
                r[0],
                str(r[1]),
                r[2],
                r[3],
                r[4],
                r[5],
                r[6],
                r[7],
                r[8],
                r[9],
                r[10],
                utc(r[11]),
                utc(r[12]),
                r[13],
                r[14],
                bool(r[15]),
            )
            for r in rows
        ]

    @abstractmethod
    def mark_published(self, conn: Connection, params: dict[str, Any]) -> int:
        """Mark :seqs published where :token holds them and unpark the next message of each of
        their keys; return how many were marked. params: token, seqs, now."""

    @abstractmethod
    def settle_failures(
        self, conn: Connection, settlements: Sequence[Mapping[str, Any]], params: dict[str, Any]
    ) -> int:
        """Apply each settlement (seq, state, available_at, unburn, failure_class, outcome,
        error) where :token holds the row, and write one outbox_attempt row per row changed;
        return how many changed. params: token, relay_id, now."""

    def write_back(
        self,
        conn: Connection,
        rows: Sequence[Transition],
        records: Sequence[Attempt],
        params: Mapping[str, Any],
    ) -> None:
        """Inside the caller's transaction: rows' new values decided in Python and their attempt
        records, each in one statement for them all (relay/store/transitions.py).
        params: now, relay_id."""
        binds = {"now": params["now"], "relay_id": params["relay_id"]}
        conn.execute(self.sql.transition_rows, {**binds, "rows": as_json(rows)})
        conn.execute(self.sql.record_attempts, {**binds, "records": as_json(records)})

    def register_relay(self, conn: Connection, params: dict[str, Any]) -> dt.datetime:
        """Insert or take over :relay_id's heartbeat row for a new run; return its started_at.
        params: relay_id, now."""
        started: dt.datetime = conn.execute(self.sql.register_relay, params).scalar_one()
        return started

    def beat(self, conn: Connection, params: dict[str, Any]) -> bool:
        """Touch :relay_id's row if it still names the run :started_at; whether it did.
        params: relay_id, started_at, now. (MySQL counts matched rows, not changed ones:
        SQLAlchemy connects with CLIENT_FOUND_ROWS.)"""
        return int(conn.execute(self.sql.beat, params).rowcount) == 1

    @abstractmethod
    def purge_batch(self, conn: Connection, params: dict[str, Any]) -> tuple[int, uuid.UUID | None]:
        """Delete one retention batch and its attempt rows; return how many messages went and
        the highest id among them. params: states, cutoff, cutoff_id, after_id, batch_size."""

    def table_stats(self, conn: Connection) -> TableStats | None:
        """What the database knows of outbox_message's size without reading it, for estimating
        its published and cancelled rows beside a large table (relay/store/estimates.py); None
        where it keeps nothing usable: those are then counted exactly."""
        return None

    def table_health(self, conn: Connection) -> list[TableHealth]:
        """Autovacuum and dead rows of the relay's tables; empty where the database keeps no
        such figures (MySQL's InnoDB purges old row versions on its own, SQLite has no
        statistics of them)."""
        return []

    @contextmanager
    def reading(self, conn: Connection) -> Iterator[None]:
        """Around the counting statements (relay/store/counting.py), on an autocommit connection
        or inside the caller's transaction: whatever makes them run as they were planned to.
        Nothing by default."""
        yield

    @contextmanager
    def transaction(self, conn: Connection) -> Iterator[None]:
        """One write transaction on an autocommit connection: what is read inside is locked
        until it commits (FOR UPDATE on PostgreSQL; SQLite's write lock, taken by BEGIN)."""
        conn.exec_driver_sql(self.begin)
        try:
            yield
        except BaseException:
            # A lost connection took the transaction with it on the server, and SQLAlchemy
            # refuses an invalidated connection any statement (PendingRollbackError, which is
            # no driver error and would crash the relay): the error to report is the first one.
            if not conn.invalidated:
                conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")
