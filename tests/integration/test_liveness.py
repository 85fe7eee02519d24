"""Relays whose heartbeat stopped: their leases are taken back at once, not when they run out, on
every database; suspects come back in groups, then alone; a relay taken for dead carries on.

Every lease in these tests is long (minutes): whatever is taken back within a test's time was
taken back because its relay's heartbeat stopped, not because its lease ran out."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

import outbox
from outbox.schema import attempt, message, relay_instance
from relay.store.sql_store import SqlStore
from tests.integration.test_leases import enqueue_many, expire_leases
from tests.support.broker import Broker
from tests.support.db import states
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LONG = 600.0  # seconds: a lease that never runs out during a test


def make_stale(engine: Engine, relay_id: str) -> None:
    """As if `relay_id` had not beaten for a minute."""
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    with engine.begin() as conn:
        conn.execute(
            update(relay_instance)
            .where(relay_instance.c.relay_id == relay_id)
            .values(last_seen=long_ago)
        )


def claim(store: SqlStore, owner: str, limit: int, **kwargs: Any) -> tuple[uuid.UUID, list[int]]:
    token = uuid.uuid4()
    rows = store.claim(owner=owner, token=token, limit=limit, lease_seconds=LONG, **kwargs)
    return token, [r.seq for r in rows]


def test_a_dead_relays_leases_are_taken_back_and_only_its(
    app_engine: Engine, store: SqlStore
) -> None:
    enqueue_many(app_engine, 6)
    dead_run = store.register_relay("dead")
    alive_run = store.register_relay("alive")
    dead_token, dead_rows = claim(store, "dead", 3)
    claim(store, "alive", 2)
    claim(store, "never-registered", 1)  # no heartbeat to judge it by: its lease decides
    assert store.reclaim_dead(relay_id="alive", dead_after=3.0) == ([], 0)  # all beating

    make_stale(app_engine, "dead")
    make_stale(app_engine, "alive")  # stale too, but it is the one asking
    assert store.reclaim_dead(relay_id="alive", dead_after=3.0) == (["dead"], 3)
    assert states(app_engine) == {"pending": 3, "in_flight": 3}
    assert store.reclaim_dead(relay_id="alive", dead_after=3.0) == ([], 0)

    # The dead relay, had it only been slow, finds out at its next beat, and changes nothing.
    assert not store.beat("dead", dead_run)
    assert store.beat("alive", alive_run)
    assert store.mark_published(dead_token, dead_rows) == 0
    # Its rows are suspects, charged nothing, with the reason recorded.
    again = store.claim(
        owner="alive", token=uuid.uuid4(), limit=10, lease_seconds=LONG, suspect_group=10
    )
    assert sorted(r.seq for r in again) == sorted(dead_rows)
    assert all(r.suspect and r.attempts == 1 for r in again)
    with app_engine.connect() as conn:
        records = conn.execute(select(attempt.c.failure_class, attempt.c.error)).all()
    assert len(records) == 3
    assert all(c == "ambiguous" and "dead stopped beating" in str(e) for c, e in records)


def test_a_new_run_under_the_same_id_takes_back_what_the_last_one_left(
    app_engine: Engine, store: SqlStore
) -> None:
    enqueue_many(app_engine, 3)
    first = store.register_relay("pod-1:1")
    claim(store, "pod-1:1", 2)
    # The process is killed and restarted in place: same host name, same pid, same relay id.
    assert store.reclaim_owner("pod-1:1") == 2
    second = store.register_relay("pod-1:1")
    assert second != first
    assert not store.beat("pod-1:1", first)  # the earlier run's row names this run now
    assert store.beat("pod-1:1", second)
    assert states(app_engine) == {"pending": 3}


def test_suspects_go_out_in_groups_then_alone_and_only_alone_are_charged(
    app_engine: Engine, store: SqlStore
) -> None:
    enqueue_many(app_engine, 5)
    claim(store, "first", 10)
    expire_leases(app_engine)
    assert store.reclaim_expired(relay_id="sweeper") == 5
    enqueue_many(app_engine, 2)  # ordinary rows behind the suspects

    # At most `suspect_group` suspects at once, nothing else beside them, nobody charged.
    token, group = claim(store, "second", 10, suspect_group=3)
    assert len(group) == 3
    rest = store.claim(
        owner="second", token=uuid.uuid4(), limit=10, lease_seconds=LONG, suspect_group=3
    )
    assert [r.suspect for r in rest] == [True, True]  # the other two suspects, apart too
    # The relay dies holding the group: each of its rows is now claimed alone.
    with app_engine.begin() as conn:
        conn.execute(
            update(message)
            .where(message.c.lease_token == token)
            .values(lease_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        )
    assert store.reclaim_expired(relay_id="sweeper") == 3
    alone = [claim(store, "third", 10, suspect_group=3) for _ in range(3)]
    assert sorted(seq for _, seqs in alone for seq in seqs) == sorted(group)
    assert all(len(seqs) == 1 for _, seqs in alone)
    with app_engine.connect() as conn:
        attempts = dict(conn.execute(select(message.c.seq, message.c.attempts)).all())
    assert all(attempts[seq] == 1 for seq in group)  # this claim's attempt only

    # Given back cleanly (a stop), a row claimed alone stays solitary; and one lost alone is
    # charged.
    (token, [seq]) = alone[0]
    assert store.release(token, [seq], delay_seconds=0, error="stopping") == 1
    assert claim(store, "fourth", 10, suspect_group=3)[1] == [seq]
    expire_leases(app_engine)
    assert store.reclaim_expired(relay_id="sweeper") == 5  # 3 alone, 2 in the last group
    with app_engine.connect() as conn:
        charged = dict(conn.execute(select(message.c.seq, message.c.attempts)).all())
    assert [charged[s] for s in sorted(group)] == [1, 1, 1]


def test_a_running_relay_takes_over_a_dead_relays_rows_without_waiting_for_the_lease(
    app_engine: Engine,
    store: SqlStore,
    broker: Broker,
    relay_factory: RelayFactory,
    db_url: str,
) -> None:
    with app_engine.begin() as conn:
        ids = [
            outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload=[n])
            for n in range(5)
        ]
    store.register_relay("ghost")
    claim(store, "ghost", 10)  # and dies holding them, for minutes of lease
    make_stale(app_engine, "ghost")

    relay_factory(db_url)
    broker.collect_ids(ids, timeout=20)
    wait_until(lambda: states(app_engine) == {"published": 5}, timeout=10, what="all published")
    with app_engine.connect() as conn:
        errors = conn.execute(select(attempt.c.error)).scalars().all()
    assert len(errors) == 5
    assert all("ghost stopped beating" in str(e) for e in errors)


def test_a_relay_taken_for_dead_gives_back_what_it_holds_and_goes_on(
    app_engine: Engine,
    broker: Broker,
    relay_factory: RelayFactory,
    db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = relay_factory(db_url)
    relay_id = relay.config.relay_id

    def started_at() -> dt.datetime | None:
        with app_engine.connect() as conn:
            return conn.execute(
                select(relay_instance.c.started_at).where(relay_instance.c.relay_id == relay_id)
            ).scalar_one_or_none()

    first = wait_until(started_at, what="the relay's heartbeat row")
    with app_engine.begin() as conn:  # what another relay does to a relay it finds dead
        conn.execute(relay_instance.delete().where(relay_instance.c.relay_id == relay_id))
    wait_until(lambda: (started_at() or first) != first, what="a new run registered")
    assert "relay.declared_dead" in caplog.text
    with app_engine.begin() as conn:
        ids = [
            outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload=[n])
            for n in range(3)
        ]
    broker.collect_ids(ids, timeout=15)  # it carries on (teardown checks run() returned)
