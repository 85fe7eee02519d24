"""The databases the library runs on, each a Database: what `enqueue`, the inbox and `migrate` do
differently there. Nothing else in the library asks which database it is on; another database is
a class here, beside the relay's Dialect for it (relay/store/dialect.py) and its .sql file.

PostgreSQL stamps rows with the server's clock and wakes the relay with NOTIFY; MySQL and MariaDB
(SQLAlchemy names them apart) stamp them with the server's clock in UTC and have no INSERT ... ON
CONFLICT; SQLite stamps them with the application's clock. Migrations: autovacuum settings on
PostgreSQL, two claim indexes of their own on MySQL, a unique index where SQLite cannot add a
constraint, and a lock that serialises two migrations where the database has one.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Delete,
    Insert,
    Interval,
    Select,
    Table,
    any_,
    bindparam,
    delete,
    func,
    insert,
    inspect,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite

from outbox import mysql_insert, pg_insert
from outbox.errors import SchemaConflict, UnsupportedDatabase
from outbox.prepared import Prepared
from outbox.schema import inbox, message
from outbox.shape import Gap, Kind

# The columns enqueue binds as they are (the times are each database's).
MESSAGE_COLUMNS = (
    "id", "exchange", "routing_key", "payload", "content_type", "headers", "key",
    "idempotency_key", "priority", "max_attempts", "traceparent", "tracestate",
)  # fmt: skip
_HAS_KEY = message.c.idempotency_key.isnot(None)


@dataclass(frozen=True, slots=True)
class Inserts:
    """enqueue's statements on one database. Built once: per call, SQLAlchemy only binds values
    to a cached compilation."""

    insert: Insert
    # Inserts, or writes nothing when the idempotency key is taken (returning None); where a taken
    # key fails the INSERT instead (MySQL: InnoDB rolls back that one statement), the plain one.
    insert_or_nothing: Insert
    server_clock: bool  # the database stamps created_at and available_at (:delay, :delay_us)
    notify: str | None = None  # what wakes an idle relay (PostgreSQL's NOTIFY); None: nothing
    # MySQL: the earlier row of a key, read by a locking read, which sees the latest committed
    # rows whatever the transaction's snapshot (REPEATABLE READ is MySQL's default).
    existing: Select[tuple[Any]] | None = None


class Database:
    """One database, as the library meets it. The defaults are what every SQL database does."""

    names: ClassVar[tuple[str, ...]]  # SQLAlchemy's dialect names
    # What migrate runs to set the autovacuum settings (PostgreSQL), and the indexes of the
    # database's own beside outbox.metadata's (MySQL), by name.
    storage_settings: ClassVar[tuple[str, ...]] = ()
    own_indexes: ClassVar[Mapping[str, str]] = {}
    # Whether the relay can read messages from the database's log (logical capture,
    # outbox/pg_emit.py): where it cannot, enqueue writes rows whatever the capture setting.
    has_log: ClassVar[bool] = False

    # ------------------------------------------------------------------ enqueue

    @functools.cached_property
    def inserts(self) -> Inserts:
        """enqueue's statements here (see Inserts), built on first use."""
        raise NotImplementedError

    def direct_insert(self, conn: Connection, prepared: Prepared, *, notify: bool) -> bool:
        """Insert `prepared` by a path of the database's own, if it has one that covers it;
        whether it did."""
        return False

    def direct_insert_many(self, conn: Connection, prepared: Sequence[Prepared]) -> bool:
        """Insert `prepared` (none with an idempotency key), in their order, by a path of the
        database's own, if it has one; whether it did (else SQLAlchemy's executemany does)."""
        return False

    # ------------------------------------------------------------------ the inbox

    def record_inbox(self, conn: Connection, row: Mapping[str, Any]) -> bool:
        """Insert an inbox row unless the consumer has it; whether it went in."""
        raise NotImplementedError

    def purge_inbox_batch(self, consumer: str, cutoff: dt.datetime, limit: int) -> Delete:
        """One DELETE of at most `limit` of `consumer`'s rows processed before `cutoff`: the
        subquery picks them through the (consumer, processed_at) index."""
        chosen = inbox.c.message_id.in_(_inbox_victims(consumer, cutoff, limit))
        return delete(inbox).where(inbox.c.consumer == consumer, chosen)

    # ------------------------------------------------------------------ migrate

    @contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        """Held while a migration runs, so two at once do not both create a table."""
        yield

    def storage_gaps(self, conn: Connection, tables: frozenset[str]) -> list[Gap]:
        """Settings of its own the existing outbox tables lack."""
        return []

    def created(self, conn: Connection, table: str) -> None:
        """What a new outbox table gets beside outbox.metadata's definition."""

    def index_gaps(self, conn: Connection, tables: frozenset[str]) -> list[Gap]:
        """own_indexes an existing outbox_message lacks."""
        if not self.own_indexes or message.name not in tables:
            return []
        have = {str(ix["name"]) for ix in inspect(conn).get_indexes(message.name)}
        return [Gap(Kind.INDEX, message.name, (n,)) for n in self.own_indexes if n not in have]

    def add_unique(self, conn: Connection, table: Table, columns: tuple[str, ...]) -> None:
        """A unique constraint an existing table lacks. Written out rather than
        AddConstraint(the metadata's constraint), which marks that shared object so that every
        later CREATE TABLE of the table would leave the constraint out."""
        quote = conn.dialect.identifier_preparer.quote
        listed = ", ".join(quote(column) for column in columns)
        # Unnamed, as CREATE TABLE makes it (and Alembic expects): the database names it.
        conn.exec_driver_sql(f"ALTER TABLE {quote(table.name)} ADD UNIQUE ({listed})")

    def record_versions(self) -> Insert:
        """The INSERT of outbox_schema_version's rows."""
        from outbox.schema import schema_version

        return insert(schema_version)


def _inbox_victims(consumer: str, cutoff: dt.datetime, limit: int) -> Select[tuple[str]]:
    return (
        select(inbox.c.message_id)
        .where(inbox.c.consumer == consumer, inbox.c.processed_at < cutoff)
        .limit(limit)
    )


# ------------------------------------------------------------------------ PostgreSQL

# Autovacuum per table. Storage parameters cannot be bound, so the ALTER statements below are
# rendered from these constants (never from input).
#
# outbox_message is a queue: every message leaves ~2 dead tuples (the claim's UPDATE, the
# settlement's UPDATE) and then one more when retention deletes it. At the default scale factor
# (0.2) a 10M-row table collects 2M dead tuples before autovacuum looks at it; at 0.01 plus 1000
# it is vacuumed every ~1% of churn, which keeps the partial claim indexes small and the heap from
# growing (PgQueuer uses the same scale factor). Analyze at 2% keeps the planner's idea of how
# many rows are pending current, and a cost delay of 1 ms lets each vacuum finish quickly.
#
# No fillfactor: free space left on a page pays off through HOT updates, and no update of this
# table can be HOT, since each one changes a column that an index covers or that an index
# predicate names (state, held, lease_expires_at). The reserved space would only make every kept
# row cost more pages.
#
# outbox_attempt is append-only: rows are inserted (failures, operator actions) and only ever
# deleted by retention, in bulk, never updated. Its dead tuples come from retention alone, so
# 5% (plus 1000) is enough to reclaim them soon after a purge without vacuuming it needlessly;
# inserts alone trigger vacuum through the default autovacuum_vacuum_insert_scale_factor, which is
# fine for it. fillfactor stays 100 (no updates). Cost delay is left at the server default: it is
# not on the relay's claim path.
#
# TOAST tables (large payloads) inherit these values when no toast.* parameter is set.
AUTOVACUUM_SETTINGS: dict[str, dict[str, float]] = {
    "outbox_message": {
        "autovacuum_vacuum_scale_factor": 0.01,
        "autovacuum_vacuum_threshold": 1000,
        "autovacuum_analyze_scale_factor": 0.02,
        "autovacuum_vacuum_cost_delay": 1,
    },
    "outbox_attempt": {
        "autovacuum_vacuum_scale_factor": 0.05,
        "autovacuum_vacuum_threshold": 1000,
        "autovacuum_analyze_scale_factor": 0.05,
    },
}


# SET (storage parameters) takes a SHARE UPDATE EXCLUSIVE lock: reads and writes go on; only
# another schema change or a VACUUM conflicts (autovacuum yields to it). Idempotent.
def settings_text(params: Mapping[str, float]) -> list[str]:
    return [f"{name} = {value}" for name, value in params.items()]


def alter_storage(table: str, settings: list[str]) -> str:
    return f"ALTER TABLE {table} SET ({', '.join(settings)})"


STORAGE_SETTINGS_SQL: tuple[str, ...] = tuple(
    alter_storage(table, settings_text(params)) for table, params in AUTOVACUUM_SETTINGS.items()
)

# The storage parameters a table has, found through the search_path as the inspector finds the
# tables; each is "name=value".
_RELOPTIONS = text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:table)")


class Postgresql(Database):
    names = ("postgresql",)
    storage_settings = STORAGE_SETTINGS_SQL
    has_log = True

    @functools.cached_property
    def inserts(self) -> Inserts:
        values: dict[str, Any] = {name: bindparam(name) for name in MESSAGE_COLUMNS}
        # The database clock, the one the relay compares against: an application host whose
        # clock runs ahead cannot make messages look delayed.
        now = func.statement_timestamp()
        values["created_at"] = now
        values["available_at"] = now + bindparam("delay", type_=Interval())
        # inline(): no RETURNING of the new seq, which nothing reads and which would need SELECT
        # on it (relay/store/grants.py: the application reads only id and idempotency_key).
        plain = insert(message).values(values).inline()
        guarded = (
            postgresql.insert(message)
            .values(values)
            .on_conflict_do_nothing(index_elements=["idempotency_key"], index_where=_HAS_KEY)
        )
        wake = f"SELECT pg_notify('{pg_insert.NOTIFY_CHANNEL}', '')"
        return Inserts(plain, guarded.returning(message.c.id), server_clock=True, notify=wake)

    def direct_insert(self, conn: Connection, prepared: Prepared, *, notify: bool) -> bool:
        if not pg_insert.covers(conn, prepared):
            return False
        pg_insert.insert_message(conn, prepared, notify=notify)  # the common path
        return True

    def direct_insert_many(self, conn: Connection, prepared: Sequence[Prepared]) -> bool:
        if not pg_insert.covers_all(conn):
            return False
        pg_insert.insert_messages(conn, prepared)  # a column an array, a chunk a statement
        return True

    def record_inbox(self, conn: Connection, row: Mapping[str, Any]) -> bool:
        # RETURNING tells whether a row went in (psycopg reports no rowcount for this statement).
        return conn.execute(_PG_INBOX, row).first() is not None

    def purge_inbox_batch(self, consumer: str, cutoff: dt.datetime, limit: int) -> Delete:
        # SKIP LOCKED: two instances of one consumer purge at once without waiting on each
        # other. ARRAY(...) runs the subquery once: as an IN, the planner may rescan it once per
        # row, and a locking LIMIT rescanned picks new rows each time (the batch is unbounded).
        victims = _inbox_victims(consumer, cutoff, limit)
        locked = victims.with_for_update(skip_locked=True).scalar_subquery()
        chosen = inbox.c.message_id == any_(func.array(locked))
        return delete(inbox).where(inbox.c.consumer == consumer, chosen)

    @contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        # Released when the migration's transaction ends.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('outbox_relay.migrate'))")
        yield

    def storage_gaps(self, conn: Connection, tables: frozenset[str]) -> list[Gap]:
        """AUTOVACUUM_SETTINGS parameters the existing outbox tables do not have at all. A value
        an operator chose instead is theirs to keep: only a parameter that is unset is missing."""
        gaps = []
        for table, params in AUTOVACUUM_SETTINGS.items():
            if table not in tables:
                continue
            options = conn.execute(_RELOPTIONS, {"table": table}).scalar_one_or_none() or []
            have = {option.split("=", 1)[0] for option in options}
            missing = tuple(settings_text({k: v for k, v in params.items() if k not in have}))
            if missing:
                gaps.append(Gap(Kind.STORAGE, table, missing))
        return gaps

    def created(self, conn: Connection, table: str) -> None:
        if table in AUTOVACUUM_SETTINGS:
            conn.exec_driver_sql(alter_storage(table, settings_text(AUTOVACUUM_SETTINGS[table])))


_PG_INBOX = postgresql.insert(inbox).on_conflict_do_nothing().returning(inbox.c.consumer)


# ------------------------------------------------------------------------ MySQL, MariaDB

# MySQL and MariaDB have no partial indexes: the indexes of `outbox.metadata` cover every row
# there, and these two, MySQL's own, take the place of the partial ones on the claim path. The
# claim reads ready rows in claim order under (state, held): the published rows, however many,
# are another range. A key's head probe asks for an earlier row of the key in a blocking state
# (relay/store/sql/mysql.sql, key_head_hold): (key, state, seq) answers it without reading the
# key's published rows. DESC needs MySQL 8 or MariaDB 10.8 to be an index order (older MariaDB
# sorts).
MYSQL_INDEXES: dict[str, str] = {
    "outbox_message_claim_idx": "CREATE INDEX outbox_message_claim_idx ON outbox_message "
    "(state, held, priority DESC, available_at, seq)",
    "outbox_message_key_state_idx": "CREATE INDEX outbox_message_key_state_idx ON outbox_message "
    "(`key`, state, seq)",
}
MYSQL_LOCK_WAIT = 300  # seconds one migration waits for another to finish


class Mysql(Database):
    names = ("mysql", "mariadb")
    own_indexes = MYSQL_INDEXES

    @functools.cached_property
    def inserts(self) -> Inserts:
        values: dict[str, Any] = {name: bindparam(name) for name in MESSAGE_COLUMNS}
        # The server's clock, in UTC, as the relay's statements read it (relay/store/mysql.py).
        now: ColumnElement[Any] = literal_column("UTC_TIMESTAMP(6)")
        values["created_at"] = now
        values["available_at"] = func.timestampadd(
            literal_column("MICROSECOND"), bindparam("delay_us", type_=BigInteger()), now
        )
        plain = insert(message).values(values).inline()
        existing = (
            select(message.c.id)
            .where(message.c.idempotency_key == bindparam("idempotency_key"))
            .with_for_update(read=True)
        )
        return Inserts(plain, plain, server_clock=True, existing=existing)

    def direct_insert_many(self, conn: Connection, prepared: Sequence[Prepared]) -> bool:
        if not mysql_insert.covers_all(conn):
            return False
        mysql_insert.insert_messages(conn, self.inserts.insert, prepared)  # many VALUES tuples
        return True

    def record_inbox(self, conn: Connection, row: Mapping[str, Any]) -> bool:
        # IGNORE skips the duplicate and its rowcount says whether a row went in (the values are
        # checked before, so nothing else it would forgive can happen).
        return conn.execute(_MY_INBOX, row).rowcount == 1

    def purge_inbox_batch(self, consumer: str, cutoff: dt.datetime, limit: int) -> Delete:
        # MySQL reads no LIMIT in an IN subquery, nor the table it deletes from: the DELETE
        # takes the bound itself, along the same index.
        return (
            delete(inbox)
            .where(inbox.c.consumer == consumer, inbox.c.processed_at < cutoff)
            .with_dialect_options(mysql_limit=limit, mariadb_limit=limit)
        )

    @contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        # A named lock: MySQL commits at each DDL statement, so no lock taken inside a
        # transaction would last; this one is the session's, until released.
        got = conn.execute(
            text("SELECT GET_LOCK('outbox_relay.migrate', :wait)"), {"wait": MYSQL_LOCK_WAIT}
        )
        if got.scalar() != 1:
            raise SchemaConflict(
                f"another migration of this database held its lock for {MYSQL_LOCK_WAIT} s: "
                "let it finish, then run migrate again"
            )
        try:
            yield
        finally:
            conn.exec_driver_sql("SELECT RELEASE_LOCK('outbox_relay.migrate')")

    def created(self, conn: Connection, table: str) -> None:
        if table == message.name:
            for statement in MYSQL_INDEXES.values():
                conn.exec_driver_sql(statement)

    def record_versions(self) -> Insert:
        # IGNORE: the lock is released before the caller commits, so the next migration may
        # record the same versions before this one's rows are visible to it.
        return super().record_versions().prefix_with("IGNORE")


_MY_INBOX = insert(inbox).prefix_with("IGNORE")


# ------------------------------------------------------------------------ SQLite


class Sqlite(Database):
    names = ("sqlite",)

    @functools.cached_property
    def inserts(self) -> Inserts:
        # The application's clock: SQLite's reads milliseconds (relay/store/sqlite.py, app_clock).
        values: dict[str, Any] = {name: bindparam(name) for name in MESSAGE_COLUMNS}
        values["created_at"] = bindparam("created_at")
        values["available_at"] = bindparam("available_at")
        plain = insert(message).values(values).inline()
        guarded = (
            sqlite.insert(message)
            .values(values)
            .on_conflict_do_nothing(index_elements=["idempotency_key"], index_where=_HAS_KEY)
        )
        return Inserts(plain, guarded.returning(message.c.id), server_clock=False)

    def record_inbox(self, conn: Connection, row: Mapping[str, Any]) -> bool:
        return conn.execute(_SQLITE_INBOX, row).first() is not None

    def add_unique(self, conn: Connection, table: Table, columns: tuple[str, ...]) -> None:
        # SQLite cannot add a constraint to a table; a unique index enforces the same. Its name
        # is the one PostgreSQL gives an unnamed constraint.
        quote = conn.dialect.identifier_preparer.quote
        listed = ", ".join(quote(column) for column in columns)
        name = quote(f"{table.name}_{'_'.join(columns)}_key")
        conn.exec_driver_sql(f"CREATE UNIQUE INDEX {name} ON {quote(table.name)} ({listed})")


_SQLITE_INBOX = sqlite.insert(inbox).on_conflict_do_nothing().returning(inbox.c.consumer)


# ------------------------------------------------------------------------ by name

DATABASES: dict[str, Database] = {
    name: database for database in (Postgresql(), Mysql(), Sqlite()) for name in database.names
}


def database_named(name: str) -> Database | None:
    """The Database of SQLAlchemy's dialect name `name`; None where the outbox does not run."""
    return DATABASES.get(name)


def database_of(name: str) -> Database:
    """The Database of SQLAlchemy's dialect name `name`; UnsupportedDatabase, before any SQL,
    for a database the outbox does not run on."""
    found = DATABASES.get(name)
    if found is None:
        raise UnsupportedDatabase(
            f"the outbox runs on PostgreSQL, MySQL/MariaDB and SQLite, not {name}"
        )
    return found
