"""Retention against real databases: what goes, what never goes, how much at a time, the CLI,
PostgreSQL's storage settings, and purging while the application keeps writing.

Rows are written with `outbox.enqueue` and then *backdated*: their id is rewritten to the UUIDv7
`new_id` would have made at the chosen creation time (ids are time-ordered, and retention bounds
its scans by id), and their times and state are set with an UPDATE.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, func, insert, select, text, update

import outbox
from outbox import databases, migrate
from outbox.ids import new_id
from outbox.schema import attempt, message
from relay.cli import main as cli
from relay.cli import retention as retention_cli
from relay.core.retention import DAY, FAILED_STATES, RetentionPolicy
from relay.runtime.config import RelayConfig
from relay.store import retention
from relay.store.databases import dialect_for
from relay.store.engines import make_engine
from relay.store.postgres import Postgres
from relay.store.retention import run_retention_once
from relay.store.sql_store import open_store
from tests.support.cli import cli as run_cli
from tests.support.db import make_app_engine, pg_schema, states

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
FAILED = FAILED_STATES


def ago(days: float, now: dt.datetime | None = None) -> dt.datetime:
    return (now or dt.datetime.now(dt.UTC)) - dt.timedelta(days=days)


def id_at(moment: dt.datetime) -> uuid.UUID:
    """A message id as `new_id()` would have made it at `moment` (fresh random bits)."""
    ms = (moment - EPOCH) // dt.timedelta(milliseconds=1)
    return uuid.UUID(int=(new_id().int & ((1 << 80) - 1)) | ms << 80)


def add(engine: Engine, state: str, *, created: float, **times: float | None) -> uuid.UUID:
    """Enqueue one message, then backdate it: created `created` days ago, in `state`, with each
    time column in `times` set that many days ago (or NULL). Returns its (new) id."""
    created_at = ago(created)
    values: dict[str, Any] = {
        "id": id_at(created_at),
        "state": state,
        "created_at": created_at,
        "available_at": created_at,
    }
    values.update({column: None if d is None else ago(d) for column, d in times.items()})
    with engine.begin() as conn:
        fresh = outbox.enqueue(conn, exchange="orders", routing_key="order.created", payload={})
        conn.execute(update(message).where(message.c.id == fresh).values(values))
    return uuid.UUID(str(values["id"]))


def add_published(engine: Engine, n: int, *, created: float, published: float) -> list[uuid.UUID]:
    """`n` published messages in one INSERT (for volume); ids ascending, 1 ms apart."""
    start = ago(created)
    ids = [id_at(start + dt.timedelta(milliseconds=i)) for i in range(n)]
    rows = [
        {
            "id": message_id,
            "exchange": "orders",
            "routing_key": "order.created",
            "payload": b"{}",
            "content_type": "application/json",
            "state": "published",
            "created_at": start,
            "available_at": start,
            "published_at": ago(published),
        }
        for message_id in ids
    ]
    with engine.begin() as conn:
        conn.execute(insert(message), rows)
    return ids


def add_attempts(engine: Engine, ids: list[uuid.UUID], per_message: int = 2) -> None:
    now = dt.datetime.now(dt.UTC)
    rows = [
        {"message_id": i, "attempt": n, "at": now, "failure_class": "transient",
         "outcome": "retry"}
        for i in ids
        for n in range(1, per_message + 1)
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(attempt), rows)


def ids_left(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return {uuid.UUID(str(i)) for i in conn.execute(select(message.c.id)).scalars()}


def attempts_of(engine: Engine) -> dict[uuid.UUID, int]:
    stmt = select(attempt.c.message_id, func.count()).group_by(attempt.c.message_id)
    with engine.connect() as conn:
        return {uuid.UUID(str(i)): int(n) for i, n in conn.execute(stmt)}


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --------------------------------------------------------------------------- what goes


def test_only_rows_old_enough_in_the_chosen_terminal_states_are_purged(app_engine: Engine) -> None:
    e = app_engine
    old_published = add(e, "published", created=10, published_at=9)
    young_published = add(e, "published", created=10, published_at=1)
    old_dead = add(e, "dead", created=40, last_failed_at=35)
    young_dead = add(e, "dead", created=40, last_failed_at=20)  # failing for 40 d, died 20 d ago
    old_cancelled = add(e, "cancelled", created=40)  # never attempted: judged by created_at
    replayed_then_cancelled = add(
        e, "cancelled", created=40, last_failed_at=35, replayed_at=5
    )  # a replay restarts the clock
    old_discarded = add(e, "discarded", created=40, last_failed_at=39)
    live = {
        add(e, "pending", created=60, last_failed_at=50),
        add(e, "pending", created=60, published_at=50),  # nonsense times: still never
        add(e, "in_flight", created=60, last_failed_at=50, lease_expires_at=55),
    }

    n = retention.purge(e, states=["published"], older_than_seconds=3 * DAY, now=now())
    assert n == 1
    assert old_published not in ids_left(e)

    n = retention.purge(e, states=FAILED, older_than_seconds=30 * DAY, now=now())
    assert n == 3
    assert ids_left(e) == {young_published, young_dead, replayed_then_cancelled} | live
    assert {old_dead, old_cancelled, old_discarded}.isdisjoint(ids_left(e))

    # Everything terminal, however young: the live rows still stay.
    n = retention.purge(
        e, states=retention.TERMINAL_STATES, older_than_seconds=0, now=now() + dt.timedelta(1)
    )
    assert n == 3
    assert ids_left(e) == live


def test_live_rows_are_refused_and_the_sql_never_deletes_them_anyway(app_engine: Engine) -> None:
    live = {
        add(app_engine, "pending", created=60, published_at=50, last_failed_at=50),
        add(app_engine, "in_flight", created=60, published_at=50, last_failed_at=50),
    }
    for states_ in (["pending"], ["in_flight"], ["published", "pending"]):
        with pytest.raises(ValueError, match="never purged"):
            retention.purge_batch(
                app_engine, states=states_, older_than_seconds=0, batch_size=10, now=now()
            )
    # Past the Python check: the statement itself names only terminal states in its conditions.
    cutoff = now()
    plan = retention._Plan(("pending", "in_flight"), cutoff, retention.cutoff_id(cutoff))
    assert retention._delete_batch(app_engine, plan, 100) == (0, None)
    assert ids_left(app_engine) == live


def test_rows_whose_id_is_newer_than_the_cutoff_are_left_alone(app_engine: Engine) -> None:
    # Published "long ago" by its time column, but made a moment ago by its id: the id bound is
    # checked too, so a clock difference can only delay a deletion.
    with app_engine.begin() as conn:
        fresh = outbox.enqueue(conn, exchange="orders", routing_key="x", payload={})
        conn.execute(
            update(message)
            .where(message.c.id == fresh)
            .values(state="published", published_at=ago(10))
        )
    kwargs: dict[str, Any] = {"states": ["published"], "older_than_seconds": DAY, "now": now()}
    assert retention.count_eligible(app_engine, **kwargs) == 0
    assert retention.purge(app_engine, **kwargs) == 0
    assert ids_left(app_engine) == {fresh}


def test_attempts_go_with_their_messages_and_stay_with_survivors(app_engine: Engine) -> None:
    gone = [add(app_engine, "dead", created=40, last_failed_at=35) for _ in range(3)]
    kept = [
        add(app_engine, "dead", created=40, last_failed_at=1),
        add(app_engine, "pending", created=40, last_failed_at=35),
    ]
    add_attempts(app_engine, gone + kept, per_message=3)

    n = retention.purge(app_engine, states=["dead"], older_than_seconds=30 * DAY, now=now())

    assert n == 3
    assert attempts_of(app_engine) == {i: 3 for i in kept}


# --------------------------------------------------------------------------- how much at a time


def test_batches_are_bounded_and_take_the_oldest_ids_first(app_engine: Engine) -> None:
    ids = sorted(add_published(app_engine, 20, created=10, published=9))
    kwargs: dict[str, Any] = {"states": ["published"], "older_than_seconds": DAY, "now": now()}

    assert retention.purge_batch(app_engine, batch_size=7, **kwargs) == 7
    assert ids_left(app_engine) == set(ids[7:])

    assert retention.purge(app_engine, batch_size=5, max_batches=1, **kwargs) == 5
    assert ids_left(app_engine) == set(ids[12:])

    sizes: list[int] = []
    rests: list[float] = []
    n = retention.purge(
        app_engine, batch_size=3, progress=sizes.append, sleep=rests.append, **kwargs
    )
    assert n == 8
    assert sizes == [3, 3, 2]  # a short batch ends the purge: nothing is left below the cutoff
    assert ids_left(app_engine) == set()
    # SQLite rests between batches (writers get the lock); PostgreSQL does not need to.
    assert len(rests) == (2 if app_engine.dialect.name == "sqlite" else 0)


def test_a_retention_pass_does_bounded_work_and_asks_for_more_when_behind(
    db_url: str, app_engine: Engine
) -> None:
    e = app_engine
    add_published(e, 12, created=10, published=9)
    young = set(add_published(e, 3, created=2, published=1))
    dead = {add(e, "dead", created=20, last_failed_at=10)}  # younger than failed_after
    policy = RetentionPolicy(
        published_after=3 * DAY, failed_after=30 * DAY, batch_size=4, max_batches=2
    )

    first = run_retention_once(e, policy, now())
    assert first == 8  # two batches of four, then the pass stops
    assert policy.next_run_in(first) == policy.backlog_interval
    second = run_retention_once(e, policy, now())
    assert second == 4
    assert policy.next_run_in(second) == policy.interval
    assert run_retention_once(e, policy, now()) == 0
    assert ids_left(e) == young | dead

    # The relay runs the same pass through its store.
    store = open_store(db_url)
    try:
        assert store.purge_expired(policy, now() + dt.timedelta(days=25)) == 4
    finally:
        store.close()
    assert ids_left(e) == set()


# --------------------------------------------------------------------------- the command


def purge_args(**overrides: Any) -> argparse.Namespace:
    values: dict[str, Any] = {
        "older_than": 3 * DAY,
        "state": [],
        "batch_size": 1000,
        "dry_run": False,
        "json": False,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_purge_command_dry_run_changes_nothing_then_purges(
    db_url: str, app_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    config = RelayConfig(db_url=db_url)
    add_published(app_engine, 5, created=10, published=9)
    add(app_engine, "dead", created=10, last_failed_at=9)
    add(app_engine, "pending", created=10)
    before = states(app_engine)

    assert retention_cli.cmd_purge(config, purge_args(dry_run=True)) == 0
    assert capsys.readouterr().out == "would purge 5 message(s) (dry run; nothing changed)\n"
    assert retention_cli.cmd_purge(config, purge_args(dry_run=True, json=True)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dry_run"] is True
    assert report["would_purge"] == 5
    assert report["states"] == ["published"]
    assert states(app_engine) == before

    assert retention_cli.cmd_purge(config, purge_args()) == 0
    assert capsys.readouterr().out == "purged 5 message(s)\n"
    args = purge_args(state=["dead", "cancelled"], json=True)
    assert retention_cli.cmd_purge(config, args) == 0
    assert json.loads(capsys.readouterr().out)["purged"] == 1
    assert states(app_engine) == {"pending": 1}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_purge_command_shows_progress_on_a_terminal(
    db_url: str, app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_published(app_engine, 30, created=10, published=9)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)

    assert retention_cli.cmd_purge(RelayConfig(db_url=db_url), purge_args(batch_size=7)) == 0

    assert "purge" in terminal.getvalue()
    assert "30/30" in terminal.getvalue()


# The subprocess tests need `purge` wired into relay/cli.py (see retention_cli's add_parser and
# cmd_purge); they run by themselves once it is.
needs_wiring = pytest.mark.skipif(
    "purge" not in cli._COMMANDS, reason="enable by wiring retention_cli into relay/cli.py"
)


@pytest.mark.e2e
@needs_wiring
def test_purge_as_an_operator_runs_it(db_url: str, app_engine: Engine, tmp_path: Path) -> None:
    add_published(app_engine, 4, created=10, published=9)
    add(app_engine, "in_flight", created=10)

    dry = run_cli("--db", db_url, "purge", "--older-than", "3d", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == "would purge 4 message(s) (dry run; nothing changed)\n"

    result = run_cli("--db", db_url, "purge", "--older-than", "3d", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["purged"] == 4
    assert states(app_engine) == {"in_flight": 1}


@pytest.mark.e2e
@needs_wiring
def test_purging_a_live_state_is_bad_usage(db_url: str, app_engine: Engine, tmp_path: Path) -> None:
    result = run_cli(
        "--db", db_url, "purge", "--older-than", "1d", "--state", "pending", cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "pending messages are never purged" in result.stderr


# --------------------------------------------------------------------------- PostgreSQL storage


def reloptions(engine: Engine, schema: str) -> dict[str, dict[str, float]]:
    sql = text(
        "SELECT c.relname, c.reloptions FROM pg_class AS c "
        "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE n.nspname = :schema AND c.relname IN ('outbox_message', 'outbox_attempt')"
    )
    with engine.connect() as conn:
        return {
            name: {k: float(v) for k, v in (o.split("=", 1) for o in options or [])}
            for name, options in conn.execute(sql, {"schema": schema})
        }


def test_storage_settings_set_the_reloptions(pg_url: str, pg_engine: Engine) -> None:
    for _ in range(2):  # idempotent
        with pg_engine.begin() as conn:
            migrate.apply_storage_settings(conn)
    assert reloptions(pg_engine, pg_schema(pg_url)) == {
        table: {k: float(v) for k, v in params.items()}
        for table, params in databases.AUTOVACUUM_SETTINGS.items()
    }


def test_storage_settings_do_nothing_on_sqlite(sqlite_url: str) -> None:
    engine = make_app_engine(sqlite_url)
    try:
        outbox.create_schema(engine)
        with engine.begin() as conn:
            migrate.apply_storage_settings(conn)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- never in the way


@pytest.fixture
def impatient(pg_url: str) -> Iterator[Engine]:
    """A PostgreSQL engine whose sessions give up on any lock after 2 s instead of waiting."""
    engine = create_engine(pg_url, pool_size=2, max_overflow=0)

    @event.listens_for(engine, "connect")
    def _lock_timeout(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute("SET lock_timeout = '2s'")
        dbapi_conn.commit()

    yield engine
    engine.dispose()


def test_an_open_purge_batch_blocks_no_insert_claim_or_other_purge(
    pg_url: str, pg_engine: Engine, impatient: Engine
) -> None:
    old = sorted(add_published(pg_engine, 10, created=10, published=9))
    pending = add(pg_engine, "pending", created=10)
    at = now()
    plan = retention._plan(["published"], DAY, at)
    params = plan.params(dialect_for("postgresql"), uuid.UUID(int=0)) | {"batch_size": 5}
    store = open_store(pg_url)
    try:
        with pg_engine.connect() as purger, purger.begin() as tx:
            # A batch deleted and not yet committed: its rows (the five oldest) stay locked.
            batch = Postgres().sql.purge_batch
            assert purger.execute(batch, params).one()[0] == 5

            with impatient.begin() as conn:  # an application transaction
                outbox.enqueue(conn, exchange="orders", routing_key="x", payload={})
            claimed = store.claim(owner="r", token=uuid.uuid4(), limit=10, lease_seconds=30)
            assert str(pending) in {c.id for c in claimed}
            # A second purge skips the locked rows and takes the next ones.
            assert (
                retention.purge_batch(
                    impatient, states=["published"], older_than_seconds=DAY, batch_size=5, now=at
                )
                == 5
            )
            tx.rollback()
    finally:
        store.close()
    assert set(old[:5]) <= ids_left(pg_engine)
    assert set(old[5:]).isdisjoint(ids_left(pg_engine))


def test_inserts_commit_while_a_large_purge_is_running(db_url: str, app_engine: Engine) -> None:
    total, batch = 20_000, 500
    add_published(app_engine, total, created=10, published=9)
    purge_engine = make_engine(db_url, autocommit=False, pool_size=1)  # as `outbox-relay purge`
    purging = threading.Event()
    inserted = threading.Event()
    batches = 0
    after_inserts: list[int] = []  # batches that finished after the inserts had committed

    def progress(_n: int) -> None:
        nonlocal batches
        batches += 1
        purging.set()
        if inserted.is_set():
            after_inserts.append(batches)
        elif batches == total // batch - 1:
            # The last batch but one: wait here, between batches (holding no lock), so that the
            # inserts finish while the purge is running however fast either side is.
            assert inserted.wait(20), "the inserts did not commit while the purge was running"

    def purge() -> int:
        return retention.purge(
            purge_engine,
            states=["published"],
            older_than_seconds=DAY,
            batch_size=batch,
            now=now(),
            progress=progress,
        )

    def insert_some() -> list[uuid.UUID]:
        assert purging.wait(20)
        ids = []
        for i in range(50):
            with app_engine.begin() as conn:  # one transaction each, as an application would
                ids.append(
                    outbox.enqueue(conn, exchange="orders", routing_key="x", payload={"i": i})
                )
        inserted.set()
        return ids

    try:
        with ThreadPoolExecutor(2) as pool:
            purged = pool.submit(purge)
            enqueued = pool.submit(insert_some)
            ids = enqueued.result(timeout=30)
            assert purged.result(timeout=30) == total
    finally:
        purge_engine.dispose()
    assert after_inserts, "the purge had finished before the inserts committed"
    assert ids_left(app_engine) == set(ids)
