"""One relay process serving several databases (`run --db-file`, `run --db --db`), on the real
PostgreSQL, MariaDB, SQLite and RabbitMQ: every database drained, each key in order; log lines and
metrics name the database; /readyz lists each one; SIGHUP adds and removes databases; a database
that cannot be reached is retried on its own while the others go on, and catches up once back."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import outbox
from tests.support.broker import Broker, Delivery
from tests.support.cli import RelayProcess, assert_one_line_error, cli, kill_running
from tests.support.db import PG_ADMIN_URL, make_app_engine, row_count
from tests.support.ports import free_port
from tests.support.proxy import TcpProxy
from tests.support.templates import Templates
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Relay(RelayProcess):
    """`outbox-relay run` over several databases, with its HTTP endpoint, as a process."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        super().__init__("run", "--poll-interval", "0.1", "--http-port", str(self.port),
                         "--http-host", "127.0.0.1", *args)  # fmt: skip

    def said(self, *words: str, timeout: float = 30.0) -> str:
        return super().said(*words, timeout=timeout)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def ready(self) -> dict[str, Any]:
        _status, body = self.get("/readyz")
        return dict(json.loads(body))

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    kill_running(started)


@pytest.fixture
def sqlite_dbs(tmp_path: Path, templates: Templates) -> Iterator[dict[str, Engine]]:
    """Three SQLite tenants, migrated: name -> application engine."""
    engines = {}
    for name in ("acme", "globex", "initech"):
        engine = make_app_engine(f"sqlite:///{tmp_path / name}.db")
        templates.migrate(engine)
        engines[name] = engine
    yield engines
    for engine in engines.values():
        engine.dispose()


@contextlib.contextmanager
def tenant_schemas(
    pg_admin: Engine, templates: Templates, count: int
) -> Iterator[dict[str, Engine]]:
    """`count` PostgreSQL schema-per-tenant tenants in one database, migrated, dropped after:
    name -> application engine."""
    engines: dict[str, Engine] = {}
    try:
        for name in [f"tenant_{uuid.uuid4().hex[:8]}" for _ in range(count)]:
            with pg_admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
            engines[name] = make_app_engine(f"{PG_ADMIN_URL}?options=-csearch_path%3D{name}")
            templates.migrate(engines[name])
        yield engines
    finally:
        for name, engine in engines.items():
            engine.dispose()
            with pg_admin.connect() as conn:
                conn.exec_driver_sql("SET lock_timeout = '10s'")
                conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture
def pg_schemas(pg_admin: Engine, templates: Templates) -> Iterator[dict[str, Engine]]:
    """Two PostgreSQL schema-per-tenant tenants in one database: name -> application engine."""
    with tenant_schemas(pg_admin, templates, 2) as engines:
        yield engines


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def enqueue(engine: Engine, exchange: str, tenant: str, count: int) -> dict[str, list[uuid.UUID]]:
    """`count` messages on 3 keys of `tenant`'s own: key -> ids in order."""
    sent: dict[str, list[uuid.UUID]] = {}
    with Session(engine) as session, session.begin():
        for n in range(count):
            key = f"{tenant}-k{n % 3}"
            message_id = outbox.enqueue(
                session, exchange=exchange, routing_key=tenant, payload={"n": n}, key=key
            )
            sent.setdefault(key, []).append(message_id)
    return sent


def in_key_order(received: list[Delivery], sent: dict[str, list[uuid.UUID]]) -> bool:
    """Each key's messages first arrived in the order they were committed (a message sent again
    after a relay was killed arrives twice: delivery is at least once)."""
    got = list(dict.fromkeys(d.message_id for d in received))
    wanted = [[str(i) for i in ids] for ids in sent.values()]
    return all([i for i in got if i in set(ids)] == ids for ids in wanted)


def every(sent: dict[str, list[uuid.UUID]]) -> list[uuid.UUID]:
    return [i for ids in sent.values() for i in ids]


def settled(engine: Engine) -> bool:
    return row_count(engine, state="pending") == 0


def write_file(path: Path, tenants: dict[str, Engine]) -> str:
    lines = ["# the tenants this relay serves", ""]
    lines += [f"{name} = {url_of(engine)}" for name, engine in tenants.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_one_relay_drains_every_database_each_key_in_order_and_names_them(
    tmp_path: Path,
    sqlite_dbs: dict[str, Engine],
    pg_schemas: dict[str, Engine],
    mysql_url: str,
    templates: Templates,
    broker: Broker,
    relays: list[Relay],
) -> None:
    maria = make_app_engine(mysql_url)
    templates.migrate(maria)
    tenants = {**sqlite_dbs, **pg_schemas, "maria": maria}
    sent: dict[str, list[uuid.UUID]] = {}
    for name, engine in tenants.items():
        sent.update(enqueue(engine, broker.exchange, name, 60))
    relay = Relay("--db-file", write_file(tmp_path / "dbs.txt", tenants))
    relays.append(relay)
    total = sum(len(ids) for ids in sent.values())
    received = broker.collect(lambda got: len(got) >= total, timeout=60, what="every tenant's")
    assert in_key_order(received, sent)
    for name, engine in tenants.items():
        wait_until(functools.partial(settled, engine), what=f"{name} settled")
    ready = relay.ready()
    assert ready["status"] == "ok"
    assert ready["databases"] == {name: "ok" for name in sorted(tenants)}
    assert ready["databases_ready"] == f"{len(tenants)}/{len(tenants)}"
    _status, metrics = relay.get("/metrics")
    for name in tenants:
        assert f'database="{name}"' in metrics
        relay.said("relay.started", f"database={name}")
    code, log = relay.stop()
    assert code == 0, log
    for name in tenants:
        assert f"relay.stopped database={name} published=60" in log, log
    assert "Traceback" not in log
    maria.dispose()


def test_sighup_adds_a_database_and_drains_then_stops_a_removed_one(
    tmp_path: Path, sqlite_dbs: dict[str, Engine], broker: Broker, relays: list[Relay]
) -> None:
    acme, globex, initech = (sqlite_dbs[n] for n in ("acme", "globex", "initech"))
    path = tmp_path / "dbs.txt"
    relay = Relay("--db-file", write_file(path, {"acme": acme, "globex": globex}))
    relays.append(relay)
    relay.said("relay.started", "database=globex")
    first = enqueue(acme, broker.exchange, "acme", 10)
    broker.collect_ids(every(first), timeout=30)
    write_file(path, {"globex": globex, "initech": initech})
    relay.signal(signal.SIGHUP)
    relay.said("relay.stopped", "database=acme")
    relay.said("relay.started", "database=initech")
    wait_until(lambda: set(relay.ready()["databases"]) == {"globex", "initech"})
    added = enqueue(initech, broker.exchange, "initech", 10)
    broker.collect_ids(every(added), timeout=30)
    enqueue(acme, broker.exchange, "acme", 5)  # no longer served: it waits
    path.write_text("this line is not a database\n")
    relay.signal(signal.SIGHUP)
    relay.said("relay.reload_failed", "dbs.txt:1")
    assert set(relay.ready()["databases"]) == {"globex", "initech"}
    code, log = relay.stop()
    assert code == 0, log
    assert row_count(acme, state="pending") == 5


def test_an_unreachable_database_is_retried_on_its_own_and_catches_up(
    pg_schemas: dict[str, Engine],
    sqlite_dbs: dict[str, Engine],
    broker: Broker,
    relays: list[Relay],
) -> None:
    (far_name, far), (near_pg_name, near_pg) = pg_schemas.items()
    acme = sqlite_dbs["acme"]
    with TcpProxy("127.0.0.1", 5432) as proxy:
        far_url = proxy.url_for(url_of(far), 5432)
        proxy.cut()
        relay = Relay("--db", f"{far_url}", "--db", url_of(acme), "--db", url_of(near_pg))
        relays.append(relay)
        relay.said("relay.database_unavailable", f"database={far_name}")
        waiting = enqueue(far, broker.exchange, far_name, 30)  # written directly, not via the proxy
        near = enqueue(acme, broker.exchange, "acme", 30)
        near_too = enqueue(near_pg, broker.exchange, near_pg_name, 30)
        broker.collect_ids(every(near) + every(near_too), timeout=30)
        # Each database says "ok" from its own thread once its loop is built: the near ones
        # delivering proves them served, and /readyz follows as soon as each has said so.
        ready = wait_until(lambda: (r := relay.ready())["databases_ready"] == "2/3" and r,
                           timeout=30, what="/readyz: 2/3 databases ready")  # fmt: skip
        assert ready["databases"]["acme"] == ready["databases"][near_pg_name] == "ok", ready
        assert ready["databases"][far_name] != "ok", ready
        status, body = relay.get("/readyz")
        assert status == 200, body
        proxy.restore()
        received = broker.collect_ids(every(waiting), timeout=40)
        assert in_key_order(received, waiting)
        wait_until(lambda: relay.ready()["databases"][far_name] == "ok")
        # cut again while it runs: the others go on, and so does it once back
        proxy.cut()
        more_near = enqueue(acme, broker.exchange, "acme", 10)
        broker.collect_ids(every(more_near), timeout=30)
        more_far = enqueue(far, broker.exchange, far_name, 10)
        proxy.restore()
        broker.collect_ids(every(more_far), timeout=60)
        code, log = relay.stop()
    assert code == 0, log


def test_a_wrong_database_list_is_a_usage_error_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "dbs.txt"
    path.write_text("a = sqlite:///a.db\nb = sqlite:///a.db\n")
    line = assert_one_line_error(cli("run", "--db-file", str(path), cwd=tmp_path), 2)
    assert "'a' and 'b' have the same URL" in line
    line = assert_one_line_error(
        cli("run", "--db", "sqlite:///a.db", "--db", "sqlite:///b.db", "--capture", "logical",
            cwd=tmp_path),
        2,
    )  # fmt: skip
    assert "--capture logical serves one database" in line


@pytest.fixture
def pg_databases(pg_admin: Engine, templates: Templates) -> Iterator[dict[str, Engine]]:
    """Three PostgreSQL databases of this test's own, migrated: name -> application engine."""
    names = [f"t_{uuid.uuid4().hex[:10]}" for _ in range(3)]
    engines = {}
    for name in names:
        with pg_admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        engine = make_app_engine(make_url(PG_ADMIN_URL).set(database=name).render_as_string(False))
        templates.migrate(engine)
        engines[name] = engine
    yield engines
    for name, engine in engines.items():
        engine.dispose()
        with pg_admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_twenty_databases_two_relays_a_kill_and_a_cut_lose_nothing_and_keep_order(
    tmp_path: Path,
    pg_admin: Engine,
    pg_databases: dict[str, Engine],
    templates: Templates,
    broker: Broker,
    relays: list[Relay],
) -> None:
    """12 SQLite files, 3 PostgreSQL databases and 5 schemas, served by two relays side by side
    from one file; one relay SIGKILLed mid-drain, one database cut behind a proxy and restored:
    every message arrives, each key in order."""
    tenants: dict[str, Engine] = dict(pg_databases)
    for n in range(12):
        engine = make_app_engine(f"sqlite:///{tmp_path / f'file_{n}'}.db")
        templates.migrate(engine)
        tenants[f"file_{n}"] = engine
    with tenant_schemas(pg_admin, templates, 5) as schemas:
        tenants.update(schemas)
        try:
            _twenty(tmp_path, tenants, next(iter(pg_databases)), broker, relays)
        finally:
            for name, engine in tenants.items():
                if name.startswith("file_"):
                    engine.dispose()


def _twenty(
    tmp_path: Path, tenants: dict[str, Engine], cut_name: str, broker: Broker, relays: list[Relay]
) -> None:
    assert len(tenants) == 20
    with TcpProxy("127.0.0.1", 5432) as proxy:
        lines = ["# twenty tenants"]
        for name, engine in tenants.items():
            url = url_of(engine)
            lines.append(f"{name} = {proxy.url_for(url, 5432) if name == cut_name else url}")
        path = tmp_path / "dbs.txt"
        path.write_text("\n".join(lines) + "\n")
        sent: dict[str, list[uuid.UUID]] = {}
        for name, engine in tenants.items():
            sent.update(enqueue(engine, broker.exchange, name, 40))
        first, second = Relay("--db-file", str(path)), Relay("--db-file", str(path))
        relays.extend([first, second])
        broker.collect(lambda got: len(got) >= 200, timeout=60, what="the drain under way")
        first.process.kill()
        first.process.wait(timeout=30)
        proxy.cut()
        for name, engine in tenants.items():
            sent_more = enqueue(engine, broker.exchange, name, 10)
            for key, ids in sent_more.items():
                sent[key].extend(ids)
        others = [i for k, ids in sent.items() if not k.startswith(cut_name) for i in ids]
        broker.collect_ids(others, timeout=60)
        assert second.ready()["databases"][cut_name] != "ok"
        proxy.restore()
        received = broker.collect_ids(every(sent), timeout=90)
        assert in_key_order(received, sent)
        code, log = second.stop()
    assert code == 0, log
    for name, engine in tenants.items():
        assert row_count(engine, state="pending") == 0, name


def test_a_loop_that_crashes_is_started_again_while_the_others_go_on(
    sqlite_dbs: dict[str, Engine], broker: Broker, relays: list[Relay]
) -> None:
    acme, globex = sqlite_dbs["acme"], sqlite_dbs["globex"]
    relay = Relay("--db", url_of(acme), "--db", url_of(globex))
    relays.append(relay)
    relay.said("relay.started", "database=acme")
    with acme.begin() as conn:  # the loop's next statement fails as no outage does: a crash
        conn.exec_driver_sql("ALTER TABLE outbox_message RENAME TO outbox_message_away")
    relay.said("relay.crashed", "database=acme")
    relay.said("relay.database_unavailable", "database=acme", "retry_in=")
    near = enqueue(globex, broker.exchange, "globex", 10)
    broker.collect_ids(every(near), timeout=30)
    with acme.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE outbox_message_away RENAME TO outbox_message")
    back = enqueue(acme, broker.exchange, "acme", 10)
    received = broker.collect_ids(every(back), timeout=60)
    assert in_key_order(received, back)
    code, log = relay.stop()
    assert code == 0, log
