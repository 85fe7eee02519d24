"""The store's clock reaches the SQL: every time a statement reads or stamps is `:now` when a test
freezes it (production binds NULL, and the database's own clock is used). Lease expiry, retry due
times, heartbeats and status are decided here by a frozen clock, on PostgreSQL and SQLite, with no
sleeping and no rewriting of rows."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select

import outbox
from outbox.schema import attempt, message
from relay.core.circuit import Circuit
from relay.core.failures import Classified, FailureClass
from relay.core.policy import Retry
from relay.ports import ResourceRow
from relay.store.sql_store import SqlStore, open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

# Later than any real enqueue time, and whole seconds: SQLite's clock has milliseconds only.
FROZEN = dt.datetime(2031, 5, 17, 9, 30, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return FROZEN + dt.timedelta(seconds=seconds)


class Clock:
    """A clock a test sets by hand."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(FROZEN)


@pytest.fixture
def frozen(db_url: str, app_engine: Engine, clock: Clock) -> Iterator[SqlStore]:
    """The relay's store on `db_url`, reading its time from `clock`."""
    store = open_store(db_url, clock=clock)
    yield store
    store.close()


def enqueue(engine: Engine, **kwargs: Any) -> uuid.UUID:
    with engine.begin() as conn:
        return outbox.enqueue(conn, exchange="ex", routing_key="rk", payload={}, **kwargs)


def column(engine: Engine, name: str, message_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        value = conn.execute(select(message.c[name]).where(message.c.id == message_id)).scalar()
    return utc(value)


def seq_of(engine: Engine, message_id: uuid.UUID) -> int:
    return int(column(engine, "seq", message_id))


def utc(value: Any) -> Any:
    # SQLite hands times back without a zone; they are UTC.
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def test_a_lease_runs_out_by_the_frozen_clock(
    app_engine: Engine, frozen: SqlStore, clock: Clock
) -> None:
    message_id = enqueue(app_engine)
    assert len(frozen.claim(owner="relay-a", token=uuid.uuid4(), limit=10, lease_seconds=30)) == 1
    assert column(app_engine, "lease_expires_at", message_id) == at(30)

    clock.now = at(29.5)
    assert frozen.reclaim_expired(relay_id="relay-b") == 0
    clock.now = at(30.5)
    assert frozen.reclaim_expired(relay_id="relay-b") == 1

    assert column(app_engine, "state", message_id) == "pending"
    assert column(app_engine, "last_failed_at", message_id) == at(30.5)
    with app_engine.connect() as conn:
        record = conn.execute(
            select(attempt.c.at, attempt.c.next_attempt_at, attempt.c.outcome)
        ).one()
    assert (utc(record.at), utc(record.next_attempt_at), record.outcome) == (
        at(30.5),
        at(30.5),
        "deferred",  # not claimed alone: the lost attempt is charged to no one
    )


def test_an_extended_lease_runs_out_later(
    app_engine: Engine, frozen: SqlStore, clock: Clock
) -> None:
    message_id = enqueue(app_engine)
    token = uuid.uuid4()
    frozen.claim(owner="relay-a", token=token, limit=10, lease_seconds=30)
    clock.now = at(20)
    assert frozen.extend_leases([token], 30) == 1
    assert column(app_engine, "lease_expires_at", message_id) == at(50)
    clock.now = at(40)
    assert frozen.reclaim_expired(relay_id="relay-b") == 0
    assert frozen.mark_published(token, [seq_of(app_engine, message_id)]) == 1
    assert column(app_engine, "published_at", message_id) == at(40)


def test_released_and_retried_rows_are_due_by_the_frozen_clock(
    app_engine: Engine, frozen: SqlStore, clock: Clock
) -> None:
    released, retried = enqueue(app_engine), enqueue(app_engine)
    token = uuid.uuid4()
    rows = {c.id: c.seq for c in frozen.claim(owner="r", token=token, limit=10, lease_seconds=30)}
    assert frozen.release(token, [rows[str(released)]], delay_seconds=60, error="stopping") == 1
    failure = Classified(FailureClass.NEVER_SENT, "no channel")
    retry = Retry(rows[str(retried)], at(90), burn=True, failure=failure)
    assert frozen.settle_failures(token, [retry], relay_id="r") == 1
    assert column(app_engine, "available_at", released) == at(60)
    assert column(app_engine, "available_at", retried) == at(90)
    assert column(app_engine, "last_failed_at", retried) == at(0)

    counts = frozen.counts()
    assert (counts.ready, counts.delayed, counts.oldest_ready_age_s) == (0, 2, None)
    assert not frozen.has_ready("ex")
    assert frozen.claim(owner="r", token=uuid.uuid4(), limit=10, lease_seconds=30) == []

    clock.now = at(75)
    counts = frozen.counts()
    assert (counts.ready, counts.delayed) == (1, 1)
    assert counts.oldest_ready_age_s == pytest.approx(15, abs=0.01)
    assert frozen.has_ready("ex")
    (again,) = frozen.claim(owner="r", token=uuid.uuid4(), limit=10, lease_seconds=30)
    assert again.id == str(released)

    clock.now = at(90)
    (last,) = frozen.claim(owner="r", token=uuid.uuid4(), limit=10, lease_seconds=30)
    assert last.id == str(retried)


def test_heartbeats_and_resource_changes_use_the_frozen_clock(
    frozen: SqlStore, clock: Clock
) -> None:
    frozen.heartbeat("relay-a")
    clock.now = at(5)
    frozen.heartbeat("relay-b")
    assert frozen.relays(10) == [("relay-a", at(0), at(0)), ("relay-b", at(5), at(5))]
    clock.now = at(12)
    assert [r[0] for r in frozen.relays(10)] == ["relay-b"]

    seen: list[dt.datetime] = []

    def change(row: ResourceRow, now: dt.datetime) -> tuple[ResourceRow, None]:
        seen.append(now)
        circuit = Circuit(row.circuit.resource, changed_at=now)
        return ResourceRow(circuit, row.bucket), None

    frozen.change_resource("broker/ex", change)
    assert seen == [at(12)]
    (row,) = frozen.resources()
    assert row.circuit.changed_at == at(12)


def test_without_a_clock_the_database_time_is_used(app_engine: Engine, store: SqlStore) -> None:
    message_id = enqueue(app_engine)
    before = dt.datetime.now(dt.UTC)
    store.claim(owner="r", token=uuid.uuid4(), limit=10, lease_seconds=30)
    after = dt.datetime.now(dt.UTC)
    expires = column(app_engine, "lease_expires_at", message_id)
    # SQLite's clock has milliseconds.
    slack = dt.timedelta(milliseconds=1)
    assert before - slack + dt.timedelta(seconds=30) <= expires <= after + dt.timedelta(seconds=30)
