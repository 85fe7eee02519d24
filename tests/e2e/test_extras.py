"""The light install: the wheel test_wheel.py builds, installed with no extra (and beside
psycopg2, as a Django or legacy application has it) in fresh virtual environments, resolved from
the package index at the versions constraints.txt pins. The library alone imports, enqueues and
tests without pika, tenacity, the OpenTelemetry SDK, tqdm or psycopg 3; the `outbox-relay`
command names the extra it needs, in one line. The relay's own install (`[relay,binary]`) is
test_wheel.py's."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.e2e.test_wheel import Installed, clean_environment, install

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.xdist_group("wheel")]

# What the relay extra, the PostgreSQL extras and the exporters bring: none of it installed.
NOT_INSTALLED = [
    "pika", "tenacity", "tqdm", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry-exporter-prometheus", "prometheus-client", "protobuf", "requests", "psycopg",
    "psycopg-binary", "PyMySQL", "starlette", "greenlet",
]  # fmt: skip

RELAY_EXTRA = "pip install 'outbox-relay[relay]'"


def python(installed: Installed, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` run by the installed environment's interpreter, outside the repository."""
    return subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", textwrap.dedent(code)],
        cwd=installed.workdir,
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="session")
def library(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """`pip install outbox-relay`: no extra."""
    return install(tmp_path_factory, "outbox-relay @ {wheel}")


@pytest.fixture(scope="session")
def beside_psycopg2(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The library beside psycopg2, and no psycopg 3."""
    return install(tmp_path_factory, "outbox-relay @ {wheel}", "psycopg2-binary")


def test_the_library_alone_installs_sqlalchemy_and_the_opentelemetry_api(
    library: Installed,
) -> None:
    done = python(
        library,
        """
        import json
        from importlib.metadata import distributions, requires
        print(json.dumps({
            "installed": sorted(d.metadata["Name"].lower() for d in distributions()),
            "requires": [r for r in requires("outbox-relay") if "extra ==" not in r],
        }))
        """,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert sorted(r.split(">")[0].split("<")[0] for r in found["requires"]) == [
        "opentelemetry-api",
        "sqlalchemy",
    ], found["requires"]
    assert {"outbox-relay", "sqlalchemy", "opentelemetry-api"} <= set(found["installed"])
    present = set(found["installed"]) & {name.lower() for name in NOT_INSTALLED}
    assert not present, f"installed without being asked for: {sorted(present)}"


def test_the_library_alone_enqueues_into_sqlite_and_imports_no_extra(library: Installed) -> None:
    done = python(
        library,
        """
        import sqlite3
        import sys

        from sqlalchemy import create_engine

        import outbox
        import outbox.testing

        engine = create_engine("sqlite:///shop.db")
        outbox.create_schema(engine)
        with engine.begin() as db:
            first = outbox.enqueue(db, exchange="shop", routing_key="order.created",
                                   payload={"order": 1}, key="order-1")
            outbox.testing.assert_enqueued(db, routing_key="order.created", payload={"order": 1})
        plain = sqlite3.connect("shop.db", isolation_level=None)
        plain.execute("BEGIN")
        outbox.enqueue(plain, exchange="shop", routing_key="order.paid", payload="paid")
        plain.execute("COMMIT")
        assert outbox.verify and outbox.celery_task_message and outbox.dramatiq_message
        with engine.connect() as db:
            assert len(outbox.testing.enqueued(db)) == 2
        # A consumer of its own (Celery, FastStream) uses the inbox and outcomes without pika.
        with engine.begin() as db:
            assert outbox.process_once(db, consumer="billing", message_id=str(first))
            assert not outbox.process_once(db, consumer="billing", message_id=str(first))
        assert isinstance(outbox.Retry("later"), Exception) and outbox.Reject("bad").args
        loaded = {name.split(".")[0] for name in sys.modules}
        print(sorted(loaded & {"pika", "tenacity", "tqdm", "psycopg", "relay"}))
        print(sorted(name for name in sys.modules if name.startswith("opentelemetry.sdk")))
        try:
            import pika
        except ImportError:
            print("no pika")
        try:
            outbox.Consumer
        except ImportError as exc:
            print(exc)
        """,
    )
    assert done.returncode == 0, done.stderr
    modules, sdk, pika, consumer = done.stdout.splitlines()
    assert (modules, sdk, pika) == ("[]", "[]", "no pika")
    assert consumer.startswith(f"outbox.Consumer needs the relay extra: {RELAY_EXTRA}"), consumer


@pytest.mark.parametrize(
    "args",
    [
        ["run"],
        ["--db", "sqlite:///outbox.db", "migrate"],
        ["console"],
        ["status", "--json"],
        ["--help"],
    ],
    ids="-".join,
)
def test_a_command_without_the_relay_extra_exits_2_naming_it(
    library: Installed, args: list[str]
) -> None:
    done = library.run(*args)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()  # one line, no traceback
    assert line.startswith("outbox-relay: this command needs the relay extra: "), line
    assert RELAY_EXTRA in line
    assert not (library.workdir / "outbox.db").exists()


def test_the_version_needs_no_extra(library: Installed) -> None:
    done = library.run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("outbox-relay "), done.stdout


def test_the_library_beside_psycopg2_enqueues_on_postgresql_without_psycopg_3(
    beside_psycopg2: Installed, pg_url: str
) -> None:
    url = make_url(pg_url).set(drivername="postgresql+psycopg2")
    done = python(
        beside_psycopg2,
        """
        import os
        import sys
        from importlib.util import find_spec

        import psycopg2
        from sqlalchemy import create_engine

        import outbox

        url = os.environ["APP_DB_URL"]
        engine = create_engine(url)
        outbox.create_schema(engine)
        with engine.begin() as db:
            print(outbox.enqueue(db, exchange="shop", routing_key="order.created",
                                 payload={"order": 1}, key="order-1"))
        # A plain psycopg2 connection, as Django's is.
        options = engine.url.query["options"]
        plain = psycopg2.connect(host=engine.url.host, port=engine.url.port,
                                 user=engine.url.username, dbname=engine.url.database,
                                 options=options)
        print(outbox.enqueue(plain, exchange="shop", routing_key="order.paid", payload="paid"))
        plain.commit()
        plain.close()
        print(find_spec("psycopg") is None, "psycopg" in sys.modules)
        """,
        APP_DB_URL=url.render_as_string(hide_password=False),
    )
    assert done.returncode == 0, done.stderr
    first, second, psycopg = done.stdout.splitlines()
    assert psycopg == "True False"  # psycopg 3 is neither installed nor imported
    engine = create_engine(pg_url)
    try:
        with engine.connect() as db:
            rows = db.execute(text("SELECT id, routing_key FROM outbox_message ORDER BY seq"))
            assert [(str(i), key) for i, key in rows] == [
                (first, "order.created"),
                (second, "order.paid"),
            ]
    finally:
        engine.dispose()


def test_the_wheel_names_its_project_urls(library: Installed) -> None:
    done = python(
        library,
        """
        from importlib.metadata import metadata
        for entry in metadata("outbox-relay").get_all("Project-URL"):
            print(entry)
        """,
    )
    assert done.returncode == 0, done.stderr
    urls = dict(line.split(", ", 1) for line in done.stdout.splitlines())
    assert set(urls) == {"Homepage", "Documentation", "Source", "Changelog", "Issues"}, urls
    assert all(url.startswith("https://") for url in urls.values()), urls
