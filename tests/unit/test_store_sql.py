"""The store's SQL as text, without a database: every dialect's statements are complete, read the
time through :now, keep the lease guard, and say once what the databases share."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import TextClause

from relay.core.resources import SCOPES
from relay.errors import ConfigError
from relay.store import common, mysql, postgres, queries, sqlite
from relay.store.databases import DIALECTS, database_url, dialect_for
from relay.store.dialect import Dialect
from relay.store.statements import compile_sql, sql_of

STORE = Path(common.__file__).parent
CONFIGS = [(hold, scope) for hold in (True, False) for scope in SCOPES]


def every_statement(dialect: Dialect) -> dict[str, str]:
    """Every statement a dialect runs, by name (`outbox-relay sql` prints the same)."""
    return dialect.texts()


@pytest.mark.parametrize("backend", sorted(DIALECTS))
@pytest.mark.parametrize(("hold", "scope"), CONFIGS)
def test_every_template_is_filled(backend: str, hold: bool, scope: str) -> None:
    for name, sql in every_statement(dialect_for(backend, hold=hold, scope=scope)).items():
        assert "{" not in sql, name
        assert "}" not in sql, name
        assert sql.strip(), name


def test_the_scopes_are_the_cores_and_each_has_its_expression() -> None:
    assert set(common.RESOURCE_PARTS) == set(SCOPES)
    with pytest.raises(ValueError, match="scope"):
        dialect_for("sqlite", scope="queue")


def test_the_blocking_states_and_the_head_check_are_written_once() -> None:
    sources = {p.name: p.read_text() for p in [*STORE.glob("*.py"), *STORE.glob("sql/*.sql")]}
    for literal, home in (("'pending', 'in_flight'", "common.sql"), ("e.seq < ", "sqlite.sql")):
        assert [name for name, text in sources.items() if literal in text] == [home]
    hold = dialect_for("postgresql", hold=True)
    skip = dialect_for("postgresql", hold=False)
    assert "'pending', 'in_flight', 'dead'" in sql_of(hold.sql.unpark_sweep)
    assert "'dead'" not in sql_of(skip.sql.unpark_sweep)


def test_postgresql_reads_its_clock_only_through_now() -> None:
    for name, sql in every_statement(dialect_for("postgresql")).items():
        assert sql.count("now()") == sql.count("coalesce(:now, now())"), name


@pytest.mark.parametrize("backend", ["mysql", "mariadb"])
def test_mysql_reads_its_clock_only_through_now(backend: str) -> None:
    for name, sql in every_statement(dialect_for(backend)).items():
        assert sql.count("UTC_TIMESTAMP") == sql.count(mysql.SQL.text("now")), name
        assert "NOW()" not in sql.upper().replace("UTC_TIMESTAMP", ""), name


def test_sqlite_reads_its_clock_only_through_now() -> None:
    for name, sql in every_statement(dialect_for("sqlite")).items():
        assert sql.count("'now'") == sql.count("coalesce(:now, 'now')") + sql.count(
            "coalesce(:now, strftime('%Y-%m-%d %H:%M:%f000', 'now'))"
        ), name


POSTGRES = every_statement(dialect_for("postgresql"))
SQLITE = every_statement(dialect_for("sqlite"))
MYSQL = every_statement(dialect_for("mysql"))


@pytest.mark.parametrize(
    "sql",
    [
        POSTGRES["mark_published"],
        POSTGRES["release"],
        POSTGRES["settle_failures"],
        SQLITE["mark_rows"],
        SQLITE["release"],
        SQLITE["held"],  # transition_rows then changes only the rows this read found
        SQLITE["keys_of"],
        MYSQL["mark_rows"],
        MYSQL["release"],
        MYSQL["held"],  # transition_rows then changes only the rows this read found and locked
        MYSQL["keys_of"],
    ],
)
def test_every_settlement_is_guarded_by_the_lease(sql: str) -> None:
    assert re.search(r"lease_token = :token\s+AND (m\.)?state = 'in_flight'", sql)


@pytest.mark.parametrize("statements", [POSTGRES, SQLITE, MYSQL])
def test_rows_written_back_are_guarded_by_the_lease_they_were_read_with(
    statements: dict[str, str],
) -> None:
    guard = r"m\.lease_token = d\.token AND m\.state = 'in_flight'"
    assert re.search(guard, statements["transition_rows"])


def test_postgresql_skips_rows_another_relay_has_locked() -> None:
    claim = every_statement(dialect_for("postgresql"))["claim"]
    assert claim.count("FOR UPDATE SKIP LOCKED") == 3  # unkeyed, keyed candidates, runs
    for name in ("stuck_expired", "stuck_abandoned", "stuck_owned"):
        assert "FOR UPDATE SKIP LOCKED" in POSTGRES[name], name
    assert "FOR UPDATE SKIP LOCKED" in POSTGRES["purge_batch"]
    assert "FOR UPDATE" in POSTGRES["lock_resource"]


def test_mysql_skips_rows_another_relay_has_locked_and_reads_them_in_index_order() -> None:
    statements = every_statement(dialect_for("mariadb"))
    for name in ("candidates", "stuck_expired", "stuck_abandoned", "stuck_owned", "doomed"):
        assert "FOR UPDATE SKIP LOCKED" in statements[name], name
    assert "FOR UPDATE" in MYSQL["lock_resource"]
    assert "FORCE INDEX (outbox_message_claim_idx)" in statements["candidates"]
    # The head probe: one index probe per blocking state, never a scan of the key's rows.
    hold = statements["heads"]
    assert hold.count("FORCE INDEX (outbox_message_key_state_idx)") == 3
    assert hold.count("ORDER BY e.seq LIMIT 1") == 3
    skip = every_statement(dialect_for("mariadb", hold=False))["heads"]
    assert skip.count("ORDER BY e.seq LIMIT 1") == 2
    assert "'dead'" not in skip


def test_mysql_quotes_the_reserved_word_key() -> None:
    for name, sql in every_statement(dialect_for("mysql")).items():
        bare = re.findall(r"(?<![.`\w])key(?![`\w])", sql)
        assert not bare, f"{name}: unquoted key"


def test_binds_are_typed_by_their_whole_name() -> None:
    clause = compile_sql("SELECT :token, :tokens, :now, :nowhere")
    assert isinstance(clause, TextClause)
    typed = {name: type(p.type).__name__ for name, p in clause._bindparams.items()}
    assert typed["token"] == "Uuid"
    assert typed["now"] == "DateTime"
    assert typed["tokens"] == typed["nowhere"] == "NullType"


def test_the_comments_name_statements_that_exist() -> None:
    # A statement is a module's name, or a block of the module's .sql file (postgres._CLAIM:
    # postgres.sql's claim).
    modules = {"postgres": postgres, "sqlite": sqlite, "mysql": mysql, "common": common}
    for path in [*STORE.glob("*.py"), *STORE.glob("sql/*.sql")]:
        for module, name in re.findall(
            r"\b(postgres|sqlite|mysql|common)\.([A-Za-z_]+)", path.read_text()
        ):
            if name in ("py", "sql"):  # a file name, not a statement
                continue
            owner = modules[module]
            sql = STORE / "sql" / f"{module}.sql"
            blocks = queries.parse(sql.read_text(), sql.name) if sql.exists() else {}
            found = hasattr(owner, name) or name.lower().lstrip("_") in blocks
            assert found, f"{path.name} names {module}.{name}"


def test_only_the_postgresql_dialect_listens() -> None:
    assert postgres.Postgres.listen == "LISTEN outbox_relay"
    assert sqlite.Sqlite.listen is None
    assert mysql.Mysql.listen is None  # no NOTIFY: MySQL relays poll
    assert mysql.Mariadb.listen is None


# --------------------------------------------------------------------------- URLs


def test_a_bare_url_means_the_driver_this_project_ships() -> None:
    assert database_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert database_url("postgresql+psycopg://u@h/db").drivername == "postgresql+psycopg"
    assert database_url("sqlite:///x.db").drivername == "sqlite"
    assert database_url("mysql://u@h/db").drivername == "mysql+pymysql"
    assert database_url("mariadb://u@h/db").drivername == "mariadb+pymysql"
    assert database_url("mysql+pymysql://u@h/db").drivername == "mysql+pymysql"
    assert database_url("mariadb+pymysql://u@h/db").drivername == "mariadb+pymysql"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (
            "oracle://u@h/db",
            "unsupported database 'oracle' (use postgresql, mysql, mariadb or sqlite)",
        ),
        ("postgresql+psycopg2://u@h/db", "unsupported driver 'postgresql+psycopg2'"),
        ("mysql+mysqldb://u@h/db", "unsupported driver 'mysql+mysqldb' (use mysql+pymysql)"),
        ("not a url :secret@", "cannot parse the database URL"),
    ],
)
def test_urls_the_store_cannot_open_are_refused_in_one_line(url: str, words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)) as refused:
        database_url(url)
    assert "\n" not in str(refused.value)
    assert "secret" not in str(refused.value)
