"""`outbox.django` in a real Django project (tests/django_project: settings, an app with a model, a
view that saves an order and enqueues in one atomic block, a Django TestCase), run as its users
run it: `manage.py migrate`, a management command driving the view, `manage.py test`. Then a real
relay publishes what the view committed and a real consumer reads it from RabbitMQ. On
PostgreSQL (psycopg 3), SQLite and MariaDB (PyMySQL standing in for mysqlclient).

Django runs in subprocesses, so its settings never reach this process. Each database is made,
migrated once and dropped per module (an xdist group keeps the module on one worker).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.engine import make_url

from outbox.schema import SCHEMA_VERSION, schema_version
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

    def manage(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`python manage.py ARGS` in the project (with `env` added to a clean environment);
        fails the test on a non-zero exit."""
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=environment(SHOP_DATABASE=json.dumps(self.database), **env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, (
            f"manage.py {' '.join(args)}:\n{result.stdout}{result.stderr}"
        )
        return result


def _server(admin_url: str, engine: str, name: str) -> tuple[dict[str, Any], str]:
    u = make_url(admin_url)
    database = {"ENGINE": engine, "NAME": name, "USER": u.username, "HOST": u.host, "PORT": u.port}
    if u.password:
        database["PASSWORD"] = u.password
    return database, u.set(database=name, query={}).render_as_string(hide_password=False)


@pytest.fixture(scope="module", params=["postgresql", "sqlite", "mariadb"])
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    """The project on a database of its own, migrated by `manage.py migrate`; dropped after,
    with the test database `manage.py test` makes beside it."""
    kind = request.param
    name = f"dj_{uuid.uuid4().hex[:10]}"
    admin: Engine | None = None
    if kind == "sqlite":
        path = tmp_path_factory.mktemp("django") / "shop.db"
        made = Site(
            {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}, f"sqlite:///{path}"
        )
    elif kind == "postgresql":
        admin = request.getfixturevalue("pg_admin")
        made = Site(*_server(PG_ADMIN_URL, "django.db.backends.postgresql", name))
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    else:
        admin = request.getfixturevalue("mysql_admin")
        made = Site(*_server(MYSQL_ADMIN_URL, "django.db.backends.mysql", name))
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
    assert "Ran 4 tests" in result.stderr
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
    ],
)
def test_the_guide_shows_the_code_these_tests_run(name: str, source: str) -> None:
    assert block("guides/django.md", name) in (PROJECT / source).read_text()
