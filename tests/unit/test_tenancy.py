"""Several databases for one relay: --db repeated and --db-file, each database named; the names and
the file's mistakes said in one line; commands that take one database refuse several."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relay.cli import main as cli
from relay.cli.options import configure
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig
from relay.runtime.tenancy import Database, databases_of, name_of, parse_db_file
from relay.runtime.urls import parse_db_url

PG = "postgresql+psycopg://relay:secret@db.example:5432/shop"


@pytest.fixture(autouse=True)
def no_outbox_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OUTBOX_")]:
        monkeypatch.delenv(name)


def config(argv: list[str], **environ: str) -> RelayConfig:
    return configure(cli.build_parser().parse_args(argv), environ)


@pytest.mark.parametrize(
    ("url", "name"),
    [
        (PG, "shop"),
        (PG + "?options=-csearch_path%3Dtenant_7", "tenant_7"),
        (PG + "?options=-c%20search_path%3Dtenant_8,public", "tenant_8"),
        ("mariadb+pymysql://root@127.0.0.1:3306/billing", "billing"),
        ("sqlite:////var/lib/tenants/acme.db", "acme"),
        ("sqlite:///relative/globex.sqlite3", "globex"),
        ("sqlite://", "memory"),
    ],
)
def test_a_database_is_named_after_its_schema_database_or_file(url: str, name: str) -> None:
    assert name_of(parse_db_url(url)) == name


def test_a_file_lists_urls_and_named_urls_with_comments_and_blank_lines() -> None:
    text = f"""
# tenants of the EU cluster
{PG}?options=-csearch_path%3Dtenant_1
  acme = sqlite:////data/acme.db   # the big one

globex=sqlite:////data/g.db
"""
    assert parse_db_file(text, "dbs.txt") == [
        Database("tenant_1", f"{PG}?options=-csearch_path%3Dtenant_1"),
        Database("acme", "sqlite:////data/acme.db"),
        Database("globex", "sqlite:////data/g.db"),
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("just words\n", r"dbs.txt:1: expected a database URL or NAME = URL, got 'just words'"),
        ("\n\nbad name! = sqlite:////x.db\n", r"dbs.txt:3: database name 'bad name!'"),
        ("a = nosuch://host/db\n", r"dbs.txt:1: "),
        ("", r"--db-file 'dbs.txt' lists no database"),
        ("# only a comment\n", r"lists no database"),
        ("sqlite:////a/x.db\nsqlite:////b/x.db\n", r"two databases are named 'x': name them"),
        ("a = sqlite:////x.db\nb = sqlite:////x.db\n", r"'a' and 'b' have the same URL"),
    ],
)
def test_a_wrong_file_is_refused_naming_the_line(text: str, error: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=error):
        databases_of([], _write(tmp_path / "dbs.txt", text, chdir=True))


def test_a_password_in_a_bad_url_is_not_echoed(tmp_path: Path) -> None:
    path = _write(tmp_path / "dbs.txt", "t = postgresql+psycopg://u:hunter2@h:notaport/db\n")
    with pytest.raises(ConfigError) as caught:
        databases_of([], path)
    assert "hunter2" not in str(caught.value)
    assert ":1: " in str(caught.value)


def test_db_repeated_gives_every_database_the_first_as_db_url() -> None:
    one = config(["run", "--db", "sqlite:///a.db"])
    assert not one.many_databases
    assert one.databases() == [Database("a", "sqlite:///a.db")]
    many = config(["run", "--db", "sqlite:///a.db", "--db", PG])
    assert many.many_databases
    assert many.db_url == "sqlite:///a.db"
    assert [d.name for d in many.databases()] == ["a", "shop"]


def test_db_file_comes_from_the_flag_or_the_variable(tmp_path: Path) -> None:
    path = _write(tmp_path / "dbs.txt", "x = sqlite:////tmp/x.db\n")
    assert config(["run", "--db-file", path]).databases() == [Database("x", "sqlite:////tmp/x.db")]
    from_env = config(["run"], OUTBOX_DB_FILE=path)
    assert from_env.many_databases
    assert from_env.db_file == path


def test_the_file_is_read_each_time_so_a_reload_sees_its_changes(tmp_path: Path) -> None:
    path = _write(tmp_path / "dbs.txt", "x = sqlite:////tmp/x.db\n")
    cfg = config(["run", "--db-file", path])
    _write(tmp_path / "dbs.txt", "y = sqlite:////tmp/y.db\n")
    assert [d.name for d in cfg.databases()] == ["y"]


def test_a_missing_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--db-file", "/nonexistent/dbs.txt"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["circuits"],
        ["purge", "--older-than", "1d"],
        ["cancel", "00000000-0000-0000-0000-000000000001"],
    ],
)
def test_commands_of_one_database_refuse_several(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*command, "--db", "sqlite:///a.db", "--db", "sqlite:///b.db"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{command[0]} takes one database" in err


def test_a_bad_second_url_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--db", "sqlite:///a.db", "--db", "nosuch://x/y"]) == 2
    err = capsys.readouterr().err
    assert "--db" in err
    assert err.count("\n") == 1


def _write(path: Path, text: str, *, chdir: bool = False) -> str:
    path.write_text(text)
    if chdir:
        os.chdir(path.parent)
        return path.name
    return str(path)
