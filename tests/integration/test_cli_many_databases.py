"""`status`, `migrate`, `messages` and `show` given several databases (`--db` repeated, or a
`--db-file` of `URL` and `NAME = URL` lines): each database answers under its name, on SQLite
files, a PostgreSQL database of the test's own, a PostgreSQL schema (a tenant named after it) and
a MariaDB database; one that cannot be reached says why, the others still answer, and the exit
code is 1. With one database, the answer is the one-database answer, unkeyed.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, update
from sqlalchemy.engine import make_url

import outbox
from outbox.schema import SCHEMA_VERSION, message
from relay.runtime.tenancy import name_of
from tests.support.cli import UNREACHABLE_DB, in_process
from tests.support.db import PG_ADMIN_URL, make_app_engine, pg_schema

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

UP_TO_DATE = f"outbox schema is up to date (version {SCHEMA_VERSION}, recorded)"


@pytest.fixture
def pg_database(pg_admin: Engine) -> Iterator[str]:
    """A URL on a PostgreSQL database of this test's own, empty; dropped at the end."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


def sqlite(tmp_path: Path, name: str) -> str:
    return f"sqlite:///{tmp_path / name}.db"


def migrated(*urls: str) -> None:
    """Migrate each of `urls` alone (the one-database command, tested elsewhere)."""
    for url in urls:
        code, _, err = in_process("--db", url, "migrate")
        assert code == 0, err


def put(
    url: str, exchange: str, created: dt.datetime | None = None, delay: dt.timedelta | None = None
) -> uuid.UUID:
    """One message in `url`'s outbox, created at `created` when given."""
    engine = make_app_engine(url)
    try:
        with engine.begin() as conn:
            made = outbox.enqueue(
                conn, exchange=exchange, routing_key="rk", payload={}, delay=delay
            )
            if created is not None:
                conn.execute(update(message).where(message.c.id == made).values(created_at=created))
        return made
    finally:
        engine.dispose()


def db_args(*urls: str) -> list[str]:
    return [arg for url in urls for arg in ("--db", url)]


def logged_names(stderr: str) -> list[str]:
    """The database each schema.migrated line names, in order."""
    return [
        line.rsplit(" database=", 1)[1] for line in stderr.splitlines() if "schema.migrated" in line
    ]


def test_migrate_with_repeated_db_migrates_each_database(
    tmp_path: Path, pg_database: str, pg_url: str, mysql_url: str
) -> None:
    urls = [sqlite(tmp_path, "alpha"), pg_database, pg_url, mysql_url]
    names = [
        "alpha",
        make_url(pg_database).database,
        pg_schema(pg_url),
        make_url(mysql_url).database,
    ]

    code, out, err = in_process(*db_args(*urls), "migrate", "--check")
    assert code == 1
    for name in names:  # each one's missing tables, under its name
        assert f"{name}: missing table outbox_message" in out.splitlines()
        assert f"the outbox schema of {name} (no recorded version) differs" in err

    code, out, err = in_process(*db_args(*urls), "migrate")
    assert (code, out) == (0, ""), err
    assert logged_names(err) == names

    code, out, err = in_process(*db_args(*urls), "migrate", "--check")
    assert (code, out.splitlines(), err) == (0, [f"{name}: {UP_TO_DATE}" for name in names], "")
    for url in urls:  # and each alone agrees
        assert in_process("--db", url, "migrate", "--check") == (0, UP_TO_DATE + "\n", "")


def test_a_db_file_names_its_databases(tmp_path: Path, pg_database: str, pg_url: str) -> None:
    unnamed = sqlite(tmp_path, "unnamed")
    listed = tmp_path / "databases"
    listed.write_text(
        "# the tenants\n"
        f"shop = {sqlite(tmp_path, 'alpha')}\n"
        "\n"
        f"  billing = {pg_database}   # a database of its own\n"
        f"{pg_url}\n"
        f"{unnamed}\n"
    )
    names = ["shop", "billing", pg_schema(pg_url), "unnamed"]
    assert name_of(make_url(pg_url)) == pg_schema(pg_url)  # a tenant is named after its schema

    code, _, err = in_process("--db-file", str(listed), "migrate")
    assert code == 0, err
    assert logged_names(err) == names

    put(pg_database, "billing.events")
    code, out, err = in_process("--db-file", str(listed), "status", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert list(report) == names
    assert [report[name]["pending"] for name in names] == [0, 1, 0, 0]
    assert report["billing"]["exchanges"][0]["exchange"] == "billing.events"


def test_status_reports_each_database_under_its_name(tmp_path: Path, pg_url: str) -> None:
    alpha, beta = sqlite(tmp_path, "alpha"), sqlite(tmp_path, "beta")
    migrated(alpha, beta, pg_url)
    put(alpha, "a")
    put(alpha, "a")
    put(pg_url, "p")
    urls = [alpha, beta, pg_url]
    names = ["alpha", "beta", pg_schema(pg_url)]

    code, out, err = in_process(*db_args(*urls), "status", "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert list(report) == names
    assert [report[name]["pending"] for name in names] == [2, 0, 1]
    for name, url in zip(names, urls, strict=True):  # each entry is that database's own report
        alone = json.loads(in_process("--db", url, "status", "--json")[1])
        assert report[name].keys() == alone.keys()
        assert report[name]["pending"] == alone["pending"]

    code, out, err = in_process(*db_args(*urls), "status")
    assert (code, err) == (0, "")
    sections = out.split("\n\n== ")
    assert [s.removeprefix("== ").split(" ==\n")[0] for s in sections] == names
    alone = in_process("--db", beta, "status")[1]
    assert f"{sections[1]}\n" == f"beta ==\n{alone}"  # the one-database report, named


def test_an_unreachable_database_is_reported_and_the_others_still_answer(
    tmp_path: Path, pg_url: str
) -> None:
    alpha, beta = sqlite(tmp_path, "alpha"), sqlite(tmp_path, "beta")
    urls = [alpha, UNREACHABLE_DB, beta, pg_url]  # one that fails before others: they still run

    code, out, err = in_process(*db_args(*urls), "migrate")
    assert (code, out) == (1, "")
    assert logged_names(err) == ["alpha", "beta", pg_schema(pg_url)]
    (failed,) = [line for line in err.splitlines() if "schema.migrated" not in line]
    assert failed.startswith("outbox-relay: migrate failed for x: ")
    assert "127.0.0.1" in failed
    assert "Traceback" not in err

    code, out, err = in_process(*db_args(*urls), "status", "--json")
    assert code == 1
    report = json.loads(out)
    assert list(report) == ["alpha", "x", "beta", pg_schema(pg_url)]
    assert list(report["x"]) == ["error"]
    assert "is not reachable" in report["x"]["error"]
    assert all(report[name]["pending"] == 0 for name in ("alpha", "beta", pg_schema(pg_url)))

    code, out, _ = in_process(*db_args(*urls), "status")
    assert code == 1
    assert f"\n\n== x ==\nerror: {report['x']['error']}\n\n== beta ==\npending " in out

    put(beta, "b")
    code, out, err = in_process(*db_args(*urls), "messages", "--json")
    assert code == 1
    assert [row["database"] for row in json.loads(out)] == ["beta"]
    assert err.startswith("outbox-relay: messages failed for x: ")


def test_messages_lists_every_database_newest_first_with_its_name(
    tmp_path: Path, pg_database: str
) -> None:
    alpha = sqlite(tmp_path, "alpha")
    migrated(alpha, pg_database)
    pg_name = make_url(pg_database).database
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    oldest = put(alpha, "orders", start)
    middle = put(pg_database, "orders", start + dt.timedelta(minutes=1))
    newest = put(alpha, "audit", start + dt.timedelta(minutes=2))
    both = db_args(alpha, pg_database)

    code, out, err = in_process(*both, "messages", "--json")
    assert (code, err) == (0, "")
    rows = json.loads(out)
    assert [(r["database"], r["id"]) for r in rows] == [
        ("alpha", str(newest)), (pg_name, str(middle)), ("alpha", str(oldest))
    ]  # fmt: skip
    assert next(iter(rows[0])) == "database"  # the row named first

    code, out, err = in_process(*both, "messages")
    assert (code, err) == (0, "")
    header, *lines = out.splitlines()
    assert header.split()[:3] == ["DATABASE", "ID", "STATE"]
    assert [line.split()[:2] for line in lines] == [
        ["alpha", str(newest)], [pg_name, str(middle)], ["alpha", str(oldest)]
    ]  # fmt: skip

    # Filters apply in each database; --limit to the list of them all.
    code, out, _ = in_process(*both, "messages", "--json", "--exchange", "orders")
    assert [r["id"] for r in json.loads(out)] == [str(middle), str(oldest)]
    code, out, err = in_process(*both, "messages", "--limit", "2")
    assert [line.split()[1] for line in out.splitlines()[1:]] == [str(newest), str(middle)]
    assert err == "(first 2; raise --limit for more)\n"


def test_show_finds_the_database_that_holds_the_message(tmp_path: Path, pg_database: str) -> None:
    alpha = sqlite(tmp_path, "alpha")
    migrated(alpha, pg_database)
    pg_name = make_url(pg_database).database
    held = put(pg_database, "orders")
    urls = [alpha, UNREACHABLE_DB, pg_database]

    code, out, err = in_process(*db_args(*urls), "show", str(held), "--json")
    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert (shown["database"], shown["id"], shown["exchange"]) == (pg_name, str(held), "orders")

    code, out, _ = in_process(*db_args(*urls), "show", str(held))
    assert code == 0
    first, second = out.splitlines()[:2]
    assert first.split() == ["database", pg_name]
    assert second.split() == ["id", str(held)]
    alone = in_process("--db", pg_database, "show", str(held))[1]
    assert out == first + "\n" + alone  # the one-database answer, named

    unknown = uuid.uuid4()
    code, out, err = in_process(*db_args(*urls), "show", str(unknown))
    assert (code, out) == (1, "")
    failed, missing = err.splitlines()
    assert failed.startswith("outbox-relay: show failed for x: ")
    assert missing == (
        f"outbox-relay: show: no message with id {unknown} in the databases that answered"
    )


def test_one_database_in_a_file_answers_as_one_database(tmp_path: Path, pg_url: str) -> None:
    migrated(pg_url)
    made = put(pg_url, "orders", delay=dt.timedelta(days=1))  # no age that changes between runs
    listed = tmp_path / "databases"
    listed.write_text(f"tenant = {pg_url}\n")
    for argv in (
        ["status", "--json"],
        ["status"],
        ["messages"],
        ["messages", "--json"],
        ["show", str(made)],
        ["migrate", "--check"],
    ):
        alone = in_process("--db", pg_url, *argv)
        assert in_process("--db-file", str(listed), *argv) == alone, argv
        assert alone[0] == 0, alone
    assert "DATABASE" not in in_process("--db", pg_url, "messages")[1]


def test_commands_that_take_one_database_still_refuse_several(tmp_path: Path) -> None:
    code, out, err = in_process(*db_args(sqlite(tmp_path, "a"), sqlite(tmp_path, "b")), "cancel",
                                str(uuid.uuid4()))  # fmt: skip
    assert (code, out) == (2, "")
    assert "cancel takes one database" in err
