"""Creating and upgrading the outbox schema, whatever made it.

`upgrade` compares the database with `outbox.metadata` (outbox/shape.py) and closes every gap:
it creates missing tables, indexes and unique constraints, adds missing columns, sets missing
autovacuum settings, rebuilds an index whose definition changed, drops an index a later version
replaced, and records the version. So one path upgrades a schema `migrate` made, completes one
an Alembic migration made from `outbox.metadata` (which records no version), and changes nothing
on a complete one. A future change that adding cannot express (a backfill, a type change) gets a
numbered step of its own here, run before the comparison.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import (
    Connection,
    Engine,
    Index,
    Table,
    func,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.schema import CreateColumn, DropIndex

from outbox import schema
from outbox.errors import OutboxError
from outbox.schema import MYSQL, check_supported
from outbox.shape import Gap, Kind, Shape, structural_gaps


class SchemaConflict(OutboxError):
    """The database has an outbox table that `migrate` cannot complete."""


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
def _settings(params: dict[str, float]) -> list[str]:
    return [f"{name} = {value}" for name, value in params.items()]


def _alter_storage(table: str, settings: list[str]) -> str:
    return f"ALTER TABLE {table} SET ({', '.join(settings)})"


STORAGE_SETTINGS_SQL: tuple[str, ...] = tuple(
    _alter_storage(table, _settings(params)) for table, params in AUTOVACUUM_SETTINGS.items()
)


def storage_settings_sql(dialect: str) -> tuple[str, ...]:
    """The statements that set AUTOVACUUM_SETTINGS on `dialect` ("postgresql", ...): none on a
    database without them. For a migration of your own (outbox.alembic.apply_storage_settings)."""
    return STORAGE_SETTINGS_SQL if dialect == "postgresql" else ()


def apply_storage_settings(conn: Connection) -> None:
    """Set every one of AUTOVACUUM_SETTINGS on the outbox tables (PostgreSQL; nothing on other
    databases), over any value already there. Runs in the caller's transaction, never commits."""
    for statement in storage_settings_sql(conn.dialect.name):
        conn.exec_driver_sql(statement)


# The storage parameters a table has (PostgreSQL), found through the search_path as the
# inspector finds the tables; each is "name=value".
_RELOPTIONS = text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:table)")


def storage_gaps(conn: Connection, tables: frozenset[str]) -> list[Gap]:
    """AUTOVACUUM_SETTINGS parameters the existing outbox tables do not have at all. A value an
    operator chose instead is theirs to keep: only a parameter that is unset is missing."""
    if conn.dialect.name != "postgresql":
        return []
    gaps = []
    for table, params in AUTOVACUUM_SETTINGS.items():
        if table not in tables:
            continue
        options = conn.execute(_RELOPTIONS, {"table": table}).scalar_one_or_none() or []
        have = {option.split("=", 1)[0] for option in options}
        missing = tuple(_settings({k: v for k, v in params.items() if k not in have}))
        if missing:
            gaps.append(Gap(Kind.STORAGE, table, missing))
    return gaps


# MySQL and MariaDB have no partial indexes: the indexes of `outbox.metadata` cover every row
# there, and these two, MySQL's own, take the place of the partial ones on the claim path. The
# claim reads ready rows in claim order under (state, held): the published rows, however many,
# are another range. A key's head probe asks for an earlier row of the key in a blocking state
# (relay/store/mysql.py, is_head): (key, state, seq) answers it without reading the key's
# published rows. DESC needs MySQL 8 or MariaDB 10.8 to be an index order (older MariaDB sorts).
MYSQL_INDEXES: dict[str, str] = {
    "outbox_message_claim_idx": "CREATE INDEX outbox_message_claim_idx ON outbox_message "
    "(state, held, priority DESC, available_at, seq)",
    "outbox_message_key_state_idx": "CREATE INDEX outbox_message_key_state_idx ON outbox_message "
    "(`key`, state, seq)",
}


def mysql_index_gaps(conn: Connection, tables: frozenset[str]) -> list[Gap]:
    """MYSQL_INDEXES that an existing outbox_message lacks (MySQL/MariaDB only)."""
    table = schema.message.name
    if conn.dialect.name not in MYSQL or table not in tables:
        return []
    have = {str(ix["name"]) for ix in inspect(conn).get_indexes(table)}
    return [Gap(Kind.INDEX, table, (name,)) for name in MYSQL_INDEXES if name not in have]


def current_version(conn: Connection) -> int:
    """The highest version `migrate` recorded; 0 when none (never migrated, or made otherwise)."""
    if not inspect(conn).has_table(schema.schema_version.name):
        return 0
    found = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
    return int(found or 0)


def inspect_schema(conn: Connection) -> Shape:
    """The outbox schema on `conn` against what this version needs; changes nothing."""
    tables, gaps = structural_gaps(conn)
    gaps.extend(storage_gaps(conn, tables))
    gaps.extend(mysql_index_gaps(conn, tables))
    return Shape(current_version(conn), tables, tuple(gaps))


def complete(conn: Connection, shape: Shape) -> None:
    """Close every gap of `shape` (in its order: tables first) in the caller's transaction.

    Building an index locks its table against writes (not reads) for as long as the build
    takes: on a large live table, prefer a quiet moment.
    """
    for gap in shape.gaps:
        table = schema.metadata.tables[gap.table]
        if gap.kind is Kind.TABLE:
            table.create(conn)
            if gap.table in AUTOVACUUM_SETTINGS and conn.dialect.name == "postgresql":
                settings = _settings(AUTOVACUUM_SETTINGS[gap.table])
                conn.exec_driver_sql(_alter_storage(gap.table, settings))
            if gap.table == schema.message.name and conn.dialect.name in MYSQL:
                for statement in MYSQL_INDEXES.values():
                    conn.exec_driver_sql(statement)
        elif gap.kind is Kind.COLUMNS:
            for name in gap.names:
                _add_column(conn, table, name)
        elif gap.kind is Kind.UNIQUE:
            _add_unique(conn, table, gap.names)
        elif gap.kind is Kind.INDEX and gap.names[0] in MYSQL_INDEXES:
            conn.exec_driver_sql(MYSQL_INDEXES[gap.names[0]])
        elif gap.kind is Kind.INDEX:
            _index(table, gap.names[0]).create(conn)
        elif gap.kind is Kind.INDEX_DIFFERS:
            index = _index(table, gap.names[0])
            conn.execute(DropIndex(index))
            index.create(conn)
        elif gap.kind is Kind.OBSOLETE_INDEX:
            retired = next(ix for ix in schema.OBSOLETE_INDEXES if ix.name == gap.names[0])
            conn.execute(DropIndex(retired, if_exists=True))
        elif gap.kind is Kind.STORAGE and conn.dialect.name == "postgresql":
            conn.exec_driver_sql(_alter_storage(gap.table, list(gap.names)))


def _add_unique(conn: Connection, table: Table, columns: tuple[str, ...]) -> None:
    # Written out rather than AddConstraint(the metadata's constraint), which marks that shared
    # object so that every later CREATE TABLE of the table would leave the constraint out.
    quote = conn.dialect.identifier_preparer.quote
    listed = ", ".join(quote(column) for column in columns)
    if conn.dialect.name != "sqlite":
        # Unnamed, as CREATE TABLE makes it (and Alembic expects): the database names it.
        conn.exec_driver_sql(f"ALTER TABLE {quote(table.name)} ADD UNIQUE ({listed})")
        return
    # SQLite cannot add a constraint to a table; a unique index enforces the same. Its name is
    # the one PostgreSQL gives an unnamed constraint.
    name = quote(f"{table.name}_{'_'.join(columns)}_key")
    conn.exec_driver_sql(f"CREATE UNIQUE INDEX {name} ON {quote(table.name)} ({listed})")


def _index(table: Table, name: str) -> Index:
    return next(index for index in table.indexes if index.name == name)


def _add_column(conn: Connection, table: Table, name: str) -> None:
    column = table.c[name]
    if not column.nullable and column.server_default is None:
        # No value to give the rows already there; this was never an outbox table's shape.
        raise SchemaConflict(
            f"{table.name} lacks column {name}, which is NOT NULL without a default, so it "
            f"cannot be added: {table.name} was not made from outbox.metadata"
        )
    spec = CreateColumn(column).compile(dialect=conn.dialect)
    conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {spec}")


def upgrade(bind: Engine | Connection) -> int:
    """Bring the outbox schema to this version (create, upgrade or complete it); return the
    version now recorded. Safe to repeat and to race (PostgreSQL and MySQL serialise migrations).
    UnsupportedDatabase, before any SQL, on a database the outbox does not run on."""
    check_supported(bind.dialect.name)
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            return _upgrade(conn)
    return _upgrade(bind)


def _upgrade(conn: Connection) -> int:
    if conn.dialect.name == "postgresql":
        # Two deploys migrating at once must not both create the same table.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('outbox_relay.migrate'))")
    if conn.dialect.name in MYSQL:
        # The same through a named lock: MySQL commits at each DDL statement, so no lock taken
        # inside a transaction would last; this one is the session's, until released.
        with _mysql_lock(conn):
            return _apply(conn)
    return _apply(conn)


MYSQL_LOCK_WAIT = 300  # seconds one migration waits for another to finish


@contextmanager
def _mysql_lock(conn: Connection) -> Iterator[None]:
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


# IGNORE on MySQL: the lock is released before the caller commits, so the next migration may
# record the same versions before this one's rows are visible to it.
_RECORD = (
    insert(schema.schema_version)
    .prefix_with("IGNORE", dialect="mysql")
    .prefix_with("IGNORE", dialect="mariadb")
)


def _apply(conn: Connection) -> int:
    version = current_version(conn)
    if version > schema.SCHEMA_VERSION:
        # A newer outbox migrated this database; what this one calls obsolete or different may
        # be what that one needs.
        return version
    complete(conn, inspect_schema(conn))
    # One row per version the schema now has, as when each version was its own step.
    now = dt.datetime.now(dt.UTC)
    for number in range(version + 1, schema.SCHEMA_VERSION + 1):
        conn.execute(_RECORD.values(version=number, applied_at=now))
    return schema.SCHEMA_VERSION
