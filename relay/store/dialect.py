"""What SqlStore needs from a database: its statements, by name, and the few behaviours where
databases truly differ.

postgres.py, mysql.py and sqlite.py each define a Dialect; databases.py maps a URL to one. Another
database is a module beside them, its .sql file (relay/store/sql/, read by queries.py) and a line
in databases.py: SqlStore does not change. A dialect's statements are data: which block of its
file each one is (Query), built and compiled once per store configuration (Dialect.__init__).

Every dialect's statements keep these conventions, so SqlStore binds the same values everywhere:

- `:now` is the time to use, or NULL for the database's own clock. Production binds NULL; tests
  bind a frozen time. Every statement that reads or stamps a time goes through it.
- Durations are bound in seconds (`:lease_seconds`, `:delay_seconds`, `:within`) and added to
  the time in SQL.
- Lists (`:seqs`, `:tokens`, `:exclude`, `:states`) are bound as `bind_list` makes them; a UUID
  in a list is its 32 hex digits. A dialect that names them in `lists` gets them as SQLAlchemy's
  expanding parameters (`seq IN :seqs` in its text).
- A statement that changes a leased row names `lease_token = :token AND state = 'in_flight'` in
  its WHERE clause: a relay whose lease expired (and was taken over) changes nothing.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Connection,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    String,
    TextClause,
    TextualSelect,
    bindparam,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import TypeEngine

from outbox.schema import UUID
from relay.ports import TableHealth
from relay.store import common
from relay.store.estimates import TableStats
from relay.store.queries import Queries, QueryError

TIME = DateTime(timezone=True)

# The type of every bind that needs one, by name: the same name means the same thing in every
# statement of every dialect. Others (numbers, text, lists) go to the driver as they are.
_BIND_TYPES: Mapping[str, TypeEngine[Any]] = {
    "now": TIME,
    "token": UUID,
    "message_id": UUID,
    "after_id": UUID,
    "cutoff_id": UUID,
    "cutoff": TIME,
    "open_until": TIME,
    "probe_until": TIME,
    "changed_at": TIME,
    "tokens_at": TIME,
    "available_at": TIME,
    "next_at": TIME,
    "started_at": TIME,
    "batch_size": Integer(),
}
_BIND = re.compile(r"(?<![:\w]):(\w+)")

# Result columns whose driver value needs converting (SQLite returns times as text, UUIDs as hex).
CLAIMED_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "seq": BigInteger(),
    "id": UUID,
    "exchange": String(),
    "routing_key": String(),
    "payload": LargeBinary(),
    "content_type": String(),
    "headers": JSON().with_variant(postgresql.JSON(), "postgresql"),
    "key": String(),
    "priority": Integer(),
    "attempts": Integer(),
    "max_attempts": Integer(),
    "available_at": TIME,
    "created_at": TIME,
    "traceparent": String(),
    "tracestate": String(),
    "suspect": Boolean(),  # claimed alone (common.ALONE)
}
RESOURCE_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "resource": String(),
    "state": String(),
    "failures": Integer(),
    "opens": Integer(),
    "open_until": TIME,
    "probe_owner": String(),
    "probe_until": TIME,
    "last_error": String(),
    "changed_at": TIME,
    "tokens": Float(),
    "tokens_at": TIME,
}
LOCKED_RESOURCE_COLUMNS: Mapping[str, TypeEngine[Any]] = {**RESOURCE_COLUMNS, "now": TIME}
RELAY_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "relay_id": String(),
    "started_at": TIME,
    "last_seen": TIME,
}


# A statement ready to run: TextualSelect when its result columns are typed.
Compiled = TextClause | TextualSelect


def compile_sql(
    sql: str, columns: Mapping[str, TypeEngine[Any]] | None = None, *, lists: Collection[str] = ()
) -> Compiled:
    """A statement ready to run many times: its binds typed by name (those named in `lists`
    expanding), its result columns typed.

    Built once per dialect, never per call: the claim and mark statements run thousands of times
    a second, and parsing the text and typing its binds each time would show."""
    names = set(_BIND.findall(sql))
    clause = text(sql)
    typed = [bindparam(n, type_=t) for n, t in _BIND_TYPES.items() if n in names]
    typed += [bindparam(n, expanding=True) for n in lists if n in names]
    if typed:
        clause = clause.bindparams(*typed)
    return clause.columns(**columns) if columns else clause


@dataclass(frozen=True, slots=True)
class Query:
    """One statement of a dialect, as data: the block of its .sql files it is built from, its
    result columns' types (None: untyped), the text its placeholders take beside the store's
    configuration (queries.py), and which of its binds expand as lists (None: the dialect's)."""

    block: str
    columns: Mapping[str, TypeEngine[Any]] | None = None
    fill: Mapping[str, str] = field(default_factory=dict)
    lists: Collection[str] | None = None


def build(
    queries: Queries,
    statements: Mapping[str, Query],
    config: Mapping[str, str],
    lists: Collection[str] = (),
) -> dict[str, Compiled]:
    """Each of `statements` built from `queries` with this configuration, and compiled."""
    built: dict[str, Compiled] = {}
    configured: set[str] = set()
    for name, query in statements.items():
        text, taken = queries.expand(query.block, query.fill, config)
        configured |= taken
        built[name] = compile_sql(
            text, query.columns, lists=lists if query.lists is None else query.lists
        )
    unused = sorted(set(config) - configured)
    if unused:
        raise QueryError(f"no statement takes the configuration's {unused}")
    return built


@dataclass(frozen=True, slots=True)
class Statements:
    """The statements run as they are (by SqlStore; count_eligible by retention.py): the same
    names, binds and result columns in every dialect. What takes several statements on some
    database is a Dialect method instead."""

    has_ready: Compiled  # (only, now) -> one boolean
    release: Compiled  # (token, seqs, delay_seconds, error, now); rowcount
    extend_leases: Compiled  # (tokens, lease_seconds, now); rowcount
    unpark_sweep: Compiled  # rowcount
    resources: Compiled  # -> RESOURCE_COLUMNS, every row
    ensure_resource: Compiled  # (resource)
    lock_resource: Compiled  # (resource, now) -> LOCKED_RESOURCE_COLUMNS, under a lock
    update_resource: Compiled  # (resource and every column)
    heartbeat: Compiled  # (relay_id, now)
    forget_relay: Compiled  # (relay_id)
    relays: Compiled  # (within, now) -> RELAY_COLUMNS
    pending_summary: Compiled  # (now) -> (ready, delayed, oldest ready age in seconds)
    count_eligible: Compiled  # (states, cutoff, cutoff_id, after_id) -> count
    ping: Compiled


# SqlStore's statements (Statements' fields) in every dialect: the block of the same name, with
# these result columns. The resource and relay rows' statements of common.sql bind no list, and one
# name means a number there: a bucket's `:tokens` (update_resource), not extend_leases' list of
# lease tokens.
STATEMENTS: Mapping[str, Query] = {
    "has_ready": Query("has_ready"),
    "release": Query("release"),
    "extend_leases": Query("extend_leases"),
    "unpark_sweep": Query("unpark_sweep"),
    "resources": Query("list_resources", RESOURCE_COLUMNS, lists=()),
    "ensure_resource": Query("ensure_resource"),
    "lock_resource": Query("lock_resource", LOCKED_RESOURCE_COLUMNS),
    "update_resource": Query("update_resource", lists=()),
    "heartbeat": Query("heartbeat"),
    "forget_relay": Query("forget_relay", lists=()),
    "relays": Query("relays", RELAY_COLUMNS),
    "pending_summary": Query("pending_summary"),
    "count_eligible": Query("count_eligible"),
    "ping": Query("ping", lists=()),
}
_FIELDS = {f.name for f in fields(Statements)}


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
    # The SQL expression of a row's resource part, per scope (common.RESOURCE_PARTS' texts,
    # where the database concatenates with ||).
    resource_parts: ClassVar[Mapping[str, str]] = common.RESOURCE_PARTS
    # Its .sql files (common.sql and its own), and its statements beyond SqlStore's (STATEMENTS,
    # which it may also redefine), by the attribute its methods find each on.
    queries: ClassVar[Queries]
    statements: ClassVar[Mapping[str, Query]] = {}
    # The binds its statements expand as lists (Query.lists overrides).
    lists: ClassVar[Collection[str]] = ()

    def __init__(self, *, hold: bool = True, scope: str = "exchange") -> None:
        if scope not in common.RESOURCE_PARTS:
            raise ValueError(f"scope must be one of {sorted(common.RESOURCE_PARTS)}, not {scope!r}")
        blocking = common.blocking_states(hold=hold)
        self.sql = self._prepare(blocking=blocking, resource=self.resource_parts[scope])

    def _prepare(self, *, blocking: str, resource: str) -> Statements:
        """Compile this database's statements, once: those SqlStore runs (returned) and those
        this dialect's own methods run (kept on self). `blocking` is the literal list of states
        that hold a key back, `resource` the SQL expression of a row's resource part: the
        configuration, {{blocking}} and {{resource}} in the .sql files."""
        config = self.configuration(blocking=blocking, resource=resource)
        built = build(self.queries, {**STATEMENTS, **self.statements}, config, self.lists)
        for name, clause in built.items():
            if name not in _FIELDS:
                setattr(self, name, clause)
        return Statements(**{name: built[name] for name in _FIELDS})

    def configuration(self, *, blocking: str, resource: str) -> dict[str, str]:
        """What the placeholders of this store's configuration take: {{blocking}} and
        {{resource}}, and any a dialect adds."""
        return {"blocking": blocking, "resource": resource}

    @classmethod
    @abstractmethod
    def is_transient(cls, exc: DBAPIError) -> bool:
        """Whether the error means the database is unavailable for now (retry later), as opposed
        to a statement that will fail the same way every time."""

    @classmethod
    def engine_options(
        cls, *, pool_size: int, statement_timeout: float | None, pool_timeout: float
    ) -> dict[str, Any]:
        """create_engine's arguments for a relay engine of this database (statement_timeout in
        seconds, None for none)."""
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

    @abstractmethod
    def bind_list(self, values: Iterable[Any]) -> Any:
        """A list as this database binds it."""

    @abstractmethod
    def claim(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        """Lease up to :limit ready rows; return them with CLAIMED_COLUMNS (in no set order).

        When the best candidates include a solitary suspect, only that one is claimed (stamped
        :alone); else when they include suspects, only those, at most :group (stamped :grouped;
        common.GROUPED, SOLITARY, ALONE). The last column says whether a row is a suspect.

        params: owner, token, limit, scan (keyed candidates looked at), lease_seconds,
        exclude (resource parts passed by), only (the one part wanted, or None), group, alone,
        grouped, solitary, now."""

    @abstractmethod
    def claim_run(self, conn: Connection, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        """Lease to :token the next :run messages of the key of row :after, behind it, as the
        claim's runs do (pending, due, not suspects, :exclude passed by, not locked: the prefix
        that is all of these); nothing unless every earlier message of the key in a blocking
        state is in flight under :token. Rows with CLAIMED_COLUMNS (none a suspect).

        params: owner, token, after, run, follow (= run), lease_seconds, exclude, only (None),
        grouped, now."""

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

    @abstractmethod
    def reclaim_expired(self, conn: Connection, params: dict[str, Any]) -> int:
        """Return rows whose lease expired to pending as suspects (a row claimed alone: dead
        past its attempts), recording an ambiguous attempt for each; return how many.
        params: relay_id, max_attempts, alone, now."""

    @abstractmethod
    def abandon(self, conn: Connection, params: dict[str, Any]) -> int:
        """What reclaim_expired does to an expired lease, now, to the rows :token holds (their
        relay is crashing). params: token, error, relay_id, max_attempts, alone, now."""

    # Liveness (common.BEAT). The reclaims take the params of reclaim_expired, and every one of
    # them also alone, grouped and solitary.

    @abstractmethod
    def register_relay(self, conn: Connection, params: dict[str, Any]) -> dt.datetime:
        """Insert or take over :relay_id's heartbeat row for a new run; return its started_at.
        params: relay_id, now."""

    @abstractmethod
    def beat(self, conn: Connection, params: dict[str, Any]) -> bool:
        """Touch :relay_id's row if it still names the run :started_at; whether it did.
        params: relay_id, started_at, now."""

    @abstractmethod
    def reclaim_owner(self, conn: Connection, params: dict[str, Any]) -> int:
        """What reclaim_expired does, to every row leased to :relay_id (an earlier run of this
        relay id left them: the running one holds none yet)."""

    @abstractmethod
    def reclaim_dead(self, conn: Connection, params: dict[str, Any]) -> tuple[list[str], int]:
        """Delete the rows of relays, other than :relay_id, last seen more than :dead_after
        seconds ago, and do what reclaim_expired does to the rows they leased; return those
        relays and how many rows. params: dead_after and reclaim_expired's."""

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
