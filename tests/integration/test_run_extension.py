"""The next run of a chain (Store.claim_run), on every database: a relay sending a hot key's run
takes the key's next messages under the same lease before the run is done, only while every
earlier unfinished message of the key is its own, in flight, and as a claim's run would take them
(the prefix that is pending, due, not a suspect, not excluded)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import Engine, update

import outbox
from outbox.schema import message
from relay.store.sql_store import SqlStore
from tests.integration.test_runs import LONG, claim, enqueue_key, seqs_of
from tests.support.db import states

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def claim_run(
    store: SqlStore, token: uuid.UUID, after: int, limit: int, exclude: tuple[str, ...] = ()
) -> list[int]:
    rows = store.claim_run(
        owner="r", token=token, after=after, limit=limit, lease_seconds=LONG, exclude=exclude
    )
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)  # in key order
    assert all(r.key == rows[0].key and not r.suspect for r in rows)
    return [r.seq for r in rows]


def test_a_chains_next_run_comes_under_its_own_lease(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 12)
    token, got = claim(store, 10, run=3)
    assert got == hot[:4]
    assert claim_run(store, token, after=hot[3], limit=5) == hot[4:9]
    assert claim_run(store, token, after=hot[8], limit=5) == hot[9:]
    assert claim_run(store, token, after=hot[11], limit=5) == []  # nothing more
    assert states(app_engine) == {"in_flight": 12}
    assert store.mark_published(token, hot) == 12  # one lease holds them all


def test_it_goes_on_once_the_chain_so_far_is_published(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 6)
    token, got = claim(store, 10, run=2)
    assert store.mark_published(token, got) == 3
    assert claim_run(store, token, after=hot[2], limit=10) == hot[3:]


def test_not_behind_another_leases_message(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 6)
    claim(store, 10, run=2)
    assert claim_run(store, uuid.uuid4(), after=hot[2], limit=10) == []


def test_not_behind_a_message_given_back(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 6)
    token, got = claim(store, 10, run=2)
    store.release(token, got[1:], delay_seconds=0.0, error="held back")
    assert claim_run(store, token, after=hot[2], limit=10) == []  # hot[1] waits, pending


def test_not_behind_a_dead_message_that_holds_its_key(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 4)
    token, _ = claim(store, 10, run=1)
    with app_engine.begin() as conn:  # the head died; dead_key="hold" (the default) holds
        conn.execute(update(message).where(message.c.seq == hot[0]).values(state="dead"))
    assert claim_run(store, token, after=hot[1], limit=10) == []


def test_the_run_stops_where_a_claims_run_would(app_engine: Engine, store: SqlStore) -> None:
    with app_engine.begin() as conn:
        for exchange in ("ex", "ex", "ex", "closed", "ex"):
            outbox.enqueue(conn, exchange=exchange, routing_key="rk", payload={}, key="k")
    seqs = seqs_of(app_engine, "k")
    token, got = claim(store, 10, run=1)
    assert got == seqs[:2]
    assert claim_run(store, token, after=seqs[1], limit=10, exclude=("closed",)) == seqs[2:3]

    later = enqueue_key(app_engine, "late", 5)
    with app_engine.begin() as conn:  # a suspect and a message not due
        expired = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        conn.execute(
            update(message)
            .where(message.c.seq == later[3])
            .values(lease_expires_at=expired, suspect="group")
        )
    token, got = claim(store, 10, run=1)
    assert got == later[:2]
    assert claim_run(store, token, after=later[1], limit=10) == later[2:3]


def test_a_message_enqueued_during_the_chain_joins_it(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 3)
    token, got = claim(store, 10, run=5)
    assert got == hot
    more = enqueue_key(app_engine, "hot", 2)[3:]
    assert claim_run(store, token, after=hot[-1], limit=10) == more


def test_an_unkeyed_row_has_no_run(app_engine: Engine, store: SqlStore) -> None:
    plain = enqueue_key(app_engine, None, 3)
    token, got = claim(store, 1)
    assert claim_run(store, token, after=got[0], limit=10) == []
    assert states(app_engine) == {"in_flight": 1, "pending": 2}
    assert plain[0] == got[0]
