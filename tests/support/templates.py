"""The outbox schema, migrated once per session and cloned into each test's own database, instead
of migrating every test's from nothing:

- PostgreSQL: the first test's schema is migrated for real, and the statements the migration ran
  (its DDL and the version rows; not its reads) are recorded; every later test's empty schema gets
  them replayed in one transaction. The per-test schema stays what isolates tests (a database per
  test would change every URL the tests hand around).
- MariaDB: a template database migrated once, and `CREATE TABLE ... LIKE` (indexes, options,
  AUTO_INCREMENT) plus its rows into each test's database.
- SQLite: a template file migrated once, copied to the test's path.

The first clone of each kind is checked with outbox.migrate.inspect_schema (what `migrate --check`
reports): no gap, and this version recorded. A target that is not empty is migrated for real, as
is every schema a test migrates itself (the tests of migration never come here).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect
from sqlalchemy.engine import URL

import outbox
from outbox.migrate import inspect_schema
from outbox.schema import SCHEMA_VERSION


class Templates:
    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._statements: list[tuple[str, Any]] | None = None  # PostgreSQL: what migrate ran
        self._mysql: tuple[URL, str, list[str]] | None = None  # the template: URL, name, tables
        self._sqlite: Path | None = None
        self._checked: set[str] = set()

    def migrate(self, engine: Engine) -> None:
        """Give the empty schema, database or file `engine` points at the outbox schema."""
        dialect = engine.dialect.name
        if not self._empty(engine):
            outbox.create_schema(engine)
            return
        if dialect == "postgresql":
            if self._statements is None:
                self._statements = _recorded(engine)
                return
            with engine.begin() as conn:
                for statement, parameters in self._statements:
                    conn.exec_driver_sql(statement, parameters)
        elif dialect in ("mysql", "mariadb"):
            self._like(engine)
        elif dialect == "sqlite":
            self._copy(engine)
        else:
            outbox.create_schema(engine)
            return
        if dialect not in self._checked:
            self._checked.add(dialect)
            with engine.connect() as conn:
                _check(conn)

    def close(self) -> None:
        """Drop the MariaDB template (the SQLite one goes with pytest's temporary files)."""
        if self._mysql is not None:
            url, template, _ = self._mysql
            engine = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1)
            with engine.connect() as conn:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{template}`")
            engine.dispose()

    @staticmethod
    def _empty(engine: Engine) -> bool:
        if engine.dialect.name == "sqlite":
            path = engine.url.database
            return path is not None and (not Path(path).exists() or Path(path).stat().st_size == 0)
        with engine.connect() as conn:
            return not inspect(conn).get_table_names()

    def _like(self, engine: Engine) -> None:
        if self._mysql is None:
            template = f"t_tmpl_{uuid.uuid4().hex[:12]}"
            with engine.connect() as conn:
                conn.exec_driver_sql(f"CREATE DATABASE `{template}` CHARACTER SET utf8mb4")
            url = engine.url.set(database=template)
            migrated = create_engine(url)
            try:
                outbox.create_schema(migrated)
                with migrated.connect() as conn:
                    self._mysql = (url, template, inspect(conn).get_table_names())
            finally:
                migrated.dispose()
        _, template, tables = self._mysql
        with engine.begin() as conn:
            for table in tables:
                source, copy = f"`{template}`.`{table}`", f"`{engine.url.database}`.`{table}`"
                conn.exec_driver_sql(f"CREATE TABLE {copy} LIKE {source}")
                conn.exec_driver_sql(f"INSERT INTO {copy} SELECT * FROM {source}")

    def _copy(self, engine: Engine) -> None:
        if self._sqlite is None:
            self._sqlite = self._directory / "outbox.db"
            migrated = create_engine(f"sqlite:///{self._sqlite}")
            try:
                outbox.create_schema(migrated)
            finally:
                migrated.dispose()
        assert engine.url.database is not None
        shutil.copyfile(self._sqlite, engine.url.database)


def _recorded(engine: Engine) -> list[tuple[str, Any]]:
    """Migrate `engine`'s schema for real; the statements it ran that change anything."""
    statements: list[tuple[str, Any]] = []

    def record(_conn: Connection, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().split(None, 1)[0].upper() not in ("SELECT", "SHOW", "WITH"):
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        outbox.create_schema(engine)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return statements


def _check(conn: Connection) -> None:
    shape = inspect_schema(conn)
    assert (shape.version, shape.gaps) == (SCHEMA_VERSION, ()), (
        f"a cloned outbox schema is not what migrate makes: {shape}"
    )
