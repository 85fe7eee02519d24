"""What the recorder and the Prometheus tests start: a PostgreSQL schema of their own, a relay
(`python -m relay ... run --http-port N`) and a Prometheus server, each stopped by its owner."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import create_engine, make_url

import outbox
from tests.support.broker import AMQP_URL
from tests.support.cli import environment
from tests.support.db import PG_ADMIN_URL

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"


def get(url: str, timeout: float = 2.0) -> str | None:
    """The body at `url`, or None when nothing answers there (or it answers an error)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return None


@contextlib.contextmanager
def outbox_schema(prefix: str = "prom") -> Iterator[str]:
    """A URL on a fresh PostgreSQL schema holding the outbox tables; dropped afterwards."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_size=1)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    options = urllib.parse.quote(f"-csearch_path={schema}", safe="")
    url = f"{PG_ADMIN_URL}?options={options}"
    engine = create_engine(url, pool_size=1)
    try:
        outbox.create_schema(engine)
        engine.dispose()
        yield url
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql("SET lock_timeout = '10s'")  # fail rather than hang
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@contextlib.contextmanager
def capture_database(prefix: str = "alerts") -> Iterator[str]:
    """A URL on a fresh PostgreSQL database (a slot reads a whole database) holding the outbox
    tables, a scratch table `ballast` and a replication slot and publication named after it;
    all dropped afterwards."""
    from relay.capture import admin as capture  # psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    server = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_size=1)
    with server.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url, pool_size=1)
    try:
        outbox.create_schema(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pgcrypto")
            conn.exec_driver_sql("CREATE TABLE ballast (b bytea)")
        capture.setup(engine, slot=name, publication=name)
        yield url
    finally:
        engine.dispose()
        with server.connect() as conn:
            for (pid,) in conn.exec_driver_sql(
                "SELECT active_pid FROM pg_replication_slots WHERE database = %s AND active",
                (name,),
            ):
                conn.exec_driver_sql("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(1.0)
            conn.exec_driver_sql(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s",
                (name,),
            )
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        server.dispose()


def start_relay(db_url: str, port: int, *args: str) -> subprocess.Popen[bytes]:
    """`outbox-relay run --http-port PORT ARGS` on `db_url` and the local broker."""
    return subprocess.Popen(
        [sys.executable, "-m", "relay", "--db", db_url, "--amqp", AMQP_URL, "--log-level",
         "WARNING", "run", "--http-port", str(port), "--http-host", "127.0.0.1",
         "--drain-timeout", "5", *args],
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM (a relay drains, Prometheus shuts down cleanly), then SIGKILL if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_prometheus(config: Path, data: Path, port: int) -> subprocess.Popen[bytes]:
    """The `prometheus` server of Debian's package on 127.0.0.1:PORT, its TSDB and its log
    (prometheus.log) in `data`."""
    with (data / "prometheus.log").open("wb") as log:
        return subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
