"""`outbox.django` in a real Django project (tests/django_project: settings, an app with a model, a
view that saves an order and enqueues in one atomic block, a Django TestCase), run as its users
run it: `manage.py migrate`, a management command driving the view, `manage.py test` (with and
without migrations), `manage.py flush`. Then a real relay publishes what the view committed and a
real consumer reads it from RabbitMQ. On PostgreSQL (psycopg 3), SQLite and MariaDB (PyMySQL
standing in for mysqlclient). tests/integration/test_django_consumer.py runs the project's
consumer on the databases made here (`made_site`).

Django runs in subprocesses, so its settings never reach this process. Each database is made,
migrated once and dropped per module (an xdist group keeps the module on one worker).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, insert, select
from sqlalchemy.engine import make_url

import outbox
from outbox.schema import (
    SCHEMA_VERSION,
    attempt,
    inbox,
    message,
    relay_instance,
    resource,
    schema_version,
)
from tests.docs_blocks import block
from tests.support.broker import Broker
from tests.support.cli import environment, in_process
from tests.support.db import MYSQL_ADMIN_URL, PG_ADMIN_URL, row_count
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.xdist_group("django"),
]

PROJECT = Path(__file__).resolve().parents[1] / "django_project"


@dataclass(frozen=True)
class Site:
    """The project on one database: Django's DATABASES entry and the same place as a URL."""

    database: dict[str, Any]
    url: str
    kind: str = "sqlite"

    def manage(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`python manage.py ARGS` in the project (with `env` added to a clean environment);
        fails the test on a non-zero exit."""
        result = self.try_manage(*args, **env)
        assert result.returncode == 0, (
            f"manage.py {' '.join(args)}:\n{result.stdout}{result.stderr}"
        )
        return result

    def try_manage(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`python manage.py ARGS`, whatever its exit code."""
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=self.environment(**env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def environment(self, **env: str) -> dict[str, str]:
        return environment(SHOP_DATABASE=json.dumps(self.database), **env)


def _server(admin_url: str, engine: str, name: str, kind: str) -> Site:
    u = make_url(admin_url)
    database = {"ENGINE": engine, "NAME": name, "USER": u.username, "HOST": u.host, "PORT": u.port}
    if u.password:
        database["PASSWORD"] = u.password
    return Site(
        database, u.set(database=name, query={}).render_as_string(hide_password=False), kind
    )


@contextmanager
def made_site(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    """The project on a database of its own, migrated by `manage.py migrate`; dropped after,
    with the test database `manage.py test` makes beside it."""
    name = f"dj_{uuid.uuid4().hex[:10]}"
    admin: Engine | None = None
    if kind == "sqlite":
        path = tmp_path_factory.mktemp("django") / "shop.db"
        made = Site(
            {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}, f"sqlite:///{path}"
        )
    elif kind == "postgresql":
        admin = request.getfixturevalue("pg_admin")
        made = _server(PG_ADMIN_URL, "django.db.backends.postgresql", name, kind)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    else:
        admin = request.getfixturevalue("mysql_admin")
        made = _server(MYSQL_ADMIN_URL, "django.db.backends.mysql", name, kind)
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        made.manage("migrate", "--no-input")
        yield made
    finally:
        if admin is not None:
            with admin.connect() as conn:
                for db in (name, f"test_{name}"):
                    if kind == "postgresql":
                        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                    else:
                        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{db}`")


@pytest.fixture(scope="module", params=["postgresql", "sqlite", "mariadb"])
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    """The project on a database of its own (see `made_site`)."""
    with made_site(request.param, request, tmp_path_factory) as made:
        yield made


def test_manage_py_migrate_makes_the_schema_the_relay_checks(site: Site) -> None:
    code, out, err = in_process("migrate", "--check", "--db", site.url)
    assert code == 0, out + err
    engine = create_engine(site.url)
    try:
        with engine.connect() as conn:
            recorded = conn.execute(select(func.max(schema_version.c.version))).scalar()
        assert recorded == SCHEMA_VERSION
    finally:
        engine.dispose()
    assert "No migrations to apply" in site.manage("migrate", "--no-input").stdout


def test_a_view_enqueues_in_its_atomic_block_and_the_relay_publishes_it(
    site: Site, broker: Broker, relay_factory: RelayFactory
) -> None:
    report = json.loads(site.manage("place_orders", SHOP_EXCHANGE=broker.exchange).stdout)
    assert [status for status, _ in report["placed"]] == [201, 201, 400]
    assert "transaction.atomic()" in report["refused"]
    noted, plain = (body["id"] for _, body in report["placed"][:2])
    relay_factory(site.url)
    engine = create_engine(site.url)
    try:
        wait_until(
            lambda: row_count(engine, state="published") == 3,
            timeout=15,
            what="the three committed messages published",
        )
        assert row_count(engine) == 3  # the savepoint's and the refused block's: never written
    finally:
        engine.dispose()
    received = [
        (d.routing_key, json.loads(d.body), (d.properties.headers or {}).get("x-outbox-key"))
        for d in broker.finish()
    ]
    received.sort(key=lambda r: (r[0], r[1]["id"]))
    assert received == [
        ("order.created", {"id": noted, "total": 5}, str(noted)),
        ("order.created", {"id": plain, "total": 7}, str(plain)),
        ("order.noted", {"id": noted}, None),
    ]


def test_manage_py_test_runs_on_the_schema_the_migrations_make(site: Site) -> None:
    result = site.manage("test", "shop", "--no-input")
    assert "Ran 9 tests" in result.stderr
    assert result.stderr.rstrip().splitlines()[-2:] == [
        "OK",
        "Destroying test database for alias 'default'...",
    ]


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("django-settings", "shop/settings.py"),
        ("django-view", "shop/views.py"),
        ("django-test", "shop/tests.py"),
        ("django-transaction-test", "shop/test_transactions.py"),
        ("django-handler", "shop/handlers.py"),
    ],
)
def test_the_guide_shows_the_code_these_tests_run(name: str, source: str) -> None:
    assert block("guides/django.md", name) in (PROJECT / source).read_text()


def test_manage_py_flush_empties_the_outbox_tables_and_keeps_the_schema_version(
    site: Site,
) -> None:
    site.manage("place_orders", SHOP_EXCHANGE="flushed")  # three messages committed
    now = dt.datetime.now(dt.UTC)
    engine = create_engine(site.url)
    try:
        with engine.begin() as conn:
            outbox.process_once(conn, consumer="billing", message_id="m-1")
            conn.execute(
                insert(attempt).values(
                    message_id=uuid.uuid4(), attempt=1, at=now, failure_class="x", outcome="retry"
                )
            )
            conn.execute(insert(relay_instance).values(relay_id="r", started_at=now, last_seen=now))
            conn.execute(insert(resource).values(resource="broker/vhost/orders"))
        site.manage("flush", "--no-input")
        with engine.connect() as conn:
            left = {
                table.name: conn.execute(select(func.count()).select_from(table)).scalar_one()
                for table in (message, attempt, inbox, relay_instance, resource, schema_version)
            }
    finally:
        engine.dispose()
    assert left == {
        "outbox_message": 0,
        "outbox_attempt": 0,
        "outbox_inbox": 0,
        "outbox_relay": 0,
        "outbox_resource": 0,
        "outbox_schema_version": left["outbox_schema_version"],
    }
    assert left["outbox_schema_version"] > 0  # what the migrations did is kept, as Django's own
    code, out, err = in_process("migrate", "--check", "--db", site.url)
    assert code == 0, out + err


def test_the_models_match_the_migrations(site: Site) -> None:
    assert "No changes detected" in site.manage("makemigrations", "--check", "--dry-run").stdout


def test_manage_py_test_with_migrations_off_finds_the_outbox_tables(tmp_path: Path) -> None:
    # "MIGRATE": False builds the test database from the models, which only name the outbox
    # tables: the app makes the real ones first.
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "shop.db")}
    unmigrated = Site({**database, "TEST": {"MIGRATE": False}}, "")
    result = unmigrated.manage("test", "shop", "--no-input")
    assert "Ran 9 tests" in result.stderr
    assert "\nOK\n" in result.stderr
