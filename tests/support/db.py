"""The databases: a PostgreSQL schema, a MariaDB database or a SQLite file of each test's own.

- `pg_url`: a fresh PostgreSQL schema (`t_<random>`), as a URL whose `search_path` points at it,
  so every engine and subprocess given the URL lands in that schema. Dropped CASCADE at teardown.
- `mysql_url`: a fresh MariaDB database (`t_<random>`, utf8mb4), dropped at teardown.
- `sqlite_url`: a SQLite file in the test's `tmp_path`.
- `db_url`: each of the above, one after the other (for behaviour that must hold on all three).
- `app_engine`: an application-side engine on `db_url` with the outbox schema created (cloned
  from one migrated once per session: tests/support/templates.py).

When a server is not reachable, the tests that need it fail with one line saying so: a silently
skipped integration suite would look green. OUTBOX_TEST_PG_URL and OUTBOX_TEST_MYSQL_URL point the
tests at other servers (MySQL 8 runs the MariaDB tests).
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.engine import make_url

from outbox.schema import message
from relay.store.sql_store import SqlStore, open_store
from tests.support.templates import Templates

# A database the tests may create schemas in, and a server they may create databases in.
PG_ADMIN_URL = os.environ.get("OUTBOX_TEST_PG_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
MYSQL_ADMIN_URL = os.environ.get(
    "OUTBOX_TEST_MYSQL_URL", "mariadb+pymysql://root@127.0.0.1:3306/test"
)


def row_count(engine: Engine, **where: object) -> int:
    """Rows of the outbox table, optionally filtered by column values (`state="pending"`)."""
    stmt = select(func.count()).select_from(message)
    for column, value in where.items():
        stmt = stmt.where(message.c[column] == value)
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def states(engine: Engine) -> dict[str, int]:
    """Row counts by state."""
    with engine.connect() as conn:
        rows = conn.execute(select(message.c.state, func.count()).group_by(message.c.state))
        return {str(state): int(n) for state, n in rows}


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _admin_engine(url: str, server: str) -> Iterator[Engine]:
    """An autocommit engine on `url`, failing the test in one line if `server` does not answer."""
    engine = create_engine(
        url, isolation_level="AUTOCOMMIT", pool_size=1, connect_args={"connect_timeout": 5}
    )
    problem = None
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:
        problem = _one_line(exc)
    if problem is not None:  # outside the except block: no chained traceback, one line
        engine.dispose()
        pytest.fail(
            f"{server} is not reachable at {url} ({problem}); "
            "start it with scripts/ensure-services.sh",
            pytrace=False,
        )
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An engine on the shared test database, used only to create and drop per-test schemas."""
    yield from _admin_engine(PG_ADMIN_URL, "PostgreSQL")


@pytest.fixture
def pg_url(pg_admin: Engine) -> Iterator[str]:
    """A SQLAlchemy URL on a PostgreSQL schema of this test's own (search_path points at it)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    options = urllib.parse.quote(f"-csearch_path={schema}", safe="")
    yield f"{PG_ADMIN_URL}?options={options}"
    with pg_admin.connect() as conn:
        # Fail rather than hang if something the test started still holds a lock in the schema.
        conn.exec_driver_sql("SET lock_timeout = '10s'")
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def pg_schema(url: str) -> str:
    """The schema a `pg_url` points at."""
    options = make_url(url).query["options"]
    assert isinstance(options, str)
    return options.removeprefix("-csearch_path=")


@pytest.fixture(scope="session")
def mysql_admin() -> Iterator[Engine]:
    """An engine on the MariaDB server, used only to create and drop per-test databases."""
    yield from _admin_engine(MYSQL_ADMIN_URL, "MariaDB")


@pytest.fixture
def mysql_url(mysql_admin: Engine) -> Iterator[str]:
    """A SQLAlchemy URL on a MariaDB database of this test's own."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with mysql_admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    yield make_url(MYSQL_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with mysql_admin.connect() as conn:
        # Fail rather than hang if something the test started still holds a lock in it.
        conn.exec_driver_sql("SET SESSION lock_wait_timeout = 10")
        conn.exec_driver_sql(f"DROP DATABASE `{name}`")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLAlchemy URL on a SQLite file in this test's tmp_path."""
    return f"sqlite:///{tmp_path / 'test.db'}"


DB_FIXTURES = {"postgresql": "pg_url", "mariadb": "mysql_url", "sqlite": "sqlite_url"}


@pytest.fixture(params=list(DB_FIXTURES))
def db_url(request: pytest.FixtureRequest) -> str:
    """`pg_url`, `mysql_url` or `sqlite_url`: tests using it run once on each database."""
    return str(request.getfixturevalue(DB_FIXTURES[request.param]))


def make_app_engine(url: str) -> Engine:
    """An engine as an application would build it (not the relay's autocommit one)."""
    if url.startswith("sqlite"):
        return create_engine(url, connect_args={"timeout": 30})
    return create_engine(url, pool_size=3, max_overflow=2, connect_args={"connect_timeout": 5})


@pytest.fixture(scope="session")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Templates]:
    """The outbox schema migrated once (per xdist worker), to clone into each test's database."""
    made = Templates(tmp_path_factory.mktemp("templates"))
    yield made
    made.close()


def _migrated_app_engine(url: str, templates: Templates) -> Iterator[Engine]:
    engine = make_app_engine(url)
    templates.migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def app_engine(db_url: str, templates: Templates) -> Iterator[Engine]:
    """The application's engine on `db_url`, with the outbox schema as `outbox.create_schema`
    makes it."""
    yield from _migrated_app_engine(db_url, templates)


@pytest.fixture
def pg_engine(pg_url: str, templates: Templates) -> Iterator[Engine]:
    """Like `app_engine`, on PostgreSQL only (for behaviour only PostgreSQL has)."""
    yield from _migrated_app_engine(pg_url, templates)


@pytest.fixture
def store(db_url: str, app_engine: Engine) -> Iterator[SqlStore]:
    """The relay's store on `db_url` (schema already created), closed at teardown."""
    opened = open_store(db_url)
    yield opened
    opened.close()
