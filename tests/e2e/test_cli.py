"""`outbox-relay` as an operator runs it: a subprocess, its exit code, stdout and stderr."""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, inspect, select, update

import outbox
from outbox.schema import SCHEMA_VERSION, message, schema_version
from relay.store.sql_store import SqlStore
from tests.support.broker import AMQP_URL, Broker
from tests.support.cli import (
    UNREACHABLE_AMQP,
    UNREACHABLE_DB,
    assert_one_line_error,
    cli,
    environment,
)
from tests.support.db import make_app_engine, pg_schema, states
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

STATUS_KEYS = {"pending", "in_flight", "published", "dead", "cancelled", "oldest_pending_age_s"}

RUN = "run"


# --------------------------------------------------------------------------- migrate


def test_migrate_creates_the_schema_and_is_safe_to_run_again(db_url: str, tmp_path: Path) -> None:
    for _ in range(2):
        result = cli("--db", db_url, "migrate", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
    engine = make_app_engine(db_url)
    try:
        schema = pg_schema(db_url) if db_url.startswith("postgresql") else None
        tables = set(inspect(engine).get_table_names(schema=schema))
        assert {"outbox_message", "outbox_schema_version"} <= tables
        with engine.connect() as conn:
            versions = conn.execute(select(schema_version.c.version)).scalars().all()
        assert len(versions) == len(set(versions)) >= 1  # each version recorded once
        # And the library can write to what migrate created.
        with engine.begin() as conn:
            outbox.enqueue(conn, exchange="x", routing_key="r", payload={})
    finally:
        engine.dispose()
    assert not (tmp_path / "outbox.db").exists()  # the default URL was not used


def test_migrate_reads_the_database_url_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'from-env.db'}"
    result = cli("migrate", cwd=tmp_path, env=environment(OUTBOX_DB_URL=url))
    assert result.returncode == 0, result.stderr
    engine = create_engine(url)
    try:
        assert "outbox_message" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- status


def status_json(db_url: str, cwd: Path) -> dict[str, object]:
    result = cli("--db", db_url, "status", "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report, dict)
    assert set(report) >= STATUS_KEYS
    return report


def test_status_of_an_empty_outbox(app_engine: Engine, db_url: str, tmp_path: Path) -> None:
    report = status_json(db_url, tmp_path)
    assert {k: report[k] for k in STATUS_KEYS} == {
        "pending": 0,
        "in_flight": 0,
        "published": 0,
        "dead": 0,
        "cancelled": 0,
        "oldest_pending_age_s": None,
    }


def test_status_counts_every_state(
    app_engine: Engine, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    def put(count: int, **kwargs: Any) -> list[uuid.UUID]:
        with app_engine.begin() as conn:
            return [
                outbox.enqueue(conn, exchange="ex", routing_key="rk", payload=[n], **kwargs)
                for n in range(count)
            ]

    def set_state(ids: list[uuid.UUID], state: str) -> None:
        with app_engine.begin() as conn:
            conn.execute(update(message).where(message.c.id.in_(ids)).values(state=state))

    put(3)
    token = uuid.uuid4()
    published = store.claim(owner="t", token=token, limit=3, lease_seconds=60)
    assert store.mark_published(token, [c.seq for c in published]) == 3
    put(1)
    assert len(store.claim(owner="t", token=uuid.uuid4(), limit=1, lease_seconds=60)) == 1
    set_state(put(2), "dead")
    set_state(put(1), "cancelled")
    waiting_long, _ = put(2)
    put(1, delay=dt.timedelta(days=3))
    with app_engine.begin() as conn:  # due for 100 s already
        conn.execute(
            update(message)
            .where(message.c.id == waiting_long)
            .values(available_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=100))
        )

    report = status_json(db_url, tmp_path)
    assert {k: report[k] for k in STATUS_KEYS - {"oldest_pending_age_s"}} == {
        "pending": 3,  # two ready, one delayed
        "in_flight": 1,
        "published": 3,
        "dead": 2,
        "cancelled": 1,
    }
    assert all(type(report[k]) is int for k in STATUS_KEYS - {"oldest_pending_age_s"})
    age = report["oldest_pending_age_s"]
    assert isinstance(age, int | float)
    assert 100 <= age < 130


def test_status_prints_a_readable_table(app_engine: Engine, db_url: str, tmp_path: Path) -> None:
    result = cli("--db", db_url, "status", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pending" in result.stdout
    assert "published" in result.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)


# --------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize("command", ["migrate", "status", RUN])
@pytest.mark.parametrize("bad_url", ["nonsense://", "not a url", "oracle://u@localhost/db"])
def test_a_bad_database_url_exits_2_with_one_line(
    command: str, bad_url: str, tmp_path: Path
) -> None:
    line = assert_one_line_error(cli("--db", bad_url, command, cwd=tmp_path), 2)
    assert "--db" in line


@pytest.mark.parametrize(
    "args",
    [
        ["--bogus", "status"],
        ["status", "--bogus"],
        ["frobnicate"],
        [],
        ["run", "--batch-size", "0"],
        ["run", "--poll-interval", "soon"],
    ],
    ids=["global-flag", "command-flag", "command", "no-command", "zero", "not-a-number"],
)
def test_bad_usage_exits_2_with_one_line(args: list[str], tmp_path: Path) -> None:
    assert_one_line_error(cli(*args, cwd=tmp_path), 2)


def test_a_bad_amqp_url_exits_2_with_one_line(sqlite_url: str, tmp_path: Path) -> None:
    line = assert_one_line_error(
        cli("--db", sqlite_url, "--amqp", "http://localhost/", "run", cwd=tmp_path), 2
    )
    assert "--amqp" in line


# --------------------------------------------------------------------------- configuration


def test_a_bad_variable_is_named_and_exits_2_with_one_line(tmp_path: Path) -> None:
    result = cli("run", cwd=tmp_path, env=environment(OUTBOX_BATCH_SIZE="abc"))
    line = assert_one_line_error(result, 2)
    assert line == "outbox-relay: error: OUTBOX_BATCH_SIZE='abc' is not an integer"


def test_a_bad_variable_the_command_does_not_read_does_not_stop_it(
    db_url: str, tmp_path: Path
) -> None:
    env = environment(OUTBOX_BATCH_SIZE="abc", OUTBOX_AMQP_URL="http://not-amqp/")
    result = cli("--db", db_url, "migrate", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_global_options_may_follow_the_command(
    app_engine: Engine, db_url: str, tmp_path: Path
) -> None:
    result = cli("status", "--json", "--db", db_url, "--log-level", "debug", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)) >= STATUS_KEYS
    assert not (tmp_path / "outbox.db").exists()  # the default URL was not used


def test_version(tmp_path: Path) -> None:
    result = cli("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # pyproject.toml is the one place the release is written: --version reads the metadata built
    # from it.
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    release = pyproject["project"]["version"]
    assert result.stdout == f"outbox-relay {release} (schema {SCHEMA_VERSION})\n"


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]], ids=["global", "run"])
def test_help_shows_no_password(args: list[str], tmp_path: Path) -> None:
    env = environment(
        OUTBOX_DB_URL="postgresql+psycopg://app:hunter2@db/app",
        OUTBOX_AMQP_URL="amqp://relay:hunter2@broker/%2F",
    )
    result = cli(*args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "OUTBOX_AMQP_URL" in result.stdout
    assert "hunter2" not in result.stdout
    assert "guest:guest" not in result.stdout


# --------------------------------------------------------------------------- runtime failures


@pytest.mark.parametrize("command", ["migrate", "status", RUN])
def test_an_unreachable_database_exits_1_with_one_line(command: str, tmp_path: Path) -> None:
    line = assert_one_line_error(cli("--db", UNREACHABLE_DB, command, cwd=tmp_path), 1)
    assert "127.0.0.1" in line


def test_run_without_the_schema_exits_1_and_says_to_migrate(
    sqlite_url: str, tmp_path: Path
) -> None:
    line = assert_one_line_error(cli("--db", sqlite_url, "run", cwd=tmp_path), 1)
    assert "migrate" in line
    assert f"do not exist in {sqlite_url}:" in line  # which database it looked in


def test_run_on_the_default_database_says_it_was_the_default(tmp_path: Path) -> None:
    line = assert_one_line_error(cli("run", cwd=tmp_path), 1)
    assert (
        "the outbox tables do not exist in sqlite:///outbox.db, the default database "
        "(set OUTBOX_DB_URL or --db): run `outbox-relay migrate`"
    ) in line


def test_run_with_an_unreachable_broker_exits_1_with_one_line(
    app_engine: Engine, db_url: str, tmp_path: Path
) -> None:
    result = cli("--db", db_url, "--amqp", UNREACHABLE_AMQP, "run", cwd=tmp_path)
    line = assert_one_line_error(result, 1)
    assert "127.0.0.1:1" in line


# --------------------------------------------------------------------------- run


def test_run_relays_committed_messages_and_exits_0_on_sigterm(
    app_engine: Engine, broker: Broker, db_url: str, tmp_path: Path
) -> None:
    def put(payload: str) -> uuid.UUID:
        with app_engine.begin() as conn:
            return outbox.enqueue(
                conn, exchange=broker.exchange, routing_key="order.created", payload=payload
            )

    before = [put(f"before-{n}") for n in range(5)]
    with app_engine.connect() as conn, conn.begin() as tx:
        outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload="rolled back")
        tx.rollback()

    stderr_path = tmp_path / "relay.stderr"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relay",
                "--db",
                db_url,
                "--amqp",
                AMQP_URL,
                "run",
                "--poll-interval",
                "0.05",
                "--drain-timeout",
                "5",
            ],
            cwd=tmp_path,
            env=environment(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )

        def arrived_or_exited(ids: list[uuid.UUID], timeout: float) -> None:
            wanted = {str(i) for i in ids}
            broker.collect(
                lambda got: wanted <= {d.message_id for d in got} or process.poll() is not None,
                timeout=timeout,
                what=f"{len(wanted)} messages",
            )
            assert process.poll() is None, f"the relay exited: {stderr_path.read_text()}"

        try:
            arrived_or_exited(before, timeout=20)
            during = [put(f"during-{n}") for n in range(5)]
            arrived_or_exited(during, timeout=10)
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    log = stderr_path.read_text()
    assert code == 0, log
    assert "Traceback" not in log, log
    total = len(before) + len(during)
    wait_until(lambda: states(app_engine) == {"published": total}, timeout=5)
    delivered = broker.finish()
    assert sorted(str(d.message_id) for d in delivered) == sorted(map(str, before + during))
