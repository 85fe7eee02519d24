"""Runs: a claim takes, behind each keyed head, the next messages of its key under the same lease,
on every database. A run is the prefix of the key's line that would become heads one after
another: it stops at the first message that is not due, is a suspect, goes to an excluded
resource, or is not pending; and it never changes what else the claim takes."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

import outbox
from outbox.schema import message
from relay.core.failures import Classified, FailureClass
from relay.core.policy import Dead
from relay.store.sql_store import SqlStore, open_store
from tests.support.db import states

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LONG = 600.0  # seconds: no lease runs out during a test


def enqueue_key(engine: Engine, key: str | None, count: int, **kwargs: Any) -> list[int]:
    """`count` messages of `key`, in order; their seqs."""
    with engine.begin() as conn:
        for n in range(count):
            outbox.enqueue(conn, exchange="ex", routing_key="rk", payload=[n], key=key, **kwargs)
    return seqs_of(engine, key)


def seqs_of(engine: Engine, key: str | None) -> list[int]:
    where = message.c.key.is_(None) if key is None else message.c.key == key
    with engine.connect() as conn:
        query = select(message.c.seq).where(where).order_by(message.c.seq)
        return list(conn.execute(query).scalars())


def parked(engine: Engine, seqs: list[int]) -> list[int]:
    """Those of `seqs` that are parked (held), in order."""
    with engine.connect() as conn:
        query = select(message.c.seq, message.c.held).where(message.c.seq.in_(seqs))
        return sorted(seq for seq, held in conn.execute(query) if held)


def claim(store: SqlStore, limit: int, **kwargs: Any) -> tuple[uuid.UUID, list[int]]:
    token = uuid.uuid4()
    rows = store.claim(owner="r", token=token, limit=limit, lease_seconds=LONG, **kwargs)
    return token, sorted(r.seq for r in rows)


def test_a_hot_keys_next_messages_come_with_its_head(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 10)
    _, got = claim(store, 9, run=64)
    assert got == hot  # the head and its nine followers, though the limit is 9
    assert states(app_engine) == {"in_flight": 10}


def test_without_run_only_heads_are_claimed(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 5)
    _, got = claim(store, 10)
    assert got == hot[:1]


def test_a_run_is_at_most_run_long(app_engine: Engine, store: SqlStore) -> None:
    hot = enqueue_key(app_engine, "hot", 10)
    _, got = claim(store, 10, run=3)
    assert got == hot[:4]
    _, more = claim(store, 10, run=3)
    assert more == []  # the rest wait behind the run in flight


def test_runs_add_at_most_limit_rows_in_all(app_engine: Engine, store: SqlStore) -> None:
    with app_engine.begin() as conn:  # interleaved, so both heads are among the first looked at
        for n in range(10):
            for key in ("a", "b"):
                outbox.enqueue(conn, exchange="ex", routing_key="rk", payload=[n], key=key)
    a, b = seqs_of(app_engine, "a"), seqs_of(app_engine, "b")
    _, got = claim(store, 4, run=64)
    # Two heads, then four followers at most: the best head's run first, each a prefix.
    assert got == sorted(a[:5] + b[:1])


def test_a_run_stops_at_a_message_not_due(app_engine: Engine, store: SqlStore) -> None:
    early = enqueue_key(app_engine, "k", 3)
    enqueue_key(app_engine, "k", 1, delay=3600)
    enqueue_key(app_engine, "k", 2)
    _, got = claim(store, 10, run=64)
    assert got == early


def test_a_run_stops_at_a_suspect(app_engine: Engine, store: SqlStore) -> None:
    seqs = enqueue_key(app_engine, "k", 5)
    with app_engine.begin() as conn:  # as if a relay had died holding the third one
        conn.execute(
            update(message)
            .where(message.c.seq == seqs[2])
            .values(
                lease_expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1),
                suspect="group",
            )
        )
    _, got = claim(store, 10, run=64)
    assert got == seqs[:2]


def test_a_run_stops_at_an_excluded_resource(app_engine: Engine, store: SqlStore) -> None:
    with app_engine.begin() as conn:
        for exchange in ("ex", "ex", "closed", "ex"):
            outbox.enqueue(conn, exchange=exchange, routing_key="rk", payload={}, key="k")
    seqs = seqs_of(app_engine, "k")
    _, got = claim(store, 10, run=64, exclude=["closed"])
    assert got == seqs[:2]


def test_a_suspect_head_leads_no_run(app_engine: Engine, store: SqlStore) -> None:
    seqs = enqueue_key(app_engine, "k", 4)
    with app_engine.begin() as conn:
        conn.execute(  # as if a relay had died holding the head
            update(message)
            .where(message.c.seq == seqs[0])
            .values(
                lease_expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1),
                suspect="group",
            )
        )
    _, got = claim(store, 10, run=64, suspect_group=10)
    assert got == seqs[:1]


def test_unkeyed_rows_and_other_keys_are_claimed_as_before(
    app_engine: Engine, store: SqlStore
) -> None:
    loose = enqueue_key(app_engine, None, 3)
    hot = enqueue_key(app_engine, "hot", 6)
    cold = enqueue_key(app_engine, "cold", 1)
    _, got = claim(store, 5, run=64)
    assert got == sorted(loose + hot + cold)


def test_a_run_given_back_in_part_keeps_its_keys_order(app_engine: Engine, store: SqlStore) -> None:
    seqs = enqueue_key(app_engine, "k", 6)
    token, got = claim(store, 10, run=64)
    assert got == seqs
    assert store.mark_published(token, seqs[:2]) == 2
    # The third failed: the rest of the run is given back behind it.
    assert store.release(token, seqs[2:], delay_seconds=0.0, error="held back") == 4
    store.unpark_sweep()
    _, again = claim(store, 10, run=64)
    assert again == seqs[2:]  # the next head, and its run, in order
    assert states(app_engine) == {"published": 2, "in_flight": 4}


def test_a_run_respects_a_dead_head_that_holds_its_key(app_engine: Engine, store: SqlStore) -> None:
    seqs = enqueue_key(app_engine, "k", 3)
    with app_engine.begin() as conn:
        conn.execute(update(message).where(message.c.seq == seqs[0]).values(state="dead"))
    _, got = claim(store, 10, run=64)
    assert got == []  # dead_key="hold": the dead head holds the rest


def test_two_claims_never_share_a_keys_messages(app_engine: Engine, store: SqlStore) -> None:
    seqs = enqueue_key(app_engine, "k", 8)
    _, first = claim(store, 2, run=2)
    _, second = claim(store, 10, run=64)
    assert first == seqs[:3]
    assert second == []


def claim_a_run_and_park_the_rest(
    store: SqlStore, app_engine: Engine
) -> tuple[uuid.UUID, list[int]]:
    """Ten messages of one key: the head and a run of three in flight, the other six parked by a
    second claim. The lease, and the key's seqs."""
    seqs = enqueue_key(app_engine, "k", 10)
    token, got = claim(store, 10, run=3)
    assert got == seqs[:4]
    assert claim(store, 10, run=3)[1] == []
    assert parked(app_engine, seqs) == seqs[4:]
    return token, seqs


def test_marking_a_runs_first_pieces_unparks_nothing(app_engine: Engine, store: SqlStore) -> None:
    token, seqs = claim_a_run_and_park_the_rest(store, app_engine)
    # The key's next message in a blocking state is the run's third, in flight: the fifth stays
    # parked, and no claim has to park it again.
    assert store.mark_published(token, seqs[:2]) == 2
    assert parked(app_engine, seqs) == seqs[4:]
    assert claim(store, 10, run=3)[1] == []
    # The run's last piece: the fifth is the key's next message, and a head.
    assert store.mark_published(token, seqs[2:4]) == 2
    assert parked(app_engine, seqs) == seqs[5:]
    _, again = claim(store, 10, run=3)
    assert again == seqs[4:8]  # the fifth as head, with its run
    assert states(app_engine) == {"published": 4, "in_flight": 4, "pending": 2}


def test_a_message_after_the_rows_marked_stays_parked_behind_an_earlier_one(
    app_engine: Engine, store: SqlStore
) -> None:
    token, seqs = claim_a_run_and_park_the_rest(store, app_engine)
    # The run's last two confirmed first: the fifth comes next, but the first two still block it.
    assert store.mark_published(token, seqs[2:4]) == 2
    assert parked(app_engine, seqs) == seqs[4:]
    assert store.mark_published(token, seqs[:2]) == 2
    # The next blocking message after the second is the fifth (the third and fourth are
    # published): a head now.
    assert parked(app_engine, seqs) == seqs[5:]
    assert claim(store, 10, run=3)[1] == seqs[4:8]


@pytest.mark.parametrize("hold", [True, False], ids=["hold", "skip"])
def test_a_dead_message_of_a_run_holds_the_next_one_parked_only_with_hold(
    db_url: str, app_engine: Engine, store: SqlStore, hold: bool
) -> None:
    opened = open_store(db_url, hold_dead_keys=hold)
    try:
        token, seqs = claim_a_run_and_park_the_rest(opened, app_engine)
        failure = Classified(FailureClass.REJECTED, "rejected")
        assert opened.settle_failures(token, [Dead(seqs[1], failure, "no")], relay_id="r") == 1
        assert opened.mark_published(token, seqs[:1]) == 1
        assert parked(app_engine, seqs) == seqs[4:]  # the second is dead, the third in flight
        assert opened.mark_published(token, seqs[2:4]) == 2
        # Behind the dead second (dead_key="hold") the fifth stays parked, and nothing is claimed;
        # with "skip" it is the key's head.
        assert parked(app_engine, seqs) == (seqs[4:] if hold else seqs[5:])
        assert claim(opened, 10, run=3)[1] == ([] if hold else seqs[4:8])
    finally:
        opened.close()
