"""The statements built from relay/store/sql/*.sql are the ones the dialects ran before their SQL
moved there: for every dialect, dead-key mode and circuit scope, the same text (whitespace aside),
the same typed binds and the same typed result columns as sql_before.json records.

`python -m tests.unit.test_sql_files` writes that file from the code as it is (it was written
before the move, from the Python strings).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import BindParameter, TextClause, TextualSelect

from relay.core.resources import SCOPES
from relay.store import common, mysql, postgres, queries, sqlite
from relay.store.databases import DIALECTS, dialect_for
from relay.store.dialect import STATEMENTS, Compiled, Dialect, Query, Statements, build

BEFORE = Path(__file__).with_name("sql_before.json")
# The dialects whose statements are built from .sql files.
CONVERTED = tuple(DIALECTS)


def normal(sql: str) -> str:
    return " ".join(sql.split())


def described(clause: Compiled) -> dict[str, Any]:
    """A compiled statement as text, its typed binds and its typed result columns."""
    text = clause.element if isinstance(clause, TextualSelect) else clause
    assert isinstance(text, TextClause)
    binds: dict[str, BindParameter[Any]] = text._bindparams
    typed = sorted(
        f"{name}: {p.type!r}{' expanding' if p.expanding else ''}"
        for name, p in binds.items()
        if p.expanding or type(p.type).__name__ != "NullType"
    )
    columns = (
        [f"{c.key}: {c.type!r}" for c in clause.selected_columns]
        if isinstance(clause, TextualSelect)
        else []
    )
    return {"sql": normal(text.text), "binds": typed, "columns": columns}


def own_statements(dialect: Dialect) -> Iterator[tuple[str, Compiled]]:
    """The compiled statements a dialect keeps for its own methods."""
    for name, value in sorted(vars(dialect).items()):
        if isinstance(value, TextClause | TextualSelect):
            yield name, value
        elif isinstance(value, tuple) and all(
            isinstance(v, TextClause | TextualSelect) for v in value
        ):
            for i, v in enumerate(value):
                yield f"{name}[{i}]", v
    if isinstance(dialect, mysql.Mysql):
        for heads in (1, 2, 3):
            yield f"_followers_of({heads})", dialect._followers_of(heads)


# Texts run as they are, outside a store's compiled statements: by other modules (the console's
# charts, retention, counting, wake-ups) and on a connection (session settings).
MODULE_TEXTS: dict[str, Callable[[], str]] = {
    "postgres.PUBLISHED_PER_MINUTE": lambda: postgres.PUBLISHED_PER_MINUTE,
    "postgres.FAILED_PER_MINUTE": lambda: postgres.FAILED_PER_MINUTE,
    "postgres.PURGE_BATCH": lambda: postgres.PURGE_BATCH,
    "postgres.COUNT_ELIGIBLE": lambda: postgres.COUNT_ELIGIBLE,
    "postgres.TABLE_SIZE": lambda: postgres.SQL.text("table_size"),
    "postgres.TABLE_SHARES": lambda: postgres.SQL.text("table_shares"),
    "postgres.NO_PARALLEL": lambda: postgres.NO_PARALLEL,
    "postgres.READ_SNAPSHOT": lambda: postgres.READ_SNAPSHOT,
    "postgres.LISTEN": lambda: postgres.LISTEN,
    "postgres.NOTIFY_PROBE": lambda: postgres.NOTIFY_PROBE,
    "postgres.BACKEND": lambda: postgres.BACKEND,
    "sqlite.PUBLISHED_PER_MINUTE": lambda: sqlite.PUBLISHED_PER_MINUTE,
    "sqlite.FAILED_PER_MINUTE": lambda: sqlite.FAILED_PER_MINUTE,
    "sqlite.PURGE_MESSAGES": lambda: sqlite.PURGE_MESSAGES,
    "sqlite.COUNT_ELIGIBLE": lambda: sqlite.COUNT_ELIGIBLE,
    "mysql.PUBLISHED_PER_MINUTE": lambda: mysql.PUBLISHED_PER_MINUTE,
    "mysql.FAILED_PER_MINUTE": lambda: mysql.FAILED_PER_MINUTE,
    "mysql.MARIADB_TIMEOUT": lambda: mysql.MARIADB_TIMEOUT,
    "mysql.MYSQL_TIMEOUT": lambda: mysql.MYSQL_TIMEOUT,
    "common.COUNT_OPEN": lambda: common.COUNT_OPEN,
    "common.COUNT_SETTLED": lambda: common.COUNT_SETTLED,
    "common.EXCHANGE_OPEN": lambda: common.EXCHANGE_OPEN,
    "common.EXCHANGE_SETTLED": lambda: common.EXCHANGE_SETTLED,
}


# Which module's texts each backend owns (common's are everyone's).
MODULES = {"postgresql": "postgres", "sqlite": "sqlite", "mysql": "mysql", "mariadb": "mysql"}


def every_statement(backends: Iterable[str] = DIALECTS) -> dict[str, dict[str, Any]]:
    """Every statement of these dialects in every configuration, by
    `backend/dead-key mode/scope/name`, and their modules' texts (and common's) by
    `module.NAME`."""
    found: dict[str, dict[str, Any]] = {}
    modules = {"common"}
    for backend in sorted(backends):
        cls = DIALECTS[backend]
        modules.add(MODULES[backend])
        for attribute in ("begin", "listen", "on_connect", "statement_timeout", "relaxed_commit"):
            found[f"{backend}.{attribute}"] = {"sql": repr(getattr(cls, attribute))}
        for hold in (True, False):
            for scope in SCOPES:
                dialect = dialect_for(backend, hold=hold, scope=scope)
                prefix = f"{backend}/{'hold' if hold else 'skip'}/{scope}/"
                for field in dataclasses.fields(Statements):
                    found[prefix + field.name] = described(getattr(dialect.sql, field.name))
                for name, clause in own_statements(dialect):
                    found[prefix + name] = described(clause)
    for name, text in MODULE_TEXTS.items():
        if name.split(".")[0] in modules:
            found[name] = {"sql": normal(text())}
    return found


def recorded_backends(names: Iterable[str]) -> set[str]:
    return {name.split("/")[0] for name in names if "/" in name}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def stored(statements: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The statements with each distinct text, and each distinct set of typed binds and columns,
    written once (by its digest): most are the same in every configuration."""
    texts: dict[str, str] = {}
    shapes: dict[str, dict[str, Any]] = {}
    by_name: dict[str, str] = {}
    for name, found in statements.items():
        shape = {k: v for k, v in found.items() if k != "sql"}
        text, form = _digest(found["sql"]), _digest(shape)
        texts[text], shapes[form] = found["sql"], shape
        by_name[name] = f"{text} {form}"
    return {"statements": by_name, "texts": texts, "shapes": shapes}


def loaded() -> dict[str, dict[str, Any]]:
    data = json.loads(BEFORE.read_text())
    found: dict[str, dict[str, Any]] = {}
    for name, digests in data["statements"].items():
        text, form = digests.split()
        found[name] = {"sql": data["texts"][text], **data["shapes"][form]}
    return found


def test_every_statement_is_the_one_the_python_strings_built() -> None:
    before = loaded()
    now = every_statement(recorded_backends(before))
    assert sorted(now) == sorted(before)
    for name, found in now.items():
        assert found == before[name], name


# --------------------------------------------------------------------------- the loader

FILE = """
-- what the file is about
-- first --
-- Why it is so.
SELECT {{part}} FROM t  -- stays
-- a note between the lines, for the reader
WHERE {{where}}

-- part --
a,
b
"""


def test_a_block_is_its_sql_without_the_readers_comments() -> None:
    blocks = queries.parse(FILE, "x.sql")
    assert list(blocks) == ["first", "part"]
    assert blocks["first"].comment == "Why it is so.\na note between the lines, for the reader"
    assert blocks["first"].text == "SELECT {{part}} FROM t  -- stays\nWHERE {{where}}"


def test_placeholders_take_fill_then_configuration_then_blocks_indented() -> None:
    sql = queries.Queries(queries.parse(FILE, "x.sql"))
    text, taken = sql.expand("first", {"where": "x = :x"}, {"unused": "1"})
    assert text == "SELECT a,\nb FROM t  -- stays\nWHERE x = :x"
    assert taken == set()
    assert sql.used == {"first", "part"}
    assert sql.expand("first", {}, {"where": "{{part}}"})[1] == {"where"}


@pytest.mark.parametrize(
    ("fill", "error"),
    [
        ({}, "nothing fills {{where}}"),
        ({"where": "1", "other": "2"}, "nothing in it takes ['other']"),
        ({"where": "1", "part": "2"}, "['part'] name blocks"),
        ({"where": "{{first}}"}, "first -> where -> first: a fragment that holds itself"),
    ],
)
def test_a_placeholder_nothing_fills_or_a_value_nothing_takes_is_an_error(
    fill: dict[str, str], error: str
) -> None:
    sql = queries.Queries(queries.parse(FILE, "x.sql"))
    with pytest.raises(queries.QueryError, match=re.escape(error)):
        sql.expand("first", fill, {})


def test_a_block_name_means_one_text() -> None:
    with pytest.raises(queries.QueryError, match="'part' is defined twice"):
        queries.parse(FILE + "\n-- part --\nc\n", "x.sql")
    with pytest.raises(queries.QueryError, match=re.escape("is in common.sql and common.sql")):
        queries.load("common", "common")
    with pytest.raises(queries.QueryError, match="no SQL"):
        queries.parse("-- empty --\n-- only a comment\n", "x.sql")


def test_a_configuration_no_statement_takes_is_an_error() -> None:
    sql = queries.Queries(queries.parse(FILE, "x.sql"))
    with pytest.raises(queries.QueryError, match=re.escape("configuration's ['scope']")):
        build(sql, {"s": Query("part")}, {"scope": "exchange"})


def test_every_statement_sqlstore_runs_has_its_block() -> None:
    assert set(STATEMENTS) == {f.name for f in dataclasses.fields(Statements)}


def test_every_block_of_every_file_is_used() -> None:
    for backend in CONVERTED:
        for hold in (True, False):
            for scope in SCOPES:
                dialect_for(backend, hold=hold, scope=scope)
    used = set(common._SQL.used)
    for backend in CONVERTED:
        module = DIALECTS[backend].queries
        used |= module.used
        own = {n for n, b in module.blocks.items() if b.file != "common.sql"}
        assert own <= module.used, sorted(own - module.used)
    assert set(queries.read("common")) <= used, sorted(set(queries.read("common")) - used)


if __name__ == "__main__":
    # Record these backends (all by default) as the code builds them now, keeping the others.
    wanted = sys.argv[1:] or sorted(DIALECTS)
    found = every_statement(wanted)
    if BEFORE.exists():
        kept = loaded()
        found = {**{n: s for n, s in kept.items() if n not in found}, **found}
    BEFORE.write_text(json.dumps(stored(found), indent=1, sort_keys=True) + "\n")
