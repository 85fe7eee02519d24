"""A crash cannot spread: a message that kills every relay that claims it dead-letters itself
only. Real relay processes die (os._exit) each time they are about to publish the poison row;
the rows claimed beside it are published, the poison alone ends dead. Suspects come back in a
group first, then alone (relay/core/suspects.py)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from sqlalchemy import Engine, select

import outbox
from outbox.schema import message
from tests.faults.crash_on_row import CRASHED, POISON
from tests.support.broker import Broker
from tests.support.db import states

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _run_poisoned_relay(db_url: str, amqp_url: str) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.crash_on_row", db_url, amqp_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, CRASHED), done.stderr
    return done.returncode


def test_a_message_that_kills_every_relay_dead_letters_itself_only(
    db_url: str, app_engine: Engine, broker: Broker, amqp_url: str
) -> None:
    with app_engine.begin() as conn:
        ids = [
            outbox.enqueue(
                conn,
                exchange=broker.exchange,
                routing_key=POISON if n == 5 else f"innocent.{n}",
                payload={"n": n},
            )
            for n in range(12)
        ]
    poison = ids[5]
    innocents = [i for i in ids if i != poison]

    crashes = 0
    for _ in range(8):  # each run dies on the poison, or relays for a few seconds and stops
        if _run_poisoned_relay(db_url, amqp_url) == CRASHED:
            crashes += 1
        if states(app_engine) == {"published": 11, "dead": 1}:
            break
    # Once in a batch of 12, once in the group of suspects, then three times alone
    # (--max-attempts 3): then it is dead.
    assert crashes == 5
    assert states(app_engine) == {"published": 11, "dead": 1}
    with app_engine.connect() as conn:
        state, attempts, error = conn.execute(
            select(message.c.state, message.c.attempts, message.c.last_error).where(
                message.c.id == poison
            )
        ).one()
    assert (state, attempts) == ("dead", 3)
    # Taken back when its lease (1 s) ran out, or when its relay's heartbeat stopped (3 s).
    assert "expired before it settled" in error or "stopped beating" in error
    broker.collect_ids(innocents)
    assert {d.message_id for d in broker.received} == {str(i) for i in innocents}


def test_rows_reclaimed_beside_a_crash_are_charged_nothing_and_claimed_apart(
    app_engine: Engine, db_url: str
) -> None:
    from relay.store.sql_store import open_store
    from tests.integration.test_leases import enqueue_many, expire_leases

    store = open_store(db_url)
    try:
        enqueue_many(app_engine, 3, max_attempts=1)
        assert len(store.claim(owner="doomed", token=uuid.uuid4(), limit=10, lease_seconds=60)) == 3
        expire_leases(app_engine)
        assert store.reclaim_expired(relay_id="sweeper", max_attempts=1) == 3
        # Even with one attempt allowed, none is dead: which of them killed the relay is unknown.
        assert states(app_engine) == {"pending": 3}
        group = store.claim(
            owner="next", token=uuid.uuid4(), limit=10, lease_seconds=60, suspect_group=2
        )
        assert [(c.suspect, c.attempts) for c in group] == [(True, 1), (True, 1)]
        # Lost again in a group of suspects: still nobody is charged, both go alone now.
        expire_leases(app_engine)
        assert store.reclaim_expired(relay_id="sweeper", max_attempts=1) == 2
        assert states(app_engine) == {"pending": 3}
        alone = store.claim(
            owner="last", token=uuid.uuid4(), limit=10, lease_seconds=60, suspect_group=2
        )
        assert [(c.suspect, c.attempts) for c in alone] == [(True, 1)]
        # Claimed alone and lost again: that one is charged, and has no attempt left.
        expire_leases(app_engine)
        assert store.reclaim_expired(relay_id="sweeper", max_attempts=1) == 1
        assert states(app_engine) == {"pending": 2, "dead": 1}
    finally:
        store.close()
