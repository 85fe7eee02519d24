"""The relay's store on real databases: claim order, and leases that guard every settlement."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

import outbox
from outbox.schema import attempt, message
from relay.core.failures import Classified, FailureClass
from relay.core.policy import Dead
from relay.store.sql_store import SqlStore
from tests.support.broker import Broker
from tests.support.db import states
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def enqueue_many(engine: Engine, count: int, **kwargs: Any) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [
            outbox.enqueue(conn, exchange="ex", routing_key="rk", payload=[n], **kwargs)
            for n in range(count)
        ]


def expire_leases(engine: Engine) -> None:
    """Make every lease look as if it ran out a minute ago (its relay died)."""
    past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    with engine.begin() as conn:
        conn.execute(
            update(message).where(message.c.state == "in_flight").values(lease_expires_at=past)
        )


def test_claim_takes_priority_then_due_time_then_enqueue_order(
    app_engine: Engine, store: SqlStore
) -> None:
    with app_engine.begin() as conn:

        def put(name: str, **kwargs: Any) -> uuid.UUID:
            return outbox.enqueue(conn, exchange="ex", routing_key=name, payload=name, **kwargs)

        put("low", priority=-5)
        put("first")
        put("second")
        overdue = put("overdue")
        put("urgent", priority=100)
        put("later", delay=3600)
        put("high", priority=7)
    # Due longer ago than the others: ahead of them at the same priority.
    with app_engine.begin() as conn:
        conn.execute(
            update(message)
            .where(message.c.id == overdue)
            .values(available_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
        )

    token = uuid.uuid4()
    top = store.claim(owner="test", token=token, limit=2, lease_seconds=30)
    rest = store.claim(owner="test", token=token, limit=100, lease_seconds=30)
    assert [c.routing_key for c in top] == ["urgent", "high"]
    assert [c.routing_key for c in rest] == ["overdue", "first", "second", "low"]
    assert all(c.attempts == 1 for c in top + rest)
    # The delayed row is not due: nothing left to claim.
    assert store.claim(owner="test", token=token, limit=100, lease_seconds=30) == []
    assert states(app_engine) == {"in_flight": 6, "pending": 1}


def test_a_lease_taken_over_cannot_be_settled_by_its_former_holder(
    app_engine: Engine, store: SqlStore
) -> None:
    enqueue_many(app_engine, 3)
    token_a, token_b = uuid.uuid4(), uuid.uuid4()
    first = store.claim(owner="relay-a", token=token_a, limit=10, lease_seconds=60)
    seqs = [c.seq for c in first]
    assert len(seqs) == 3
    # Still leased: nothing to reclaim, nobody else can claim.
    assert store.reclaim_expired(relay_id="relay-b") == 0
    assert store.claim(owner="relay-b", token=token_b, limit=10, lease_seconds=60) == []

    expire_leases(app_engine)
    assert store.reclaim_expired(relay_id="relay-b") == 3
    # Suspects now (relay A may have died of one of them): claimed one at a time, and the
    # attempt that ended with the lease is charged to none of them.
    second = [
        c
        for _ in seqs
        for c in store.claim(owner="relay-b", token=token_b, limit=10, lease_seconds=60)
    ]
    assert sorted(c.seq for c in second) == sorted(seqs)
    assert all(c.suspect and c.attempts == 1 for c in second)

    # Relay A comes back with its old token: every write is refused.
    assert store.mark_published(token_a, seqs) == 0
    assert store.release(token_a, seqs, delay_seconds=0, error="late") == 0
    assert store.extend_leases([token_a], 60) == 0
    failure = Classified(FailureClass.REJECTED, "late nack")
    dead = [Dead(seq, failure, "late") for seq in seqs]
    assert store.settle_failures(token_a, dead, relay_id="relay-a") == 0
    assert states(app_engine) == {"in_flight": 3}

    # The current holder's writes go through.
    assert store.extend_leases([token_b], 60) == 3
    assert store.mark_published(token_b, seqs) == 3
    assert states(app_engine) == {"published": 3}
    # ...once: a duplicate confirmation changes nothing.
    assert store.mark_published(token_b, seqs) == 0


def test_reclaiming_an_expired_lease_is_recorded(app_engine: Engine, store: SqlStore) -> None:
    (message_id,) = enqueue_many(app_engine, 1)
    store.claim(owner="relay-that-died", token=uuid.uuid4(), limit=10, lease_seconds=60)
    expire_leases(app_engine)
    assert store.reclaim_expired(relay_id="relay-b") == 1
    with app_engine.connect() as conn:
        row = conn.execute(
            select(message.c.state, message.c.last_error, message.c.lease_token).where(
                message.c.id == message_id
            )
        ).one()
        history = conn.execute(
            select(attempt.c.failure_class, attempt.c.attempt).where(
                attempt.c.message_id == message_id
            )
        ).all()
    assert row.state == "pending"
    assert row.lease_token is None
    assert "relay-that-died" in row.last_error
    assert [tuple(h) for h in history] == [("ambiguous", 1)]


def test_a_running_relay_takes_over_an_expired_lease_and_delivers(
    app_engine: Engine,
    store: SqlStore,
    broker: Broker,
    relay_factory: RelayFactory,
    db_url: str,
) -> None:
    lease = 1.0
    with app_engine.begin() as conn:
        orphan = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="orphan", payload="orphan"
        )
    # A relay claims the row and dies before publishing or settling it.
    claimed_at = time.monotonic()
    claimed = store.claim(owner="dead-relay", token=uuid.uuid4(), limit=10, lease_seconds=lease)
    assert [c.id for c in claimed] == [str(orphan)]

    relay = relay_factory(db_url, reclaim_interval=0.1)
    (delivery,) = broker.collect_ids([orphan], timeout=10)
    # Not before the dead relay's lease ran out.
    assert delivery.received_at - claimed_at >= lease
    # The confirm and the UPDATE trail the delivery a little.
    wait_until(lambda: states(app_engine) == {"published": 1}, timeout=5, what="row published")
    with app_engine.connect() as conn:
        attempts = conn.execute(select(message.c.attempts).where(message.c.id == orphan)).scalar()
    assert attempts == 1  # the dead relay's attempt is not charged: it was not claimed alone
    assert relay.summary.reclaimed == 1


def test_database_errors_are_told_apart_by_sqlstate(pg_url: str, pg_engine: Engine) -> None:
    from sqlalchemy.exc import DBAPIError

    from relay.errors import DatabaseUnavailable
    from relay.store.sql_store import open_store

    store = open_store(pg_url)
    try:
        # 57014 query_canceled (a statement timeout): transient, the loop waits and retries.
        unavailable = pytest.raises(DatabaseUnavailable, match="canceling statement")
        with unavailable, store._conn() as c:
            c.exec_driver_sql("SET statement_timeout = 1")
            c.exec_driver_sql("SELECT pg_sleep(1)")
        # 22012 division_by_zero: retrying cannot help, so it is not disguised as an outage.
        with pytest.raises(DBAPIError) as raised, store._conn() as c:
            c.exec_driver_sql("SELECT 1/0")
        assert not isinstance(raised.value, DatabaseUnavailable)
        assert getattr(raised.value.orig, "sqlstate", None) == "22012"
    finally:
        store.close()


def test_a_message_whose_relays_keep_dying_is_dead_lettered_after_max_attempts(
    app_engine: Engine, store: SqlStore
) -> None:
    """A message that kills every relay claiming it must not come round for ever. The first
    two leases that run out charge nothing (its relay held it beside others, then beside other
    suspects, for all the store knows); from then on it is claimed alone, and each lease it loses
    is charged."""
    from sqlalchemy.orm import Session

    with Session(app_engine) as session, session.begin():
        poison = outbox.enqueue(session, exchange="e", routing_key="r", payload={}, max_attempts=2)
    claims = []
    for n in (1, 2, 3, 4):
        claimed = store.claim(
            owner=f"doomed-{n}", token=uuid.uuid4(), limit=10, lease_seconds=30, suspect_group=5
        )
        assert [c.id for c in claimed] == [str(poison)]
        claims.append((claimed[0].suspect, claimed[0].attempts))
        with app_engine.begin() as conn:  # the relay died holding it: its lease runs out
            conn.execute(
                update(message).values(lease_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
            )
        assert store.reclaim_expired(relay_id="sweeper", max_attempts=10) == 1
    with app_engine.connect() as conn:
        state, error = conn.execute(select(message.c.state, message.c.last_error)).one()
        outcomes = conn.execute(select(attempt.c.outcome).order_by(attempt.c.id)).scalars().all()
    assert claims == [(False, 1), (True, 1), (True, 1), (True, 2)]
    assert state == "dead"
    assert "doomed-4" in error
    assert outcomes == ["deferred", "deferred", "retry", "dead"]
