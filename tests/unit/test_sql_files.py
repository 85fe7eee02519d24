"""The loader of relay/store/sql/*.sql (relay/store/queries.py) and the typed statements built from
them (relay/store/statements.py): blocks, placeholders, configuration, and every block used."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Annotated

import pytest

from relay.core.resources import SCOPES
from relay.store import common, queries
from relay.store.databases import DIALECTS, dialect_for
from relay.store.statements import Compiled, Driven, Query, Statements, build, queries_of

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
    assert sql.expand("first", {}, {"where": "x"})[1] == {"where"}


@pytest.mark.parametrize(
    ("fill", "error"),
    [
        ({}, "nothing fills {{where}}"),
        ({"where": "1", "other": "2"}, "nothing in it takes ['other']"),
        ({"where": "1", "part": "2"}, "['part'] name blocks"),
        ({"where": "{{part}}"}, "the values of ['where'] hold placeholders, not SQL"),
    ],
)
def test_a_placeholder_nothing_fills_or_a_value_nothing_takes_is_an_error(
    fill: dict[str, str], error: str
) -> None:
    sql = queries.Queries(queries.parse(FILE, "x.sql"))
    with pytest.raises(queries.QueryError, match=re.escape(error)):
        sql.expand("first", fill, {})


def test_a_fragment_that_holds_itself_is_an_error() -> None:
    sql = queries.Queries(queries.parse("-- a --\nx {{b}}\n-- b --\ny {{a}}\n", "x.sql"))
    with pytest.raises(queries.QueryError, match="a -> b -> a: a fragment that holds itself"):
        sql.expand("a", {}, {})


def test_a_block_name_means_one_text() -> None:
    with pytest.raises(queries.QueryError, match="'part' is defined twice"):
        queries.parse(FILE + "\n-- part --\nc\n", "x.sql")
    with pytest.raises(queries.QueryError, match=re.escape("is in common.sql and common.sql")):
        queries.load("common", "common")
    with pytest.raises(queries.QueryError, match="no SQL"):
        queries.parse("-- empty --\n-- only a comment\n", "x.sql")


@dataclass(frozen=True, slots=True)
class Part:
    part: Annotated[Compiled, Query("part")]
    first: Annotated[str, Query("first", fill={"where": "x = :x"})]


def test_a_field_is_compiled_from_its_block_or_kept_as_text() -> None:
    built = build(Part, queries.Queries(queries.parse(FILE, "x.sql")), {})
    assert str(built.part) == "a,\nb"
    assert built.first == "SELECT a,\nb FROM t  -- stays\nWHERE x = :x"


def test_a_configuration_no_statement_takes_is_an_error() -> None:
    sql = queries.Queries(queries.parse(FILE, "x.sql"))
    with pytest.raises(queries.QueryError, match=re.escape("configuration's ['scope']")):
        build(Part, sql, {"scope": "exchange"})


def test_every_statement_names_its_block() -> None:
    for dialect in DIALECTS.values():
        found = queries_of(dialect.statements)
        assert set(queries_of(Statements)) <= set(found)
        assert all(query.block in dialect.queries.blocks for query, _ in found.values())


def test_every_block_of_every_file_is_used() -> None:
    for backend in DIALECTS:
        for hold in (True, False):
            for scope in SCOPES:
                dialect_for(backend, hold=hold, scope=scope).texts()
    used = set(common._SQL.used)
    for backend in DIALECTS:
        module = DIALECTS[backend].queries
        used |= module.used
        own = {n for n, b in module.blocks.items() if b.file != "common.sql"}
        assert own <= module.used, sorted(own - module.used)
    assert set(queries.read("common")) <= used, sorted(set(queries.read("common")) - used)


def test_the_driver_parses_each_driven_statement_once() -> None:
    # psycopg parses a statement's text (its %(name)s binds) on every run unless the text is
    # short enough to cache the parse: the claim runs at every turn of the loop.
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    for hold in (True, False):
        for scope in SCOPES:
            sql = dialect_for("postgresql", hold=hold, scope=scope).sql
            driven = {f.name: getattr(sql, f.name) for f in fields(sql)}
            driven = {name: v for name, v in driven.items() if isinstance(v, Driven)}
            assert "claim" in driven
            for name, statement in driven.items():
                sent = statement.pyformat
                assert len(sent) <= MAX_CACHED_STATEMENT_LENGTH, (name, len(sent))
                # Only the indentation goes: each line, and so each `--` comment, stays whole.
                lines = sent.splitlines()
                assert len(lines) == len(statement.sql.strip().splitlines()), name
                assert all(line == line.lstrip() for line in lines), name
